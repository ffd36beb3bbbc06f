"""VllmServer.stop ends the server's whole process group, also where its leader (the API server) is already gone:
a test that killed the API server and reaped it left the group's other processes (vLLM's engine core and
workers) running when stop() asked os.getpgid of the reaped leader, which fails (fixed 2026-12-07). Real
processes stand for the server here: a leader in a session of its own and a child it started, as vLLM's
API server starts its engine core."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tpcomm.vllm_server import VllmServer

LEADER = (
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop_ends_the_group_after_its_leader_was_killed_and_reaped():
    srv = VllmServer(model="unused", tp=1)
    srv.proc = subprocess.Popen(
        [sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(srv.proc.stdout.readline())
    try:
        assert _alive(child) and os.getpgid(child) == srv.proc.pid
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=10)  # reaped: the leader's pid names no process now
        assert _alive(child)  # its child lives on, as an engine core would
        srv.stop(grace_s=5)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "stop() left the group's other process running"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
