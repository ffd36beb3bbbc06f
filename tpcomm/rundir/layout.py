"""The run directory: every command writes into one, the next command reads it.

Every file, its schema (columns and kinds, or required keys), its units and
the command that writes it are named once, in `tpcomm/rundir/contract.py`; `RunDir`
reads and writes through those specs and checks them both ways (a writer that
drifts fails at once, a reader gets one line naming file, field and command).
An absent file means "not measured", never zero. JSON documents carry
`schema_version`, Parquet tables carry it in their metadata.

Tables are Parquet, small documents JSON. Writes are atomic (temp file +
rename) so an interrupted run never leaves a truncated file behind, and every
document and text column is scrubbed of secrets on the way out (redact.py).
A run directory is meant to be shared, so files go through safefs.py: never
written through a link (refused, one line), created as readable as the
operator's umask allows, and read only when they are regular files within a
size bound (a FIFO, a device or a 2 GB file is a one-line SchemaError, at
once).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpcomm import jsonsafe, redact
from tpcomm.errors import InputError
from tpcomm.rundir import contract, safefs
from tpcomm.rundir.contract import FileSpec, SchemaError

if TYPE_CHECKING:
    import pandas as pd


# The states a stage ends in; "running" is the only other.
FINISHED = ("complete", "incomplete", "failed")


class RunDir:
    """A self-describing run directory (see the module docstring for its layout)."""

    def __init__(self, path: str | os.PathLike, create: bool = True):
        self.path = Path(path)
        if create:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise InputError(
                    f"run directory {self.path}", f"cannot be created ({e.strerror})", "a writable folder path"
                ) from None
        elif not self.path.is_dir():
            raise InputError(f"run directory {self.path}", "does not exist", "a folder written by a tpcomm command")

    def __truediv__(self, name: FileSpec | str) -> Path:
        return self.path / str(name)

    def exists(self, name: FileSpec | str) -> bool:
        return (self.path / str(name)).exists()

    def require(self, name: FileSpec | str) -> None:
        """A file this step cannot do without: absent -> SchemaError naming the command that writes it."""
        if not self.exists(name):
            raise SchemaError(contract.spec_for(name) or str(name), f"is missing from {self.path}")

    # ---- JSON documents -------------------------------------------------
    def write_json(self, name: FileSpec | str, obj: Any) -> Path:
        spec = _spec(name, "json")
        # Scrubbed on the way out: a run directory is meant to be shared (see redact.py).
        obj = redact.scrub(json.loads(json.dumps(obj, default=_json_default)))
        for item in obj if spec.list_doc and isinstance(obj, list) else [obj]:
            if isinstance(item, dict):
                item["schema_version"] = contract.SCHEMA_VERSION
        contract.check_json(spec, obj, writing=True)  # a writer that drifts from the contract fails here
        return safefs.write_atomic(self.path, str(name), (json.dumps(obj, indent=2) + "\n").encode())

    def read_json(self, name: FileSpec | str, default: Any = None) -> Any:
        """The document as written (checked against its dataclass); `default` where the file is absent."""
        got = self._load_json(name)
        return default if got is None else got[0]

    def read(self, name: FileSpec | str) -> Any:
        """The document as its dataclass (tpcomm/rundir/documents.py; a list for load/levels.json), None where
        the file is absent; a file that breaks the contract is a SchemaError naming the field."""
        got = self._load_json(name)
        return None if got is None else got[1]

    def _load_json(self, name: FileSpec | str) -> tuple[Any, Any] | None:
        """(the document as written, as its dataclass), parsed once; None where the file is absent."""
        spec = _spec(name, "json")
        p = self.path / str(name)
        if not p.exists():
            return None
        try:  # bounded: depth, NaN/infinities, huge integers (jsonsafe.py); size by _read
            doc = jsonsafe.loads(_read(p, spec, safefs.MAX_JSON_BYTES), spec.path)
        except jsonsafe.BadJSON as e:
            hint = "; it may be truncated" if e.problem.startswith("is not valid JSON") else ""
            raise SchemaError(spec, e.problem + hint) from None
        return doc, contract.check_json(spec, doc)

    # ---- tables ---------------------------------------------------------
    def write_table(self, name: FileSpec | str, df: pd.DataFrame) -> Path:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        spec = _spec(name, "table")
        df = _scrub_strings(df)
        contract.check_table(spec, df)
        table = pa.Table.from_pandas(df, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"tpcomm.schema_version"] = str(contract.SCHEMA_VERSION).encode()
        buf = io.BytesIO()
        pq.write_table(table.replace_schema_metadata(meta), buf)
        return safefs.write_atomic(self.path, str(name), buf.getvalue())

    def read_table(self, name: FileSpec | str) -> pd.DataFrame | None:
        import pyarrow.parquet as pq

        spec = _spec(name, "table")
        p = self.path / str(name)
        if not p.exists():
            return None
        try:
            with _open(p, spec, safefs.MAX_TABLE_BYTES) as f:
                table = pq.read_table(f)
            df = table.to_pandas()
        except SchemaError:
            raise
        except Exception as e:
            raise SchemaError(
                spec, f"cannot be read as Parquet ({type(e).__name__}: {e}); it may be truncated"
            ) from None
        raw = (table.schema.metadata or {}).get(b"tpcomm.schema_version")
        try:
            version = int(raw) if raw is not None else None
        except ValueError:
            version = raw.decode(errors="replace")
        contract.check_table(spec, df, version)
        return df

    # ---- metadata and stage status -------------------------------------
    def record_command(self, command: str, argv: list[str] | None = None) -> None:
        """Lock the run directory for this process (see lock.py), then append this command to meta.json (created
        with stack versions on first use)."""
        from tpcomm.rundir.lock import lock
        from tpcomm.versions import stack_versions

        lock(self.path, command)

        meta = self.read_json(contract.META) or {"created_utc": _utc(), "versions": stack_versions(), "commands": []}
        args = redact.argv(list(argv if argv is not None else sys.argv))
        meta["commands"].append({"command": command, "argv": args, "utc": _utc()})
        self.write_json(contract.META, meta)

    def mark(self, stage: str, state: str, **info: Any) -> None:
        """Record a stage's state (running, complete, incomplete, failed) in status.json, only forward: a re-run
        over a finished stage keeps its record and notes the re-run beside it ("rerun": running, from when, by
        which pid) until the re-run ends and writes its own. So "running" never replaces "complete", and a
        re-run that died half-way (disk full, kill -9) is visible: its note stays and no process holds the lock."""
        status = self.read_json(contract.STATUS) or {}
        old = status.get(stage)
        if state == "running" and isinstance(old, dict) and old.get("state") in FINISHED:
            old = {k: v for k, v in old.items() if k != "rerun"}
            status[stage] = {**old, "rerun": {"state": "running", "utc": _utc(), "pid": os.getpid(), **info}}
        else:
            status[stage] = {"state": state, "utc": _utc(), **info}
        self.write_json(contract.STATUS, status)

    def stage_state(self, stage: str) -> str | None:
        status = self.read(contract.STATUS)
        return status.state(stage) if status else None


def _open(p: Path, spec: FileSpec, limit: int):
    """A regular file of at most `limit` bytes, opened without blocking; anything else a SchemaError."""
    try:
        return safefs.open_regular(p, limit, spec.path)
    except safefs.UnsafePath as e:
        raise SchemaError(spec, e.problem, expected=e.expected) from None
    except OSError as e:
        raise SchemaError(spec, f"cannot be read ({e.strerror or e})") from None


def _read(p: Path, spec: FileSpec, limit: int) -> bytes:
    with _open(p, spec, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SchemaError(spec, f"grew past {limit} bytes while being read")
    return data


def _spec(name: FileSpec | str, fmt: str) -> FileSpec:
    spec = contract.spec_for(name)
    if spec is None:  # a programming error, not a user's: every file a command writes is in the contract
        raise ValueError(f"{name} is not a file of the run-directory contract (tpcomm/rundir/contract.py)")
    if spec.format != fmt:
        raise ValueError(f"{spec.path} is a {spec.format} file in the run-directory contract, not {fmt}")
    return spec


def _scrub_strings(df: pd.DataFrame) -> pd.DataFrame:
    """Text columns (error messages may quote a URL) through redact.text, once per distinct value."""
    from pandas.api.types import is_object_dtype, is_string_dtype

    out = df
    for c in df.columns:
        if not (is_object_dtype(df[c].dtype) or is_string_dtype(df[c].dtype)):
            continue
        try:
            vals = [v for v in df[c].dropna().unique() if isinstance(v, str)]
        except TypeError:  # unhashable cells (lists): not free text
            continue
        fixed = {v: redact.text(v) for v in vals}
        changed = {k: v for k, v in fixed.items() if k != v}
        if changed:
            out = out.copy() if out is df else out
            out[c] = df[c].map(lambda v: changed.get(v, v) if isinstance(v, str) else v)
    return out


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _json_default(o: Any) -> Any:
    # numpy scalars and arrays, Paths
    if hasattr(o, "item") and callable(o.item):
        try:
            return o.item()
        except Exception:
            pass
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
