"""Fast tests of the attribution analysis: synthetic records with a known
answer (tpcomm.attribute.synthetic) and the steadiness / repeat checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpcomm.attribute.align import align, alignment_quality, instances
from tpcomm.attribute.crosscheck import compare, observed_per_step
from tpcomm.attribute.levels import level_figures, repeat_spread, steadiness
from tpcomm.attribute.split import assign_levels, decode_steps, host_overhead_ms, level_split, rank_steps
from tpcomm.attribute.synthetic import make_records


@pytest.fixture(scope="module")
def synth():
    return make_records(steps=200, tp=2, calls=10, seed=1)


def test_align_transfer_is_min_over_ranks_and_wait_is_the_rest(synth):
    coll, _, truth = synth
    a = align(coll)
    assert a["complete"].all()
    assert (a["wait_us"] >= -1e-9).all()
    inst = instances(a)
    assert len(inst) == 200 * 10
    # The synthetic instance ends together on all ranks: min duration = the transfer time.
    per_step = inst.groupby("step")["transfer_us"].sum().mean()
    assert per_step == pytest.approx(truth["transfer_us_per_step"], rel=0.01)
    # One rank of each instance (the last to arrive) waits for nobody.
    assert (a.groupby("instance")["wait_us"].min() < 1e-3).all()


def test_missing_rank_makes_instance_incomplete(synth):
    coll, _, _ = synth
    dropped = coll.drop(index=coll.index[(coll["rank"] == 1) & (coll["step"] == 5) & (coll["call_idx"] == 3)])
    a = align(dropped)
    bad = a[(a["step"] == 5) & (a["call_idx"] == 3)]
    assert len(bad) == 1 and not bad["complete"].any()
    assert bad["wait_us"].iloc[0] == 0  # not split: no partner to compare with
    q = alignment_quality(a)
    assert q["in_complete_instances_pct"] < 100


def test_mismatched_op_marks_instance_incomplete(synth):
    coll, _, _ = synth
    c = coll.copy()
    c.loc[(c["rank"] == 1) & (c["step"] == 7) & (c["call_idx"] == 0), "op"] = "all_gather"
    a = align(c)
    assert not a.loc[(a["step"] == 7) & (a["call_idx"] == 0), "complete"].any()


def test_step_split_sums_to_step_time(synth):
    coll, steps, _ = synth
    by_rank = rank_steps(align(coll), steps)
    total = by_rank["compute_us"] + by_rank["transfer_us"] + by_rank["wait_us"]
    assert np.allclose(total, by_rank["step_us"])
    assert (by_rank["compute_us"] > 0).all()
    assert (by_rank["n_collectives"] == 10).all()


def test_level_split_closure_and_host_overhead(synth):
    coll, steps, truth = synth
    ref = steps[steps["rank"] == 0]
    # Tokens reach the client 150 us after their step ends.
    tokens = pd.DataFrame({"request_id": 0, "concurrency": 1, "repeat": 0, "token_idx": np.arange(len(ref)),
                           "t_ns": ref["t_end_ns"].to_numpy() + 150_000})
    w = [{"concurrency": 1, "repeat": 0, "t_start_ns": int(steps["t_start_ns"].min()),
          "t_end_ns": int(steps["t_end_ns"].max()) + 200_000}]
    a = align(coll)
    by_rank = assign_levels(rank_steps(a, steps), w)
    d = decode_steps(by_rank)
    assert len(d) == 200
    host = host_overhead_ms(tokens, by_rank[by_rank["rank"] == 0])
    itl = np.diff(tokens["t_ns"]) / 1e6
    # ITL = previous step end -> this step end = gap + this step: host = ITL - step = inter-step gap (500 us).
    assert np.median(host) == pytest.approx(0.5, abs=0.02)
    assert np.mean(host) == pytest.approx(0.5, abs=0.02)
    sp = level_split(d, assign_levels(a, w), tokens, by_rank[by_rank["rank"] == 0], float(np.median(itl)))
    assert abs(sp["closure_pct"]) < 5
    assert sp["per_token_ms"]["transfer"] * 1e3 == pytest.approx(truth["transfer_us_per_step"], rel=0.05)
    assert sp["comm_only_tok_per_s"] > sp["compute_only_tok_per_s"]
    top = sp["top_sites"][0]
    assert top["op"] == "all_reduce" and top["count_per_step"] == pytest.approx(9)


def test_crosscheck_reports_mismatch_with_detail(synth):
    coll, steps, _ = synth
    a = align(coll)
    d = decode_steps(assign_levels(rank_steps(a, steps), [{"concurrency": 1, "repeat": 0, "t_start_ns": 0,
                                                            "t_end_ns": 2**62}]))
    obs = observed_per_step(a, d)
    assert obs["share"] == 1.0 and obs["batch"] == 1
    planned = {("tp", "all_reduce", 512): 9, ("tp", "all_gather", 2048): 1}
    assert compare(obs, planned, "plan")["match"] is True
    wrong = {("tp", "all_reduce", 512): 8, ("tp", "gather", 2048): 1}
    doc = compare(obs, wrong, "plan")
    assert doc["match"] is False
    assert "observed 9/step, planned 8/step" in doc["detail"] and "gather" in doc["detail"]
    assert compare(obs, None, "no config")["match"] is None


def _rows(starts_ms, dur_ms, tokens_per=8):
    rows, toks = [], []
    for i, (s, d) in enumerate(zip(starts_ms, dur_ms)):
        t0 = int(s * 1e6)
        ts = [t0 + int((j + 1) * d / tokens_per * 1e6) for j in range(tokens_per)]
        rows.append({"request_id": i, "ok": True, "t_start_ns": t0, "t_end_ns": ts[-1], "output_tokens": tokens_per,
                     "ttft_ms": d / tokens_per, "tpot_ms": d / tokens_per, "e2e_ms": d})
        toks += [{"request_id": i, "token_idx": j, "t_ns": t} for j, t in enumerate(ts)]
    return pd.DataFrame(rows), pd.DataFrame(toks)


def test_steadiness_flags_a_slowdown():
    steady_rows, steady_toks = _rows([0, 80, 160, 240, 320, 400], [80] * 6)
    ok, note = steadiness(steady_rows, steady_toks, 1, 10)
    assert ok is True, note
    slow_rows, slow_toks = _rows([0, 80, 160, 240, 400, 560], [80, 80, 80, 160, 160, 160])
    ok, note = steadiness(slow_rows, slow_toks, 1, 10)
    assert ok is False and "token rate" in note
    f = level_figures(slow_rows, slow_toks)
    assert f["requests"] == 6 and f["failed"] == 0 and f["output_tok_per_s"] > 0


def test_repeat_spread_flags_the_464_vs_800_case():
    levels = [{"concurrency": 32, "repeat": 0, "output_tok_per_s": 799.9, "flags": []},
              {"concurrency": 32, "repeat": 1, "output_tok_per_s": 464.0, "flags": []},
              {"concurrency": 1, "repeat": 0, "output_tok_per_s": 61.3, "flags": []},
              {"concurrency": 1, "repeat": 1, "output_tok_per_s": 62.0, "flags": []}]
    repeat_spread(levels, 10)
    assert levels[0]["repeat_spread_pct"] > 50 and levels[0]["flags"]
    assert levels[2]["repeat_spread_pct"] < 10 and not levels[2]["flags"]
