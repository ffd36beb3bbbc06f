"""`tpcomm selfcheck`: the real command in a subprocess (on CPU: the CPU items PASS, the CUDA ones SKIP,
exit 0), a check made to fail (exit 1), bad input (exit 2), and the judges on wrong figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tpcomm.selfcheck.result import (
    FAIL,
    PASS,
    SKIP,
    Check,
    exit_code,
    judge_at_most,
    judge_ratio,
    judge_sampled_steps,
    judge_wrong,
    summary,
)


def _cuda() -> bool:
    from tpcomm.probe.runner import _cuda as probe_cuda

    return probe_cuda()


def _selfcheck(*args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "selfcheck", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _lines(stdout: str) -> dict[str, str]:
    """{item id: status} from the PASS/FAIL/SKIP lines."""
    out = {}
    for ln in stdout.splitlines():
        parts = ln.split()
        if parts and parts[0] in (PASS, FAIL, SKIP):
            out[parts[1]] = parts[0]
    return out


def test_judges_fail_on_wrong_figures():
    assert judge_ratio(1002.0, 1000.0, 0.05) == PASS
    assert judge_ratio(1300.0, 1000.0, 0.05) == FAIL  # a timer reading 30% long
    assert judge_ratio(0.0, 1000.0, 0.05) == FAIL  # nothing measured is never a pass
    # rows at steps 0, 4, 8 of 12 with 1 in 4 sampled; rows at every step (sampling ignored) or a missing one fail
    assert judge_sampled_steps([0, 4, 8], 12, 4, 1) == PASS
    assert judge_sampled_steps(list(range(12)), 12, 4, 1) == FAIL
    assert judge_sampled_steps([0, 8], 12, 4, 1) == FAIL
    assert judge_at_most(1.2, 5.0) == PASS and judge_at_most(7.5, 5.0) == FAIL
    assert judge_wrong(0) == PASS and judge_wrong(3) == FAIL
    checks = [Check("a", PASS, "x"), Check("b", SKIP, "needs CUDA")]
    assert exit_code(checks) == 0 and summary(checks).endswith("(exit 0)")
    checks.append(Check("c", FAIL, "1300 us against 1000 us"))
    assert exit_code(checks) == 1 and "1 FAIL" in summary(checks)


@pytest.mark.dist
def test_selfcheck_on_this_machine(tmp_path):
    out = tmp_path / "selfcheck.json"
    p = _selfcheck("--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    got = _lines(p.stdout)
    if _cuda():
        assert all(s != FAIL for s in got.values()), p.stdout
        assert {got[i] for i in ("timer-eager", "timer-graph", "nvml", "graph-event-overhead")} == {PASS}, p.stdout
    else:
        for item in ("hook-timed", "fork", "probe-ops-eager", "rank-refusal"):
            assert got.get(item) == PASS, p.stdout
        for item in ("timer-eager", "timer-graph", "nvml", "graph-event-overhead", "probe-ops-graph", "multi-gpu"):
            assert got.get(item) == SKIP, p.stdout
        assert "SKIP  timer-eager" in p.stdout and "needs CUDA" in p.stdout
    assert "# conditions:" in p.stdout and "torch" in p.stdout and p.stdout.rstrip().endswith("(exit 0)")
    doc = json.loads(out.read_text())
    assert doc["passed"] is True and doc["conditions"]["torch"] and "cuda_available" in doc["conditions"]
    assert {c["id"] for c in doc["checks"]} == set(got)
    # every line states its figure: the host-clock hook check names the clock, its rows and the reference
    hook = next(c for c in doc["checks"] if c["id"] == "hook-timed")
    assert hook["detail"]["reference_us"] > 0 and ("median" in hook["figure"])


def test_a_sabotaged_check_fails_and_exits_1():
    # The known-length work of the hook check runs 3x its stated length: the real measurement must catch it.
    env = {"TPCOMM_SELFCHECK_TEST_FAULTS": "1", "TPCOMM_SELFCHECK_TEST_FAULT": "hook-timed"}
    p = _selfcheck("--only", "hook-timed", env=env, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr[-2000:]
    assert _lines(p.stdout) == {"hook-timed": FAIL} and "(exit 1)" in p.stdout
    # the fault variable alone (no test flag) is ignored
    p = _selfcheck("--only", "hook-timed", env={"TPCOMM_SELFCHECK_TEST_FAULT": "hook-timed"}, timeout=300)
    assert p.returncode == 0 and _lines(p.stdout) == {"hook-timed": PASS}, p.stdout + p.stderr[-2000:]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    p = _selfcheck("--only", "timer,bogus")
    assert p.returncode == 2 and "--only timer,bogus" in p.stderr and "timer-eager" in p.stderr
    assert "Traceback" not in p.stderr
    p = _selfcheck("--json", str(tmp_path / "missing" / "x.json"), "--only", "rank-refusal")
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr
