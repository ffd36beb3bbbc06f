"""Client side of the hook routes: status/start/stop/records from a server URL.

    from tpcomm.attribute.hook_client import HookClient
    hook = HookClient("http://host:8000", api_key=None)
    if hook.available():            # False when the server runs without the plugin
        hook.start()
        ...                         # drive load
        hook.stop()
        coll, steps, meta = hook.frames()
        hook.save(run_dir)          # RUN_DIR/hook/collectives.parquet, steps.parquet, meta.json

Columns are those of the run-directory contract (tpcomm/rundir/contract.py:
HOOK_COLLECTIVES, HOOK_STEPS); `meta` is the server's {"versions", "ranks",
"dropped", "timing", "buffer_capacity", "per_rank": [...]} document. This is
the one client of the hook's routes (`attribute` uses it too). Every failure
is a `HookError` (an InputError: one line, exit 2 at the CLI); a server without
the plugin raises its subclass `HookUnavailable` from every call except
`available()`, with the enable hint (judge/definitions.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpcomm.errors import InputError
from tpcomm.judge.definitions import enable_hint
from tpcomm.rundir import contract

_DTYPE = {"i": "int64", "f": "float64", "s": "string", "b": "bool"}
COLLECTIVE_DTYPES = {c.name: _DTYPE[c.kind] for c in contract.HOOK_COLLECTIVES.columns}
STEP_DTYPES = {c.name: _DTYPE[c.kind] for c in contract.HOOK_STEPS.columns}
STEP_REQUEST_DTYPES = {c.name: _DTYPE[c.kind] for c in contract.HOOK_STEP_REQUESTS.columns}


class HookError(InputError):
    """The hook's routes failed: unreachable, key rejected, an error answer, or malformed records."""


class HookUnavailable(HookError):
    """The server answers but has no tpcomm routes (plugin not enabled) or its workers lack the hook."""


class HookTimeout(HookError):
    """The workers did not answer in time (504 from the routes, or no answer within the client's timeout):
    a worker stopped (SIGSTOP, a debugger) or hung; the API server itself may be fine."""


class RecordingTaken(HookError):
    """The recording is no longer this client's: another client started (or stopped) it meanwhile."""


