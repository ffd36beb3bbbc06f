"""Talk to the hook's routes (/tpcomm/v1/start, stop, records) and turn its
columnar JSON into the hook/*.parquet tables (schema in ../rundir.py)."""

from __future__ import annotations

import httpx
import pandas as pd

from tpcomm.attribute.server import ServerInfo

COLL_COLUMNS = ["rank", "group", "group_rank", "group_size", "op", "bytes", "dtype", "backend", "step", "call_idx",
                "t_start_ns", "t_end_ns", "duration_us", "timing"]
STEP_COLUMNS = ["rank", "step", "t_start_ns", "t_end_ns", "duration_us", "num_seqs", "num_tokens", "kind"]


class HookError(RuntimeError):
    pass


def _post(info: ServerInfo, path: str, timeout_s: float = 60) -> dict:
    try:
        r = httpx.post(info.url + path, headers=info.headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise HookError(f"POST {path} failed: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise HookError(f"POST {path} answered HTTP {r.status_code}: {r.text[:200]}")
    try:
        return r.json()
    except ValueError:
        return {}


def start(info: ServerInfo) -> dict:
    return _post(info, "/tpcomm/v1/start")


def stop(info: ServerInfo) -> dict:
    return _post(info, "/tpcomm/v1/stop")


def fetch(info: ServerInfo, timeout_s: float = 120) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(collectives, steps, meta) recorded since the last start, all ranks."""
    try:
        r = httpx.get(info.url + "/tpcomm/v1/records", headers=info.headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise HookError(f"GET /tpcomm/v1/records failed: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise HookError(f"GET /tpcomm/v1/records answered HTTP {r.status_code}: {r.text[:200]}")
    return from_columnar(r.json())


def from_columnar(doc: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    for table in ("collectives", "steps"):
        lens = {k: len(v) for k, v in (doc.get(table) or {}).items()}
        if len(set(lens.values())) > 1:
            raise HookError(f"hook records are malformed: columns of {table!r} differ in length {lens}")
    coll = pd.DataFrame(doc.get("collectives") or {c: [] for c in COLL_COLUMNS})
    steps = pd.DataFrame(doc.get("steps") or {c: [] for c in STEP_COLUMNS})
    if "duration_us" not in coll.columns and len(coll):
        coll["duration_us"] = (coll["t_end_ns"] - coll["t_start_ns"]) / 1e3
    if "duration_us" not in steps.columns and len(steps):
        steps["duration_us"] = (steps["t_end_ns"] - steps["t_start_ns"]) / 1e3
    missing = [c for c in COLL_COLUMNS if c not in coll.columns] + [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise HookError(f"hook records lack columns {missing}: tpcomm on the server and here differ in version?")
    return coll, steps, doc.get("meta") or {}


def merge(old: pd.DataFrame | None, new: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Append records, dropping rows already held (a start that does not clear the buffer)."""
    if old is None or old.empty:
        return new.reset_index(drop=True)
    if new.empty:
        return old
    return pd.concat([old, new], ignore_index=True).drop_duplicates(subset=keys, keep="first").reset_index(drop=True)
