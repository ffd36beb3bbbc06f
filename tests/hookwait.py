"""Waiting for attribute's own recording of a level, without starving attribute on a 2-core host.

Each GET /tpcomm/v1/status is a collective RPC to every TP worker, and a vLLM worker that read a message
busy-loops on its shared-memory queue (sched_yield) for `busy_loop_s` = 1 s before it parks
(vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition). Polled more often than that, both
TP-2 workers spin without pause on the two cores, and a CPU-bound process beside them (attribute importing its
modules) got 0.18 s of CPU in 146 s here (2026-12-05, /proc/PID/sched): its level never armed. So the wait
first reads attribute's own status.json (no server call) until the run is under way, then asks the hook
once a second.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

POLL_S = 1.0  # hook status polls: no oftener than vLLM's worker busy loop


def _running(out: Path) -> bool:
    try:
        return json.loads((out / "status.json").read_text())["attribute"]["state"] == "running"
    except (OSError, ValueError, KeyError, TypeError):
        return False


def wait_armed(
    hook,
    suffix: str | tuple[str, ...],
    p: subprocess.Popen,
    out: Path,
    timeout: float = 300,
    exclude: str | None = None,
    log: str | None = None,
) -> float:
    """Until the hook's recording is armed for attribute's session ending in `suffix` (or one of them; polled, not guessed; a
    session named `exclude`, an earlier run's, does not count); the seconds that took. When attribute ends first
    or `timeout` passes, attribute is stopped and the test fails with the story: each status call's time and
    answer, the run's status.json, levels and requests, and the end of the server's `log`."""
    t0 = time.monotonic()
    seen: list[tuple[float, float, object, object]] = []  # (s since the call, status call s, armed, session)
    while True:
        if _running(out):
            t = time.monotonic()
            st = hook.status()
            seen.append((round(t - t0, 2), round(time.monotonic() - t, 3), st.get("armed"), st.get("session")))
            session = st.get("session")
            if st.get("armed") and session != exclude and str(session or "").endswith(suffix):
                return seen[-1][0]
        if p.poll() is not None or time.monotonic() - t0 > timeout:
            p.kill()
            stdout, stderr = p.communicate()
            pytest.fail(_story(out, seen, stdout or "", stderr or "", log), pytrace=False)
        time.sleep(POLL_S if seen else 0.2)


def _story(out: Path, seen: list, stdout: str, stderr: str, log: str | None) -> str:
    """Why no armed recording was seen: what the status calls saw and took, when the run's phases happened (its
    run directory) and the end of the server's log (the one place a server-side stall shows)."""
    import pandas as pd

    slowest = max((s[1] for s in seen), default=None)
    story = [f"status calls: {len(seen)}, slowest {slowest} s; first {seen[:3]}; last {seen[-3:]}"]
    for f in ("status.json", "load/levels.json"):
        path = out / f
        story.append(f"{f}: {path.read_text()[:1500] if path.exists() else 'absent'}")
    req = out / "load/requests.parquet"
    if req.exists():
        cols = ["request_id", "t_start_ns", "t_end_ns", "ok", "error"]
        story.append(pd.read_parquet(req).reindex(columns=cols).to_string()[:2000])
    if log and Path(log).exists():
        story.append("server log tail:\n" + "\n".join(Path(log).read_text(errors="replace").splitlines()[-60:]))
    story.append(f"stdout: {stdout[-3000:]}\nstderr: {stderr[-3000:]}")
    return "\n".join(story)


def wait_level_written(out: Path, concurrency: int, p: subprocess.Popen, timeout: float = 300) -> float:
    """Until attribute's load/levels.json holds the level of `concurrency` (written once its records are in:
    the next level starts right after), read from the run directory only, no server call; the seconds that
    took. When attribute ends first or `timeout` passes, attribute is stopped and the test fails with the story."""
    t0 = time.monotonic()
    while True:
        try:
            levels = json.loads((out / "load/levels.json").read_text())
        except (OSError, ValueError):
            levels = []
        if any(lv.get("concurrency") == concurrency for lv in levels):
            return time.monotonic() - t0
        if p.poll() is not None or time.monotonic() - t0 > timeout:
            p.kill()
            stdout, stderr = p.communicate()
            pytest.fail(_story(out, [], stdout or "", stderr or "", None), pytrace=False)
        time.sleep(0.05)


def status_when_answered(hook, timeout: float = 120) -> dict:
    """The hook's status once the workers answer: a 504 (the route's 8 s wait for every worker ran out) while
    they are busy, such as writing the torch profiler's traces after its stop (beside a busy process,
    2026-12-07, that took longer than 8 s), is asked again once a second until `timeout`."""
    from tpcomm.attribute.hook_client import HookTimeout

    deadline = time.monotonic() + timeout
    while True:
        try:
            return hook.status()
        except HookTimeout:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)