class HookClient:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        keep_alive: bool = False,
        verify: Any = True,
    ):
        """`keep_alive`: one connection pool for every request of this client (for a poller: a fresh
        httpx client costs ~25-40 ms of CPU each, in the process that also times the load's tokens).
        `verify`: httpx's TLS verification (True: system CAs or SSL_CERT_FILE; an ssl.SSLContext; False)."""
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.verify = verify
        self.given_up: Any = None  # a threading.Event: once set, records() asks for no further page
        self._http: Any = None
        if keep_alive:
            import httpx

            from tpcomm import netread

            self._http = httpx.Client(timeout=timeout_s, verify=netread.tls(verify))

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def _request(self, method: str, path: str, params: dict | None = None) -> Any:
        import time

        import httpx

        from tpcomm import netread

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                # bounded in size and in time as a whole (netread): a server that drips or floods ends here
                r = netread.request(
                    method,
                    self.url + path,
                    limit=netread.RECORDS_PAGE if path.endswith("/records") else netread.SMALL,
                    timeout_s=self.timeout_s,
                    client=self._http,
                    verify=self.verify,
                    headers=headers,
                    params=params,
                )
                if r.status_code != 429 or time.monotonic() > deadline:
                    break
                # Another client's pull is being served (one at a time): wait as the server asks.
                time.sleep(min(float(r.headers.get("Retry-After") or 1), 5.0))
        except netread.BodyTooLarge as e:
            raise HookError(f"server {self.url}", f"sent too much on {method} {path} ({e})") from None
        except httpx.TimeoutException as e:
            raise HookTimeout(
                f"server {self.url}",
                f"did not answer {method} {path} within {self.timeout_s:g} s ({type(e).__name__})",
            ) from None
        except httpx.HTTPError as e:
            raise HookError(
                f"server {self.url}",
                f"unreachable ({type(e).__name__}: {e})",
                "a running vLLM server URL such as http://127.0.0.1:8000",
            ) from None
        if r.status_code == 401:
            raise HookError(
                f"server {self.url}",
                "rejected the API key" if self.api_key else "needs an API key",
                "the server's --api-key value (--api-key or VLLM_API_KEY)",
            )
        if r.status_code in (404, 405, 503):
            detail = _error_text(r)
            raise HookUnavailable(
                f"server {self.url}", f"has no tpcomm hook ({r.status_code} on {path}: {detail}); " + enable_hint()
            )
        if r.status_code == 504:
            raise HookTimeout(f"server {self.url}", f"answered 504 on {path}: {_error_text(r)}")
        if r.status_code == 409:
            raise RecordingTaken(f"server {self.url}", f"answered 409 on {path}: {_error_text(r)}")
        if r.status_code != 200:
            raise HookError(f"server {self.url}", f"answered {r.status_code} on {path}: {_error_text(r)}")
        return r

    def available(self) -> bool:
        """True when the tpcomm routes answer; False when the server runs without the plugin."""
        try:
            self.status()
        except HookUnavailable:
            return False
        return True

    def status(self) -> dict:
        return _doc(self._request("GET", "/tpcomm/v1/status"), "status")

    def start(self, session: str | None = None, lease_s: int | None = None) -> dict:
        """Clear and arm; `session` names this recording so a later status shows whether it is still ours;
        `lease_s`: it ends by itself after this long without a call of any client (the server's default when
        None)."""
        params = {k: v for k, v in (("session", session), ("lease_s", lease_s)) if v is not None}
        return _doc(self._request("POST", "/tpcomm/v1/start", params or None), "start")

    def stop(self, session: str | None = None) -> dict:
        """Disarm; with `session`, only that recording (never another client's, even if this call arrives
        late: the workers check it when they run it)."""
        return _doc(self._request("POST", "/tpcomm/v1/stop", {"session": session} if session else None), "stop")

    def workers(self) -> list[dict]:
        """[{rank, pid, host, identity, alive, state}]: checked in the API server, no engine round trip (answers
        while a worker is dead or stopped)."""
        return list(self.workers_doc().get("workers") or [])

    def workers_doc(self) -> dict:
        """GET /tpcomm/v1/workers whole: {"workers": [...], "api_server": {pid, host, identity}, "checked_ns"}."""
        doc = _doc(self._request("GET", "/tpcomm/v1/workers"), "workers")
        return doc if isinstance(doc, dict) else {}

    def records(self, session: str | None = None) -> dict:
        """The raw columnar document {"meta", "collectives", "steps"}, pulled page by page. Every page must
        come from the same recording (session and start time); with `session`, the server refuses a page of
        another (409). A recording restarted between pages is a `RecordingTaken`, never a silent truncation."""
        params = {"session": session} if session else {}
        doc = _doc(self._request("GET", "/tpcomm/v1/records", {**params, "page": 0}), "records")
        first = doc.get("meta") or {}
        pages = int(first.get("pages") or 1)
        for page in range(1, pages):
            if self.given_up is not None and self.given_up.is_set():  # the caller moved on (RankWatch.call)
                raise HookError(f"server {self.url}", f"the records' pull was given up before page {page} of {pages}")
            more = _doc(self._request("GET", "/tpcomm/v1/records", {**params, "page": page}), "records")
            meta = more.get("meta") or {}
            changed = [k for k in ("session", "started_ns", "pages") if meta.get(k) != first.get(k)]
            if changed:
                raise RecordingTaken(
                    f"server {self.url}",
                    f"records page {page} of {pages} comes from another recording ({', '.join(changed)} changed: "
                    f"session {first.get('session')!r} -> {meta.get('session')!r}); another client restarted it",
                )
            for table in ("collectives", "steps", "step_requests"):
                for k, v in (more.get(table) or {}).items():
                    doc[table].setdefault(k, []).extend(v)
        return doc

    def metrics(self) -> str:
        return self._request("GET", "/tpcomm/v1/metrics").text

    def frames(self, session: str | None = None) -> tuple[Any, Any, dict]:
        """(collectives DataFrame, steps DataFrame, meta dict) of the records since the last start."""
        coll, steps, _, meta = self.level_frames(session)
        return coll, steps, meta

    def level_frames(self, session: str | None = None) -> tuple[Any, Any, Any, dict]:
        """(collectives, steps, step requests, meta): frames() and which of the client's requests each step
        served (empty from a hook that predates them)."""
        doc = self.records(session)
        coll, steps, meta = records_to_frames(doc)
        return coll, steps, step_requests_frame(doc), meta

    def save(self, run_dir: Any) -> dict[str, Path]:
        """Fetch the records and write RUN_DIR/hook/{collectives.parquet, steps.parquet, meta.json}."""
        return save_records(self.records(), run_dir)


