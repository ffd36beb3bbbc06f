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

POLL_S = 1.0  # hook status polls: no oftener than vLLM's worker busy loop


def _running(out: Path) -> bool:
    try:
        return json.loads((out / "status.json").read_text())["attribute"]["state"] == "running"
    except (OSError, ValueError, KeyError, TypeError):
        return False


def wait_armed(hook, suffix: str, p: subprocess.Popen, out: Path, timeout: float = 300) -> None:
    """Until the hook's recording is armed for attribute's session ending in `suffix` (polled, not guessed);
    fails at once when attribute ended first."""
    deadline = time.monotonic() + timeout
    while not _running(out):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, f"attribute did not start its run in {timeout:.0f} s"
        time.sleep(0.2)
    while True:
        st = hook.status()
        if st.get("armed") and str(st.get("session") or "").endswith(suffix):
            return
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, st.get("session")
        time.sleep(POLL_S)
