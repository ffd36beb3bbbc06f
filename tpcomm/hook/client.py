"""Client side of the hook routes: status/start/stop/records from a server URL.

    from tpcomm.hook.client import HookClient
    hook = HookClient("http://host:8000", api_key=None)
    if hook.available():            # False when the server runs without the plugin
        hook.start()
        ...                         # drive load
        hook.stop()
        coll, steps, meta = hook.frames()
        hook.save(run_dir)          # RUN_DIR/hook/collectives.parquet, steps.parquet, meta.json

Columns are those of ../shared schemas (hook/collectives.parquet and
hook/steps.parquet); `meta` is the server's {"versions", "ranks", "dropped",
"timing", "buffer_capacity", "per_rank": [...]} document. Errors a user can fix
(unreachable server, rejected API key) raise `InputError`; a server without
the plugin raises `HookUnavailable` (an InputError) from every call except
`available()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpcomm.errors import InputError

ENABLE_HINT = ("start the server with the tpcomm plugin: install tpcomm in the server's environment and run "
               "`VLLM_PLUGINS=tpcomm vllm serve MODEL ...`")

COLLECTIVE_DTYPES = {
    "rank": "int32", "group": "string", "group_rank": "int32", "group_size": "int32", "op": "string",
    "bytes": "int64", "dtype": "string", "backend": "string", "step": "int64", "call_idx": "int32",
    "t_start_ns": "int64", "t_end_ns": "int64", "duration_us": "float64", "timing": "string",
}
STEP_DTYPES = {
    "rank": "int32", "step": "int64", "t_start_ns": "int64", "t_end_ns": "int64", "duration_us": "float64",
    "num_seqs": "int32", "num_tokens": "int32", "kind": "string",
}


class HookUnavailable(InputError):
    """The server answers but has no tpcomm routes (plugin not enabled) or its workers lack the hook."""


class HookClient:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            r = httpx.request(method, self.url + path, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise InputError(f"server {self.url}", f"unreachable ({type(e).__name__}: {e})",
                             "a running vLLM server URL such as http://127.0.0.1:8000") from None
        if r.status_code == 401:
            raise InputError(f"server {self.url}", "rejected the API key" if self.api_key else "needs an API key",
                             "the server's --api-key value (--api-key or VLLM_API_KEY)")
        if r.status_code in (404, 405, 503):
            detail = _error_text(r)
            raise HookUnavailable(f"server {self.url}", f"has no tpcomm hook ({r.status_code} on {path}: {detail})",
                                  ENABLE_HINT)
        if r.status_code != 200:
            raise InputError(f"server {self.url}", f"answered {r.status_code} on {path}: {_error_text(r)}")
        return r

    def available(self) -> bool:
        """True when the tpcomm routes answer; False when the server runs without the plugin."""
        try:
            self.status()
        except HookUnavailable:
            return False
        return True

    def status(self) -> dict:
        return self._request("GET", "/tpcomm/v1/status").json()

    def start(self) -> dict:
        return self._request("POST", "/tpcomm/v1/start").json()

    def stop(self) -> dict:
        return self._request("POST", "/tpcomm/v1/stop").json()

    def records(self) -> dict:
        """The raw columnar document {"meta", "collectives", "steps"}."""
        return self._request("GET", "/tpcomm/v1/records").json()

    def metrics(self) -> str:
        return self._request("GET", "/tpcomm/v1/metrics").text

    def frames(self) -> tuple[Any, Any, dict]:
        """(collectives DataFrame, steps DataFrame, meta dict) of the records since the last start."""
        return records_to_frames(self.records())

    def save(self, run_dir: Any) -> dict[str, Path]:
        """Fetch the records and write RUN_DIR/hook/{collectives.parquet, steps.parquet, meta.json}."""
        return save_records(self.records(), run_dir)


def records_to_frames(doc: dict) -> tuple[Any, Any, dict]:
    import pandas as pd

    def frame(cols: dict, dtypes: dict) -> pd.DataFrame:
        df = pd.DataFrame({k: cols.get(k, []) for k in dtypes})
        return df.astype(dtypes)

    return frame(doc["collectives"], COLLECTIVE_DTYPES), frame(doc["steps"], STEP_DTYPES), doc["meta"]


def save_records(doc: dict, run_dir: Any) -> dict[str, Path]:
    from tpcomm.rundir import RunDir

    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    coll, steps, meta = records_to_frames(doc)
    return {
        "collectives": rd.write_table("hook/collectives.parquet", coll),
        "steps": rd.write_table("hook/steps.parquet", steps),
        "meta": rd.write_json("hook/meta.json", meta),
    }


def _error_text(r: Any) -> str:
    try:
        body = r.json()
        err = body.get("error", body.get("detail", body))
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except Exception:  # noqa: BLE001
        return r.text[:300]