def records_to_frames(doc: dict) -> tuple[Any, Any, dict]:
    """The columnar document of GET /tpcomm/v1/records -> (collectives, steps) typed as the contract says, meta."""
    import pandas as pd

    def frame(name: str, dtypes: dict) -> pd.DataFrame:
        cols = doc.get(name) or {}
        if not isinstance(cols, dict):
            raise HookError("hook records", f"{name!r} is not a columnar object", "the tpcomm of the same version")
        lens = {k: len(v) for k, v in cols.items()}
        if len(set(lens.values())) > 1:
            raise HookError("hook records", f"are malformed: columns of {name!r} differ in length {lens}")
        df = pd.DataFrame(cols) if cols else pd.DataFrame({k: [] for k in dtypes})
        if "duration_us" not in df.columns and len(df):
            df["duration_us"] = (df["t_end_ns"] - df["t_start_ns"]) / 1e3
        missing = [c for c in dtypes if c not in df.columns]
        if missing:
            raise HookError(
                "hook records",
                f"lack columns {missing} in {name!r}",
                "tpcomm of the same version on the server and here",
            )
        return df[list(dtypes) + [c for c in df.columns if c not in dtypes]].astype(dtypes)

    if not isinstance(doc, dict):
        raise HookError("hook records", f"are a JSON {type(doc).__name__}, not an object")
    return frame("collectives", COLLECTIVE_DTYPES), frame("steps", STEP_DTYPES), doc.get("meta") or {}


def step_requests_frame(doc: dict) -> Any:
    """The step requests table of a records document (recorder.py); empty where the hook sent none."""
    import pandas as pd

    cols = doc.get("step_requests") or {}
    if not isinstance(cols, dict) or len({len(v) for v in cols.values()}) > 1:
        raise HookError("hook records", "'step_requests' is not a columnar object of equal-length columns")
    missing = [c for c in STEP_REQUEST_DTYPES if cols and c not in cols]
    if missing:
        raise HookError("hook records", f"lack columns {missing} in 'step_requests'", "tpcomm of the same version")
    df = pd.DataFrame({k: cols.get(k, []) for k in STEP_REQUEST_DTYPES})
    return df.astype(STEP_REQUEST_DTYPES)


def merge(old: Any, new: Any, keys: list[str]) -> Any:
    """Append records, dropping rows already held (a start that does not clear the buffer)."""
    import pandas as pd

    if old is None or old.empty:
        return new.reset_index(drop=True)
    if new.empty:
        return old
    return pd.concat([old, new], ignore_index=True).drop_duplicates(subset=keys, keep="first").reset_index(drop=True)


def save_records(doc: dict, run_dir: Any) -> dict[str, Path]:
    from tpcomm.rundir.layout import RunDir

    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    coll, steps, meta = records_to_frames(doc)
    return {
        "collectives": rd.write_table(contract.HOOK_COLLECTIVES, coll),
        "steps": rd.write_table(contract.HOOK_STEPS, steps),
        "step_requests": rd.write_table(contract.HOOK_STEP_REQUESTS, step_requests_frame(doc)),
        "meta": rd.write_json(contract.HOOK_META, meta),
    }


def _doc(r: Any, route: str) -> dict:
    """A route's JSON object, parsed with bounds (depth, number types: jsonsafe); HookError otherwise."""
    from tpcomm import jsonsafe

    try:
        doc = jsonsafe.loads(r.content, f"the answer of /tpcomm/v1/{route}")
    except jsonsafe.BadJSON as e:
        raise HookError(e.what, e.problem, "tpcomm's hook of the same version") from None
    if not isinstance(doc, dict):
        raise HookError(f"the answer of /tpcomm/v1/{route}", f"is a JSON {type(doc).__name__}, not an object")
    return doc


def _error_text(r: Any) -> str:
    try:
        body = r.json()
        err = body.get("error", body.get("detail", body))
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except Exception:  # noqa: BLE001
        return r.text[:300]
