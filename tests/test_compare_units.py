"""`tpcomm compare` on run directories that attribute's own code analysed: synthetic runs with a known answer
(tests/compare_synthetic.py), the real recorded run (tests/data/attribute_tiny_tp2), the sample predictions
(reports/runs); the CLI's outputs and its one-line refusals; the comparison PDF read back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from compare_synthetic import run_dir
from measured_run import measured_run

from tpcomm.cli import cli
from tpcomm.compare.analysis import compare_runs
from tpcomm.compare.results import Comparison
from tpcomm.compare.samples import load_samples
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution

ROOT = Path(__file__).resolve().parent.parent
KIMI_INT4 = ROOT / "reports/runs/kimi-k2.5-int4-tp8-rtx-pro-6000"
KIMI_NVFP4 = ROOT / "reports/runs/kimi-k2.5-nvfp4-tp8-rtx-pro-6000"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """Synthetic single-stream runs: A, A2 (same configuration, another seed), SLOW (compute +20%)."""
    d = tmp_path_factory.mktemp("synth")
    return {
        "a": run_dir(d / "a", seed=1),
        "a2": run_dir(d / "a2", seed=2),
        "slow": run_dir(d / "slow", seed=3, compute_us=3600.0),
        "late": run_dir(d / "late", seed=4, delivery_slope_us=400.0),
    }


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return measured_run(tmp_path_factory.mktemp("real") / "run")


def test_samples_reproduce_the_summary_of_a_real_run(real, tmp_path):
    """The per-step files of a real vLLM-CPU run give back the summary's headline and terms exactly (attribute's
    own pairing and pairs); trimmed files do not, and the level then gets no interval (said, not guessed)."""
    rd = RunDir(real, create=False)
    att = Attribution.from_json(rd.read_json(C.ATTR_SUMMARY))
    samples, why = load_samples(rd, att)
    assert why is None and samples
    for lv in att.levels:
        s = samples[(lv.concurrency, lv.repeat)]
        assert s.problem is None, s.problem
        assert s.point["per_token"] == pytest.approx(lv.engine_ms_per_token, rel=1e-9)
        for k, v in lv.per_token_ms.as_dict().items():
            assert s.point[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    trimmed = tmp_path / "trimmed"
    shutil.copytree(real, trimmed)
    t = RunDir(trimmed, create=False)
    rows = t.read_table(C.ATTR_STEPS_BY_RANK)
    t.write_table(C.ATTR_STEPS_BY_RANK, rows.iloc[: len(rows) // 2])
    cmp = compare_runs(real, trimmed)
    lv = cmp.levels[0]
    assert lv.problem and "no interval" in lv.problem and lv.term("per_token").resolved is None
    assert "cannot be said" in cmp.verdict
    assert "--reanalyse" not in lv.problem  # a summary of this tpcomm's period definition: only the mismatch
    # A summary analysed with start-to-start periods (schema_version 3): the likely cause and its fix are named.
    doc = json.loads((trimmed / "attribution/summary.json").read_text())
    assert doc["schema_version"] == C.SCHEMA_VERSION >= C.PERIODS_END_TO_END
    doc["schema_version"] = 3
    (trimmed / "attribution/summary.json").write_text(json.dumps(doc))
    lv = compare_runs(real, trimmed).levels[0]
    assert "schema_version 3, older than this tpcomm's end-to-end decode periods" in lv.problem, lv.problem
    assert f"tpcomm attribute --reanalyse {trimmed}" in lv.problem, lv.problem


def test_a_run_against_itself_changes_nothing(real):
    cmp = compare_runs(real, real)
    lv = cmp.levels[0]
    assert all(t.diff == 0 for t in lv.terms if t.diff is not None)
    assert not any(t.resolved for t in lv.terms)
    assert all(c.same for c in cmp.conditions)


def test_synthetic_a_a_resolves_nothing_and_the_terms_add_up(synth):
    cmp = compare_runs(synth["a"], synth["a2"])
    (lv,) = cmp.levels
    assert lv.problem is None and lv.concurrency == 1 and "16 requests" in lv.resampled
    assert [t.name for t in lv.terms if t.resolved] == []
    d = {t.name: t.diff for t in lv.terms}
    assert d["per_token"] == pytest.approx(d["compute"] + d["transfer"] + d["wait"] + d["host_gap"], abs=1e-12)
    assert abs(lv.sum_residual_ms) < 1e-12
    assert "no change in the per-token time that this comparison can resolve" in cmp.verdict
    assert "collectives unchanged" in cmp.verdict and "one repeat each" in cmp.caveat


def test_the_delivery_term_gets_an_interval_and_a_slower_delivery_is_resolved(synth):
    """The fifth term is resampled with its requests (each request's decode steps and its tokens one block):
    A against A2 (same configuration) resolves neither it nor the client's per-token time; B's tokens each
    reach the client 0.4 ms later than the one before, beyond the engine's pace (the generator's drift): the
    delivery term and the client's per-token time rise by 0.4 ms, resolved, and the engine's terms do not."""
    same = compare_runs(synth["a"], synth["a2"]).levels[0]
    for name in ("delivery_term", "client_per_token"):
        t = same.term(name)
        assert t.lo is not None and t.lo < t.diff < t.hi and not t.resolved, t
    assert "the delivery term and delivery with it" in same.resampled, same.resampled
    late = compare_runs(synth["a"], synth["late"]).levels[0]
    dt, cl = late.term("delivery_term"), late.term("client_per_token")
    assert dt.resolved and dt.diff == pytest.approx(0.4, abs=0.05) and dt.lo > 0.3, dt
    assert cl.resolved and cl.diff > 0.3, cl
    assert not late.term("compute").resolved and not late.term("per_token").resolved


def test_synthetic_compute_shift_is_named_in_the_verdict(synth):
    """B's compute is 0.6 ms per step slower (the generator's compute_us 3000 -> 3600): the per-token time and
    compute are resolved with B slower and compute named first; the transfer (the generator's, not scaled) is
    not called changed. (The generator's rank skew grows with compute, so the wait moves too, and says so.)"""
    cmp = compare_runs(synth["a"], synth["slow"])
    lv = cmp.levels[0]
    pt, comp = lv.term("per_token"), lv.term("compute")
    assert pt.resolved and pt.diff > 0 and comp.resolved and comp.diff > 0
    assert 0.45 < comp.diff < 0.75, comp
    assert not lv.term("transfer").resolved
    assert cmp.verdict.startswith(f"At C=1: B is {pt.diff:.3g} ms per token slower than A")
    assert f"; {comp.diff:.3f} ms of it is compute," in cmp.verdict
    assert "transfer -0.000 ms not resolved" in cmp.verdict or "transfer +0.000 ms not resolved" in cmp.verdict
    assert lv.term("tok_per_s").diff < 0


def test_a_shift_the_host_load_could_make_is_not_called_a_change(tmp_path):
    """The same compute shift (+0.6 ms per step) with the ranks' CPU wait per step stated in each run: where it
    rose by 1 ms per step (B's host busier by more than the shift) compute and the per-token time are resolved
    but marked as possibly the host's load, the verdict says it cannot tell, the gate refuses to judge (exit 2);
    where it rose by 0.01 ms the same shift is a change; where one run lacks it, a note says it was not
    measured; where it fell (A's host the busier) the slowdown is a change (the load could only hide part of it);
    where the runs' ranks differ it is not checked, and a note says so."""
    a = run_dir(tmp_path / "a", seed=1, cpu_wait_ms=0.05)
    busy = run_dir(tmp_path / "busy", seed=3, compute_us=3600.0, cpu_wait_ms=1.05)
    quiet = run_dir(tmp_path / "quiet", seed=3, compute_us=3600.0, cpu_wait_ms=0.06)
    cmp = compare_runs(a, busy)
    lv = cmp.levels[0]
    assert lv.cpu_wait_ms_per_step == pytest.approx([0.05, 1.05])
    # the client's per-token time too: the engine's per-token time inside it is marked, so it cannot be a change
    for name in ("per_token", "compute", "tok_per_s", "client_per_token"):
        t = lv.term(name)
        assert t.resolved and t.host_load and not t.changed, t
    assert [t.name for t in lv.terms if t.changed] == []
    # ... unless the delivery term moved too: B's API server falls behind over each stream while B's host is
    # busier, the engine unchanged: the client's slowdown is delivery's (resolved), not the host's load
    late = run_dir(tmp_path / "late-busy", seed=3, cpu_wait_ms=1.05, delivery_slope_us=400.0)
    lv_late = compare_runs(a, late).levels[0]
    assert lv_late.term("delivery_term").changed and not lv_late.term("per_token").resolved, lv_late.term("per_token")
    cl = lv_late.term("client_per_token")
    assert cl.changed and cl.host_load is None, cl
    assert "+1.00 ms (A 0.050, B 1.05 ms)" in lv.term("compute").host_load, lv.term("compute").host_load
    assert "cannot be told from the host's load" in cmp.verdict and "B is" not in cmp.verdict
    assert any(
        n.startswith("resolved but possibly the host's load (per-token time (engine), compute") for n in lv.notes
    )
    cond = {(c.section, c.name): (c.a, c.b) for c in cmp.conditions}
    assert cond[("load", "C=1 repeat 0 ranks' CPU wait")] == ("0.050 ms per engine step", "1.05 ms per engine step")
    gate = _cli(a, busy, "--fail-if-slower", "5")
    assert gate.exit_code == 2 and "cannot be judged" in gate.output and "host's load" in gate.output, gate.output
    cmp = compare_runs(a, quiet)
    comp = cmp.levels[0].term("compute")
    assert comp.changed and comp.host_load is None
    assert cmp.verdict.startswith("At C=1: B is") and _cli(a, quiet, "--fail-if-slower", "5").exit_code == 1
    cmp = compare_runs(run_dir(tmp_path / "none", seed=1), quiet)
    assert cmp.levels[0].term("compute").changed  # not measured: nothing to mark, and it says so
    assert any("was not measured in A" in n for n in cmp.levels[0].notes), cmp.levels[0].notes
    # A's host was the busier one: the load can only have hidden part of B's slowdown, which is a change.
    cmp = compare_runs(run_dir(tmp_path / "a-busy", seed=1, cpu_wait_ms=1.05), quiet)
    comp = cmp.levels[0].term("compute")
    assert comp.changed and comp.host_load is None and cmp.levels[0].cpu_wait_ms_per_step == pytest.approx([1.05, 0.06])
    assert _cli(tmp_path / "a-busy", quiet, "--fail-if-slower", "5").exit_code == 1
    # Summed over other ranks (one rank in A): not checked, and named.
    cmp = compare_runs(run_dir(tmp_path / "one-rank", seed=1, cpu_wait_ms=0.05, ranks=("0",)), busy)
    assert cmp.levels[0].term("compute").changed
    assert any("summed over other ranks" in n for n in cmp.levels[0].notes), cmp.levels[0].notes


def test_a_shift_a_slower_host_could_make_is_not_called_a_change(tmp_path):
    """The host's speed (its reference work's trimmed mean time, attribute's client on the server's machine) as the
    second allowance beside the ranks' CPU wait, which is unchanged here: compute 20% longer in B (3.0 -> 3.6
    ms per step) with B's host running the reference 25% slower is resolved but possibly the host; 1% slower
    leaves it a change; a faster host in B can only have hidden part of B's slowdown (a change); and the shape
    CI met (2026-12-07: an A/A across a restart, every term shorter in B, the ranks' CPU wait 0.4 ms per step
    apart against 0.87 ms per token): A's host slower by as much as B's terms are shorter is no change."""
    a = run_dir(tmp_path / "a", seed=1, cpu_wait_ms=0.05, reference_ms=3.0)
    slow = run_dir(tmp_path / "slow", seed=3, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=3.75)
    lv = compare_runs(a, slow).levels[0]
    assert lv.reference_ms == pytest.approx([3.0, 3.75])
    for name in ("per_token", "compute", "tok_per_s"):
        t = lv.term(name)
        assert t.resolved and t.host_load and not t.changed, t
    assert "reference work 25% slower in B (A 3.00, B 3.75 ms" in lv.term("compute").host_load, lv.term("compute")
    assert "CPU wait" not in lv.term("compute").host_load  # the wait did not move: only the speed is named
    cmp = compare_runs(a, run_dir(tmp_path / "same", seed=3, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=3.03))
    assert cmp.levels[0].term("compute").changed and cmp.verdict.startswith("At C=1: B is"), cmp.verdict
    fast = run_dir(tmp_path / "fast", seed=3, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=2.4)
    assert compare_runs(a, fast).levels[0].term("compute").changed
    cond = {(c.section, c.name): (c.a, c.b) for c in compare_runs(a, fast).conditions}
    assert cond[("load", "C=1 repeat 0 host's reference work")] == (
        "mean 3.00 ms (the slowest 2 left out), median 3.00 ms (18 runs)",
        "mean 2.40 ms (the slowest 2 left out), median 2.40 ms (18 runs)",
    )
    # CI's shape, mirrored: A ran on the slower host, B's terms are shorter by about as much
    slow_a = run_dir(tmp_path / "slow-a", seed=1, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=3.75)
    lv = compare_runs(slow_a, run_dir(tmp_path / "fast-b", seed=3, cpu_wait_ms=0.05, reference_ms=3.0)).levels[0]
    assert lv.term("compute").resolved and [t.name for t in lv.terms if t.changed] == [], lv.terms
    # not measured in one run (a remote server, an older run): no speed allowance, and the change stands
    cmp = compare_runs(run_dir(tmp_path / "a-none", seed=1, cpu_wait_ms=0.05), slow)
    assert cmp.levels[0].term("compute").changed and cmp.levels[0].reference_ms == [None, pytest.approx(3.75)]
    assert any("host's speed" in n and "not measured in A" in n for n in cmp.levels[0].notes), cmp.levels[0].notes


def test_a_shift_others_cpu_could_make_is_not_called_a_change(tmp_path):
    """Others' CPU on the server's machine (attribute's client reads /proc: the machine's busy time less the
    server's and its own) as the third allowance: an idle A/A here (2026-12-07) had B 1.18 ms per token faster
    (3.72 -> 2.55) with the ranks' CPU wait 0.49 ms per step apart and the reference work 1% apart, another
    test session beside A only. Compute 20% longer in B with others taking 30% of the machine in B and 5% in A
    (the speed and the wait unchanged) is possibly the host; 2 points apart is a change; others busier in A
    cannot hide B's slowdown; not measured in one run: the change stands, and a note says so."""
    kw = {"cpu_wait_ms": 0.05, "reference_ms": 3.0}
    a = run_dir(tmp_path / "a", seed=1, others_cpu_pct=5.0, **kw)
    busy_b = run_dir(tmp_path / "busy-b", seed=3, compute_us=3600.0, others_cpu_pct=30.0, **kw)
    lv = compare_runs(a, busy_b).levels[0]
    assert lv.others_cpu_pct == pytest.approx([5.0, 30.0])
    for name in ("per_token", "compute", "tok_per_s"):
        t = lv.term(name)
        assert t.resolved and t.host_load and not t.changed, t
    assert "others took 25.0 points more of the machine's CPU in B (A 5.0%, B 30.0%" in lv.term("compute").host_load
    assert "reference work" not in lv.term("compute").host_load and "CPU wait" not in lv.term("compute").host_load
    near = compare_runs(a, run_dir(tmp_path / "near", seed=3, compute_us=3600.0, others_cpu_pct=7.0, **kw))
    assert near.levels[0].term("compute").changed, near.levels[0].term("compute")
    busy_a = run_dir(tmp_path / "busy-a", seed=1, others_cpu_pct=30.0, **kw)
    slow_b = run_dir(tmp_path / "slow-b", seed=3, compute_us=3600.0, others_cpu_pct=5.0, **kw)
    assert compare_runs(busy_a, slow_b).levels[0].term("compute").changed
    cmp = compare_runs(run_dir(tmp_path / "a-none", seed=1, **kw), busy_b)
    assert cmp.levels[0].term("compute").changed
    assert any("others took on the server's machine was not measured in A" in n for n in cmp.levels[0].notes)
    cond = {(c.section, c.name): (c.a, c.b) for c in compare_runs(a, busy_b).conditions}
    assert cond[("load", "C=1 repeat 0 others' CPU")] == (
        "5.0% of the machine's CPU (steal 0.0%)",
        "30.0% of the machine's CPU (steal 0.0%)",
    )


def test_a_term_that_moves_with_the_wait_within_each_run_gets_that_slope_between_runs(tmp_path):
    """The failing A/A's shape (2026-12-07, this host: B 1.18 ms per token faster with the ranks' CPU wait 0.49
    ms per step lower; within one run's repeats the per-token time moved ~2.4 ms per ms of wait). Each run's
    three repeats move compute 2.4 ms per ms of wait; B's waits are 0.5 ms lower, its compute 1.2 ms: with
    the rule's 1 ms per ms that was a change, with the runs' own slope it may be the host. Where the repeats
    show no such slope (the wait flat within each run) the same 1.2 ms stays a change: the between-run
    difference, which the change itself may cause, never sets the slope."""
    from compare_synthetic import run_dir_repeats

    from tpcomm.compare.levels import wait_slopes

    def run(name, waits, flat=False, seed=7):
        comp = [3000.0 + (0 if flat else 2400.0 * (w - waits[0])) + (1.9 - waits[0]) * -2400.0 for w in waits]
        return run_dir_repeats(tmp_path / name, [5.0] * 3, seed=seed, compute_us=comp, cpu_wait_ms=waits)

    a, b = run("a", [1.90, 1.95, 2.00]), run("b", [1.40, 1.45, 1.50], seed=17)
    lv = compare_runs(a, b).levels[0]
    c = lv.term("compute")
    assert c.resolved and c.diff == pytest.approx(-1.2, abs=0.15), c
    assert not c.changed and "within each run's repeats this term moved with it by up to" in c.host_load, c
    assert [t.name for t in lv.terms if t.changed] == [], [(t.name, t.statement) for t in lv.terms if t.changed]
    from tpcomm.rundir.results import Attribution

    att = lambda p: [x for x in Attribution.from_json(json.loads((p / "attribution/summary.json").read_text())).levels]  # noqa: E731
    k = wait_slopes(att(a), att(b), -0.5)
    assert 2.2 <= k["compute"][0] <= 5.0 and 2.2 <= k["per_token"][0] <= 5.0, k
    assert "moved with it by up to" in c.host_load and "not bounded" not in c.host_load, c.host_load
    # the wait flat within each run (0.7 and 0.2: float noise, not an exact 0): no slope beyond 1, a change
    fa = run_dir_repeats(tmp_path / "fa", [5.0] * 3, seed=7, compute_us=[3000.0] * 3, cpu_wait_ms=[0.7] * 3)
    fb = run_dir_repeats(tmp_path / "fb", [5.0] * 3, seed=17, compute_us=[1800.0] * 3, cpu_wait_ms=[0.2] * 3)
    assert wait_slopes(att(fa), att(fb), -0.5) == {}
    assert compare_runs(fa, fb).levels[0].term("compute").changed
    # the wait moving within the runs by a sliver of the difference between them: no extrapolation either
    ta = run("ta", [1.900, 1.901, 1.902])
    tb = run("tb", [1.400, 1.401, 1.402], seed=17)
    assert wait_slopes(att(ta), att(tb), -0.5) == {}


def test_tp1_against_tp2_moves_the_collectives(tmp_path):
    """A TP 1 run has step records and no collectives: attribute splits it (transfer and wait exactly 0, the plan
    of TP 1 matched), and against TP 2 the collectives are resolved, positive, with the plan's bytes named."""
    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.tinymodel import TINY_CONFIG

    tp2 = run_dir(tmp_path / "tp2", seed=4)
    tp1 = tmp_path / "tp1"
    shutil.copytree(tp2, tp1)
    rd = RunDir(tp1, create=False)
    steps = rd.read_table(C.HOOK_STEPS)
    rd.write_table(C.HOOK_STEPS, steps[steps["rank"] == 0])
    rd.write_table(C.HOOK_COLLECTIVES, rd.read_table(C.HOOK_COLLECTIVES).iloc[0:0])
    rd.write_json(C.HOOK_STATUS, {"enabled": True, "ranks": [0], "model_config": TINY_CONFIG})
    att = analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": 64})
    lv = att.levels[0]
    assert lv.attributed and lv.per_token_ms.transfer == 0 and lv.per_token_ms.wait == 0
    assert att.conditions["tp"] == 1 and lv.collectives_per_step["match"] is True
    assert lv.collectives_per_step["planned_total"] == 0
    r2 = RunDir(tp2, create=False)
    r2.write_json(C.HOOK_STATUS, {"enabled": True, "ranks": [0, 1], "model_config": TINY_CONFIG})
    analyse_run_dir(r2, conditions={"model": "synthetic", "output_len": 64})
    cmp = compare_runs(tp1, tp2)
    lv = cmp.levels[0]
    for k in ("transfer", "wait", "collective"):
        t = lv.term(k)
        assert t.a == 0 and t.resolved and t.lo > 0, t
    planned = {c.name: (c.a, c.b) for c in cmp.conditions if c.section == "plan" and not c.same}
    assert planned["C=1 planned per step"][0] == "none" and "all_reduce tp 512 B" in planned["C=1 planned per step"][1]
    assert any(c.name == "tp" and (c.a, c.b) == (1, 2) for c in cmp.conditions)
    assert {s.match for s in lv.sites} == {"B only"}
    assert "collectives +" in cmp.verdict


def test_model_based_comparison_of_two_checkpoints():
    """INT4 against NVFP4 of Kimi-K2.5 (predict.json only): the same model with another checkpoint, compared
    model-based with the ranges over the input corners both share; the fitted MoE terms are named as fitted."""
    cmp = compare_runs(KIMI_INT4, KIMI_NVFP4)
    assert cmp.kind == "model-based" and cmp.levels == [] and cmp.model is not None
    m = cmp.model
    terms = {t.name: t for t in m.terms}
    # Every pair of corners at the same levels of the inputs both vary; NVFP4's fitted (fixed) MoE cost pairs
    # with INT4's low and high one.
    a, b = (json.loads((d / "predict.json").read_text())["range"]["corners"] for d in (KIMI_INT4, KIMI_NVFP4))
    assert m.corners == 2 * len(b) == len(a) * 2 * len(b) // len(a)
    assert (
        terms["collectives"].diff_ms == 0 and terms["collectives"].diff_low_ms == 0 == terms["collectives"].diff_high_ms
    )
    # The NVFP4 fit's extra term (predict holds the per-layer penalty at 0 and fits the bandwidth factor): absent
    # from INT4, and the largest difference.
    assert terms["moe_kernel_bandwidth"].a_ms == 0 and terms["moe_kernel_bandwidth"].diff_ms > 0.5
    head = terms["ms_per_token"]
    assert head.diff_low_ms <= head.diff_ms <= head.diff_high_ms and head.diff_ms > 0
    # NVFP4's fitted MoE term against INT4's assumed per-layer MoE range: slower at the central inputs, but where
    # INT4's assumed cost is high the two cross, and the comparison says it cannot order them there.
    if head.diff_low_ms < 0:
        assert "cannot say which is faster" in cmp.verdict and "moe_kernel_bandwidth" in cmp.verdict
    else:
        assert cmp.verdict.startswith("Model-based: B is") and "slower" in cmp.verdict
    assert any("fitted to measured" in n for n in m.notes)
    quant = next(c for c in cmp.conditions if c.name == "quantization")
    assert not quant.same and "INT4" in quant.a and "FP4" in quant.b
    same = compare_runs(KIMI_INT4, KIMI_INT4)
    assert "the same per-token time" in same.model.statement


def _cli(*args):
    return CliRunner().invoke(cli, ["compare", *map(str, args)])


def test_json_has_numbers_and_loads_back(synth):
    r = _cli(synth["a"], synth["slow"], "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    t = doc["levels"][0]["terms"][0]
    assert t["name"] == "per_token" and isinstance(t["diff"], float) and isinstance(t["lo"], float)
    assert isinstance(t["resolved"], bool) and isinstance(doc["levels"][0]["concurrency"], int)
    assert Comparison.from_json(doc).verdict == doc["verdict"]


def test_fail_if_slower_gates_only_a_resolved_slowdown(synth, tmp_path):
    slow = _cli(synth["a"], synth["slow"], "--fail-if-slower", "5")
    assert slow.exit_code == 1 and "slower per token than A at C=1 (resolved" in slow.output
    assert _cli(synth["a"], synth["slow"], "--fail-if-slower", "50").exit_code == 0  # slower, but by less than 50%
    assert _cli(synth["slow"], synth["a"], "--fail-if-slower", "5").exit_code == 0  # faster
    assert _cli(synth["a"], synth["a2"], "--fail-if-slower", "0").exit_code == 0  # not resolved
    nosteps = tmp_path / "nosteps"
    shutil.copytree(synth["a2"], nosteps)
    for f in ("attribution/steps_by_rank.parquet", "hook/collectives.parquet", "hook/steps.parquet"):
        (nosteps / f).unlink()
    r = _cli(synth["a"], nosteps, "--fail-if-slower", "5")
    assert r.exit_code == 2 and "cannot be judged" in r.output, r.output


def test_bad_input_is_one_line_exit_2(synth, tmp_path):
    other = tmp_path / "other-schema"
    shutil.copytree(synth["a2"], other)
    doc = json.loads((other / "attribution/summary.json").read_text())
    doc["schema_version"] = 1
    (other / "attribution/summary.json").write_text(json.dumps(doc))
    empty = tmp_path / "empty"
    empty.mkdir()
    bigger = tmp_path / "bigger"
    shutil.copytree(synth["a2"], bigger)
    RunDir(bigger, create=False).write_json(
        C.HOOK_STATUS, {"model_config": {"architectures": ["X"], "hidden_size": 512}}
    )
    smaller = tmp_path / "smaller"
    shutil.copytree(synth["a"], smaller)
    RunDir(smaller, create=False).write_json(
        C.HOOK_STATUS, {"model_config": {"architectures": ["X"], "hidden_size": 256}}
    )
    cases = [
        ((synth["a"], other), "written by an older tpcomm"),
        ((synth["a"], empty), "has no attribution"),
        ((synth["a"], tmp_path / "absent"), "does not exist"),
        ((smaller, bigger), "different models (hidden_size 256 vs 512)"),
        ((synth["a"], KIMI_INT4), "has no attribution"),
    ]
    for args, want in cases:
        p = subprocess.run(
            [sys.executable, "-m", "tpcomm.cli", "compare", *map(str, args)], capture_output=True, text=True
        )
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and want in lines[0], (want, p.stderr)
        assert "Traceback" not in p.stderr
    assert _cli(smaller, bigger, "--allow-different-models").exit_code == 0


def test_comparison_pdf_and_markdown_read_back(synth, tmp_path):
    import pdfplumber

    out = tmp_path / "cmp"
    r = _cli(synth["a"], synth["slow"], "--out", out)
    assert r.exit_code == 0, r.output
    cmp = Comparison.from_json(json.loads((out / "compare.json").read_text()))
    with pdfplumber.open(out / "compare.pdf") as pdf:
        text = "\n".join(p.extract_text() or "" for p in pdf.pages)
    flat = " ".join(text.split())
    assert " ".join(cmp.verdict.split())[:80] in flat
    lv = cmp.levels[0]
    comp = lv.term("compute")
    assert f"changed by +{comp.diff:.3f}"[:16] in flat or f"changed by +{comp.diff:.2f}" in flat
    for word in (
        "Per token, term by term: C=1",
        "collective transfer",
        "Collective sites",
        "Conditions that differ",
        "Method",
    ):
        assert word in flat, word
    md = (out / "compare.md").read_text()
    assert "| per-token time (engine) |" in md and "compare_figures/compare_terms.svg" in md
    assert (out / "compare_figures/compare_terms.svg").exists()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["commands"][-1]["command"] == "compare"


def test_levels_in_one_run_only_are_named(synth, tmp_path):
    extra = tmp_path / "extra"
    shutil.copytree(synth["a2"], extra)
    rd = RunDir(extra, create=False)
    doc = rd.read_json(C.ATTR_SUMMARY)
    lv = json.loads(json.dumps(doc["levels"][0]))
    lv.update(concurrency=4, attributed=False, note="not attributed: the test says so")
    doc["levels"].append(lv)
    rd.write_json(C.ATTR_SUMMARY, doc)
    cmp = compare_runs(synth["a"], extra)
    assert [lv.concurrency for lv in cmp.levels] == [1]
    assert cmp.only_in_b == ["C=4 (measured in B only)"]
    req = pd.read_parquet(extra / "load/requests.parquet")
    assert set(req["concurrency"]) == {1}


def test_demo_compare_says_why_it_did_not_run(tmp_path):
    """`tpcomm demo --compare` without the TP 2 run's attribution (server skipped): the TP 1 run and the
    comparison are not run, and say why (no server starts here; the full demo with --compare is `make
    demo-compare`)."""
    out = tmp_path / "demo"
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "demo", "--out", str(out), "--skip", "server,probe,replay", "--compare"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    stages = json.loads((out / "status.json").read_text())["demo"]["stages"]
    assert stages["tp1"] == stages["compare"] == "skipped"
    assert "tp1 and compare: not run (the TP 2 run has no attribution)" in p.stdout


def test_an_incomplete_level_is_named_and_not_compared(synth, tmp_path):
    """judge/complete.py's incomplete level (here: other traffic in the batch) describes something other than
    C streams: compare names it and neither compares it nor lets the verdict speak of it."""
    bad = tmp_path / "bad"
    shutil.copytree(synth["a2"], bad)
    rd = RunDir(bad, create=False)
    doc = rd.read_json(C.ATTR_SUMMARY)
    doc["levels"][0]["incomplete"] = "the batch held other traffic (the test says so)"
    rd.write_json(C.ATTR_SUMMARY, doc)
    cmp = compare_runs(synth["a"], bad)
    assert cmp.levels == [] and cmp.verdict_level is None, cmp.verdict
    assert cmp.only_in_b == ["C=1 repeat 0 (incomplete in B: the batch held other traffic (the test says so))"]
    assert "nothing to compare" in cmp.verdict


def test_collectives_that_appear_are_resolved_by_kind_where_windows_differ(tmp_path):
    """TP 1 (no collective call) against a TP-2 run whose three repeats' collectives cost 10, 50 and 300 us a step
    (a fast host's shared-memory all-reduce, moved by the host's load between windows; CI measured 0.05 ms a
    token with an interval of -0.02 to +0.11 ms): the collectives' sign is certain, so they are resolved, with
    their size's interval clipped at 0; the verdict says they are B's only. The per-token time stays judged by
    its interval."""
    from compare_synthetic import run_dir_repeats

    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.tinymodel import TINY_CONFIG

    tp1 = run_dir(tmp_path / "tp1", seed=4)
    rd = RunDir(tp1, create=False)
    steps = rd.read_table(C.HOOK_STEPS)
    rd.write_table(C.HOOK_STEPS, steps[steps["rank"] == 0])
    rd.write_table(C.HOOK_COLLECTIVES, rd.read_table(C.HOOK_COLLECTIVES).iloc[0:0])
    rd.write_json(C.HOOK_STATUS, {"enabled": True, "ranks": [0], "model_config": TINY_CONFIG})
    analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": 64})
    tp2 = run_dir_repeats(tmp_path / "tp2", [1.0, 5.0, 30.0])
    for a, b, kind in ((tp1, tp2, "appears"), (tp2, tp1, "disappears")):
        cmp = compare_runs(a, b)
        lv = cmp.levels[0]
        assert lv.between_repeats
        t = lv.term("transfer")
        # what the statistics alone say: the windows' spread puts 0 inside the interval of its size
        assert (t.lo == 0 or t.hi == 0) and t.hi - t.lo > abs(t.diff), t
        for k in ("transfer", "wait", "collective"):
            t = lv.term(k)
            assert t.kind == kind and t.resolved and t.changed, t
            assert (t.lo >= 0 and t.diff > 0) if kind == "appears" else (t.hi <= 0 and t.diff < 0), t
            assert "the sign is certain" in t.statement
        assert [t.name for t in lv.terms if t.kind] == ["transfer", "wait", "collective"]
        assert ("in B only: A made no collective call" if kind == "appears" else "in A only") in cmp.verdict
    doc = json.loads(json.dumps(cmp.to_json()))
    back = Comparison.from_json(doc)
    assert back.levels[0].term("transfer").kind == "disappears"
    doc["levels"][0]["terms"][2]["kind"] = "vanished"
    with pytest.raises(C.SchemaError, match=r"levels\[0\]\.terms\[2\]\.kind"):
        Comparison.from_json(doc)


def test_a_statistic_with_rare_jumps_does_not_widen_every_interval(tmp_path):
    """The recorded request-id run (C=1, 2, 4) against itself: at C=4 the closure's p50 delivery over 12 requests
    (46 distinct values in 4000 draws, rare jumps) once set the band's critical value to 13.4 for all ten
    statistics against 3.3 at C=1 and C=2. It now has its own draws' interval and c stays alike at every level;
    an A/A resolves nothing."""
    from tpcomm.analysis.attribution import analyse_run_dir

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests/data/attribute_request_ids_tp2", run)
    analyse_run_dir(RunDir(run, create=False))
    cmp = compare_runs(run, run)
    cs = {lv.concurrency: lv.critical_value for lv in cmp.levels}
    assert set(cs) == {1, 2, 4} and all(2.0 < c < 4.5 for c in cs.values()), cs
    c4 = next(lv for lv in cmp.levels if lv.concurrency == 4)
    assert "delivery (client - engine, p50) with tails unlike the others'" in c4.resampled, c4.resampled
    d = c4.term("delivery")
    assert d.lo < 0 < d.hi, d
    assert not any(t.resolved for lv in cmp.levels for t in lv.terms), [
        (lv.concurrency, t.name) for lv in cmp.levels for t in lv.terms if t.resolved
    ]


def test_a_multi_rank_run_with_no_collective_recorded_is_no_change_of_kind(tmp_path):
    """Two ranks whose steps were recorded but none of their collectives (calls that bypass the hook, or none
    sampled in the window: transfer and wait 0, no site): they made calls nobody timed, so against TP 2 this is
    not "A made no collective call"; the collectives are judged by their intervals alone."""
    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.tinymodel import TINY_CONFIG

    untimed = run_dir(tmp_path / "untimed", seed=4)
    rd = RunDir(untimed, create=False)
    rd.write_table(C.HOOK_COLLECTIVES, rd.read_table(C.HOOK_COLLECTIVES).iloc[0:0])
    rd.write_json(C.HOOK_STATUS, {"enabled": True, "ranks": [0, 1], "model_config": TINY_CONFIG})
    att = analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": 64, "tp": 2})
    lv = att.levels[0]
    assert lv.attributed and lv.per_token_ms.transfer == 0 and len(lv.by_rank) == 2 and not lv.top_sites
    tp2 = run_dir(tmp_path / "tp2", seed=5)
    cmp = compare_runs(untimed, tp2)
    assert [t.name for t in cmp.levels[0].terms if t.kind] == [], cmp.levels[0].terms
    assert "made no collective call" not in cmp.verdict


def test_at_one_sequence_per_step_tok_per_s_resolves_with_the_per_token_time(synth, tmp_path):
    """tok/s at C=1 is 1000 / the per-token time: the two resolve together, and tok/s's interval is the per-token
    time's mapped through 1000 / (A + d) - 1000 / A. Resampled each on its own they disagreed at the edge on a
    busy A/A (2026-12-07: per-token -0.77 to +0.023 ms not resolved, tok/s +2.7 to +168 resolved, called a
    change). Small compute shifts straddle the edge here: some resolved, some not, each consistent."""
    seen = set()
    for i, us in enumerate((3000.0, 3030.0, 3060.0, 3090.0, 3150.0, 3300.0)):
        b = run_dir(tmp_path / f"b{i}", seed=10 + i, compute_us=us)
        lv = compare_runs(synth["a"], b).levels[0]
        pt, tps = lv.term("per_token"), lv.term("tok_per_s")
        assert tps.resolved == pt.resolved, (us, pt, tps)
        pa = pt.a
        assert tps.lo == pytest.approx(1e3 / (pa + pt.hi) - 1e3 / pa) and tps.hi == pytest.approx(
            1e3 / (pa + pt.lo) - 1e3 / pa
        ), (us, pt, tps)
        seen.add(pt.resolved)
    assert seen == {True, False}, seen  # the edge was straddled: both outcomes met


def test_a_run_of_a_again_after_b_bounds_the_drift_between_runs(tmp_path):
    """`compare --again RUN_A2` (A, B, A again): what two runs of A's configuration differ by is the drift
    between runs, which no figure of the runs shows (an A/A across a restart here, 2026-12-07: 2.23 -> 1.95 ms
    per token, -12.6% and resolved, with the ranks' CPU wait 1.02 / 0.96 ms per step, the reference work 3%
    apart, others' CPU under 1%). Compute 20% longer in B with A again also 20% longer than A (the host drifted,
    nothing changed) is possibly the drift, named with A again's figure; A again within 1% of A leaves it a
    change; an A again of another configuration is refused in one line naming what differs; and without
    --again a resolved change says the drift between runs is not in the intervals."""
    from tpcomm.compare.tables import sections
    from tpcomm.compare.verdict import caveat
    from tpcomm.errors import InputError

    a = run_dir(tmp_path / "a", seed=1, cpu_wait_ms=0.05, reference_ms=3.0, others_cpu_pct=0.0)
    b = run_dir(tmp_path / "b", seed=3, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=3.0, others_cpu_pct=0.0)
    drifted = run_dir(
        tmp_path / "a2", seed=5, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=3.0, others_cpu_pct=0.0
    )
    cmp = compare_runs(a, b, run_again=drifted)
    lv = cmp.levels[0]
    assert lv.drift["compute"] == pytest.approx(lv.term("compute").diff, rel=0.1), (lv.drift, lv.term("compute"))
    for name in ("per_token", "compute", "tok_per_s"):
        t = lv.term(name)
        assert t.resolved and t.host_load and not t.changed, t
    assert "A run again after B differed from A by +0." in lv.term("compute").host_load
    assert "may be the drift between runs, not the change" in lv.term("compute").host_load
    assert "cannot be told from the drift between runs" in cmp.verdict and "B is" not in cmp.verdict, cmp.verdict
    assert cmp.run_again == str(drifted)
    text = " ".join(str(item[1]) for _, blocks in sections(cmp) for item in blocks if isinstance(item[1], str))
    assert f"A again (the drift between runs) = {drifted}" in text and "A again differed from A by +0." in text
    assert Comparison.from_json(json.loads(json.dumps(cmp.to_json()))).levels[0].drift == lv.drift
    back = Comparison.from_json(json.loads(json.dumps(cmp.to_json())))
    assert back.run_again == str(drifted) and back.levels[0].drift == lv.drift
    # the gate refuses to judge a slowdown the drift could be (exit 2), as it does the host's load
    with pytest.raises(InputError, match="cannot be judged: B is .* slower per token at C=1 .*A run again after B"):
        compare_runs(a, b, fail_if_slower=5, run_again=drifted)
    # a drift the other way counts as much (runs drift either way)
    down = run_dir(tmp_path / "a4", seed=5, compute_us=2300.0, cpu_wait_ms=0.05, reference_ms=3.0, others_cpu_pct=0.0)
    t = compare_runs(a, b, run_again=down).levels[0].term("compute")
    assert t.resolved and not t.changed and "differed from A by -0." in t.host_load, t
    # with the host's speed moving too, both are named, and the verdict says either
    slow = run_dir(tmp_path / "b2", seed=3, compute_us=3600.0, cpu_wait_ms=0.05, reference_ms=3.3, others_cpu_pct=0.0)
    cmp = compare_runs(a, slow, run_again=drifted)
    assert "may be the host's load or the drift between runs" in cmp.levels[0].term("compute").host_load
    assert "cannot be told from the host's load or the drift between runs" in cmp.verdict, cmp.verdict
    # B itself given as A again: refused
    with pytest.raises(InputError, match="is RUN_B itself"):
        compare_runs(a, b, run_again=b)
    # A again within 1% of A: the same B is a change, and says so
    steady = run_dir(tmp_path / "a3", seed=5, compute_us=3030.0, cpu_wait_ms=0.05, reference_ms=3.0, others_cpu_pct=0.0)
    cmp = compare_runs(a, b, run_again=steady)
    assert cmp.levels[0].term("compute").changed and cmp.verdict.startswith("At C=1: B is"), cmp.verdict
    # without --again: the change stands, and the caveat names the drift the intervals do not hold
    cmp = compare_runs(a, b)
    assert cmp.levels[0].drift is None and cmp.levels[0].term("compute").changed
    assert "one repeat each" in cmp.caveat  # one repeat per run: that caveat comes first
    lv = cmp.levels[0]
    lv.between_repeats = True  # as with --repeat 3 on both sides: then the drift is what the intervals lack
    assert "not the drift between runs minutes apart" in caveat(lv) and "`--again`" in caveat(lv)
    lv.drift = {"per_token": 0.0}
    assert caveat(lv) is None
    # an A again of another configuration: one line, naming what differs
    other = run_dir(tmp_path / "other", seed=5, output_len=32, cpu_wait_ms=0.05, reference_ms=3.0, others_cpu_pct=0.0)
    with pytest.raises(InputError, match=r"--again .*other: is not a run of A's configuration \(output_len 64 vs 32"):
        compare_runs(a, b, run_again=other)
    # the command line: --again reaches the comparison (JSON), and a wrong one is one line, exit 2
    r = CliRunner().invoke(cli, ["compare", str(a), str(b), "--again", str(drifted), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["run_again"] == str(drifted) and doc["levels"][0]["drift"]["compute"] > 0
    r = CliRunner().invoke(cli, ["compare", str(a), str(b), "--again", str(other)])
    assert r.exit_code == 2 and "is not a run of A's configuration" in r.output and "Traceback" not in r.output
