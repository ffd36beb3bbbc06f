"""The hook's routes for `attribute`, through the one hook client (tpcomm/attribute/hook_client.py).

start/stop/fetch take the ServerInfo that check_server() built (URL and key);
every failure is a `HookError` (an InputError), the client's one error type.
"""

from __future__ import annotations

import pandas as pd

from tpcomm.attribute.hook_client import HookClient, HookError, HookTimeout, RecordingTaken, merge, records_to_frames
from tpcomm.attribute.server import ServerInfo

__all__ = [
    "HookError",
    "HookTimeout",
    "RecordingTaken",
    "start",
    "stop",
    "status",
    "session_problem",
    "cpu_wait",
    "fetch",
    "merge",
    "from_columnar",
]


def _client(info: ServerInfo, timeout_s: float = 60) -> HookClient:
    return HookClient(info.url, api_key=info.api_key, timeout_s=timeout_s, verify=info.verify)


def start(info: ServerInfo, session: str | None = None, lease_s: int | None = None) -> dict:
    return _client(info).start(session=session, lease_s=lease_s)


def stop(info: ServerInfo, session: str | None = None, timeout_s: float = 60) -> dict:
    return _client(info, timeout_s).stop(session)


def status(info: ServerInfo, timeout_s: float = 60) -> dict:
    return _client(info, timeout_s).status()


def session_problem(st: dict, session: str, started_ns: int) -> str | None:
    """Why the recording this client started is no longer its own (from a status taken before its own stop):
    someone else started recording (another session id), or stopped it (disarmed before we stopped)."""
    if st.get("session") != session:
        return (
            f"another client restarted the hook's recording during this level (session {st.get('session')!r}, "
            f"ours {session!r}): records from before that restart are lost"
        )
    if not st.get("armed") and st.get("lease_ended_ns"):
        return (
            f"the hook's recording ended by its lease ({st.get('lease_s', 0):.0f} s without a client call) during "
            "this level: later steps were not recorded"
        )
    if not st.get("armed"):
        when = st.get("stopped_ns") or 0
        # our recording's start on the workers' clock, as the stop's time is (the client's may be off it)
        began = st.get("started_ns") or started_ns
        after = f" {(when - began) / 1e9:.1f} s after our start" if when and began and when >= began else ""
        return f"another client stopped the hook's recording during this level{after}: later steps were not recorded"
    return None


def cpu_wait(st: dict, since: dict | None = None) -> dict | None:
    """The TP workers' CPU wait over the recording so far (less `since`, an earlier result of this function
    in the same recording), from a status taken before the stop (the hook's `cpu_wait`: each worker's step
    thread, Linux schedstat run_delay): per rank ms and engine steps, and `ms_per_step` summed over ranks
    (each rank's wait per step, added: waits of different ranks at different moments all delay the step).
    None where a rank does not say (not Linux, an older hook) or ran no step in the span."""
    per = {str(r.get("rank")): r.get("cpu_wait") for r in st.get("per_rank") or []}
    if not per or not all(isinstance(w, dict) for w in per.values()):
        return None
    out = {k: {"ms": w["wait_ns"] / 1e6, "steps": int(w["steps"])} for k, w in sorted(per.items())}
    if since is not None:
        before = since.get("per_rank") or {}
        if set(before) != set(out):
            return None
        out = {
            k: {"ms": v["ms"] - before[k]["ms"], "steps": v["steps"] - int(before[k]["steps"])} for k, v in out.items()
        }
    if not all(v["steps"] > 0 for v in out.values()):
        return None
    return {"ms_per_step": sum(v["ms"] / v["steps"] for v in out.values()), "per_rank": out}


def fetch(
    info: ServerInfo, session: str | None = None, timeout_s: float = 120
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(collectives, steps, meta) recorded since the last start, all ranks; with `session`, only while that
    recording is still the workers' (else RecordingTaken)."""
    return _client(info, timeout_s).frames(session)


def fetch_level(info: ServerInfo, session: str | None = None, timeout_s: float = 120, given_up=None):
    """(collectives, steps, step requests, meta): fetch() and which of attribute's own requests each step
    served (recorder.py). `given_up`: a threading.Event; once set, no further page is asked for."""
    client = _client(info, timeout_s)
    client.given_up = given_up
    return client.level_frames(session)


from_columnar = records_to_frames
