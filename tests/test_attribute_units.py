"""Fast tests of the attribution analysis: synthetic records with a known
answer (tpcomm.attribute.synthetic) and the steadiness / repeat checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpcomm.attribute.align import align, alignment_quality, instances
from tpcomm.attribute.closure import (
    client_side,
    closure,
    closure_text,
    delivery,
    delivery_cell,
    delivery_text,
    median_interval,
)
from tpcomm.attribute.crosscheck import compare, observed_per_step
from tpcomm.attribute.levels import level_figures, repeat_spread, steadiness
from tpcomm.attribute.split import assign_levels, decode_steps, engine_split, rank_steps, top_sites
from tpcomm.attribute.synthetic import make_client, make_records


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


def _split(coll, steps):
    return engine_split(rank_steps(align(coll), steps).assign(concurrency=1, repeat=0))


def _assert_adds_up(sp):
    total = sp["engine_ms_per_token"]
    assert sum(sp["per_token_ms"].values()) == pytest.approx(total, rel=1e-9)
    for r in sp["by_rank"]:  # every rank's own terms add up to its own mean period
        assert sum(r["per_token_ms"].values()) == pytest.approx(r["period_ms"], rel=1e-9)


def test_engine_split_equals_the_known_answer_and_adds_up(synth):
    coll, steps, truth = synth
    sp = _split(coll, steps)
    _assert_adds_up(sp)
    assert sp["engine_ms_per_token"] * 1e3 == pytest.approx(truth["period_us"], rel=1e-6)
    for k, t in (("compute", "compute_us"), ("transfer", "transfer_us"), ("wait", "wait_us"), ("host_gap", "gap_us")):
        assert sp["per_token_ms"][k] * 1e3 == pytest.approx(truth[t], rel=1e-3), k
    assert sum(sp["shares_pct"].values()) == pytest.approx(100)
    assert sp["decode_pairs"] == 199 and sp["sampled_pairs_share"] == 1.0
    assert sp["comm_only_tok_per_s"] > sp["compute_only_tok_per_s"]
    top = top_sites(align(coll), decode_steps(rank_steps(align(coll), steps).assign(concurrency=1, repeat=0)))[0]
    assert top["op"] == "all_reduce" and top["count_per_step"] == pytest.approx(9)


def test_skew_lands_in_wait_not_in_transfer():
    base = _split(*make_records(steps=300, skew_us=0.0, seed=3)[:2])
    skewed_coll, skewed_steps, truth = make_records(steps=300, skew_us=2000.0, seed=3)
    sk = _split(skewed_coll, skewed_steps)
    _assert_adds_up(sk)
    # Same transfer draws: the transfer term does not move; the added skew shows up as wait.
    assert sk["per_token_ms"]["transfer"] == pytest.approx(base["per_token_ms"]["transfer"], rel=1e-3)
    assert sk["per_token_ms"]["wait"] > base["per_token_ms"]["wait"] + 0.2  # mean |U1 - U2| / 2 x 10 calls = 0.33 ms
    assert sk["per_token_ms"]["wait"] * 1e3 == pytest.approx(truth["wait_us"], rel=1e-3)


def test_prefill_steps_and_idle_time_stay_out_of_the_decode_split():
    coll, steps, truth = make_records(steps=660, prefill_every=33, idle_us=50_000, seed=2)
    sp = _split(coll, steps)
    _assert_adds_up(sp)
    # Prefill steps are 8x longer and follow a 50 ms idle gap: had either entered, the period would be far off.
    assert sp["engine_ms_per_token"] * 1e3 == pytest.approx(truth["period_us"], rel=1e-6)
    assert sp["per_token_ms"]["host_gap"] * 1e3 == pytest.approx(truth["gap_us"], rel=1e-3)
    assert sp["steps_in_window"] == {"decode": 640, "prefill": 20}
    assert sp["decode_pairs"] == 660 - 2 * 20


def test_sampled_graph_steps_equal_the_fully_recorded_split():
    full_c, st, _ = make_records(steps=2000, prefill_every=50, seed=4)
    samp_c, st2, _ = make_records(steps=2000, prefill_every=50, seed=4, sample_every=8)
    assert samp_c["step"].nunique() * 8 == pytest.approx(full_c["step"].nunique(), abs=8)
    full, samp = _split(full_c, st), _split(samp_c, st2)
    _assert_adds_up(samp)
    total = full["engine_ms_per_token"]
    assert samp["engine_ms_per_token"] == pytest.approx(total, rel=1e-9)
    for k in ("compute", "transfer", "wait", "host_gap"):  # within 1% of the per-token time
        assert abs(samp["per_token_ms"][k] - full["per_token_ms"][k]) <= 0.01 * total, k
    assert samp["sampled_pairs_share"] == pytest.approx(1 / 8, abs=0.02)
    # Unrecorded steps averaged in as zeros would have cut transfer to about 1/8.
    assert samp["per_token_ms"]["transfer"] > 0.9 * full["per_token_ms"]["transfer"]


def test_client_side_bursts_change_no_engine_term_and_close():
    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=5)
    sp = _split(coll, steps)
    for burst in (1, 6):
        req, tok = make_client(steps, burst=burst)
        cs = client_side(req, tok, sp["engine_ms_per_token"], 1)
        assert cs["stalls"]["count"] == 0, burst
        # Bursts move token arrivals inside a request, not its first and last token: TPOT and closure hold.
        assert cs["closure"]["judged"] and cs["closure"]["ok"], (burst, cs["closure"])
        cz = cs["closure"]
        assert cs["delivery_ms"] == pytest.approx(cz["client_tpot_ms_p50"] - cz["engine_tpot_ms"])
        # A fixed delay per token moves a request's first and last token alike: TPOT, and so delivery, keep
        # nothing of it; what is left is smaller than a tenth of the 150 us delay.
        assert abs(cs["delivery_ms"]) < 0.015, cs["delivery"]
    assert cs["client"]["itl_ms_p50"] < 0.2 * cs["client"]["tpot_ms_p50"]  # bursty: ITL p50 says nothing


def test_median_interval_is_the_order_statistics_with_binomial_coverage():
    x = [float(v) for v in (9, 1, 11, 5, 3, 12, 7, 2, 10, 4, 8, 6)]  # 1..12 shuffled
    # n = 12: P(Bin(12, 1/2) <= 2) = 79/4096, so [x_(3), x_(10)] covers 1 - 158/4096; j = 4 would cover 85%.
    assert median_interval(x) == (3.0, 10.0, pytest.approx(1 - 158 / 4096))
    # Under six values no interval reaches 95%: the whole range, with the coverage it has (1 - 2/32).
    assert median_interval([4.0, 1.0, 3.0, 2.0, 5.0]) == (1.0, 5.0, pytest.approx(0.9375))
    assert median_interval([]) is None and median_interval([float("nan")]) is None
    # Exact past 2.0**1024 (a float overflow): 5000 values, the interval a few dozen ranks either side of the middle.
    lo, hi, cov = median_interval([float(v) for v in range(5000)])
    assert 0.95 <= cov < 0.96 and lo == 4999 - hi and 2400 < lo < 2440


def test_delivery_is_signed_only_when_its_interval_excludes_zero():
    from tpcomm.report.verdict import fmt

    spread = [5.0 + 0.1 * k for k in range(-6, 6)]  # 4.4 .. 5.5 ms around an engine at 5.0 ms
    d = delivery(spread, 5.0)
    assert d["lo_ms"] < 0 < d["hi_ms"] and not d["resolved"] and d["requests"] == 12
    text = delivery_text(d, fmt)
    assert text.startswith("not separable from zero (") and "96% interval" in text and "over 12 requests" in text
    assert delivery_cell(d, fmt).startswith("n.s. (")
    late = delivery([5.4 + 0.01 * k for k in range(12)], 5.0)  # every request 0.4-0.51 ms slower than the engine
    assert late["resolved"] and late["lo_ms"] > 0
    assert delivery_text(late, fmt).startswith(f"{fmt(late['ms'])} ms (96% interval") and delivery_cell(
        late, fmt
    ) == fmt(late["ms"])
    assert delivery([], 5.0) is None and delivery(spread, None) is None
    # Five requests all 0.4 ms late: the range excludes 0 but covers 93.75%, short of the 95% asked.
    few = delivery([5.4, 5.41, 5.42, 5.43, 5.44, float("nan")], 5.0)  # a non-finite value is no request
    assert not few["resolved"] and few["lo_ms"] > 0 and few["requests"] == 5
    assert delivery_cell(few, fmt).startswith("n.r. (")
    assert delivery_text(few, fmt).startswith("not resolved with 5 requests (") and "93% interval" in delivery_text(
        few, fmt
    )


def test_client_stall_is_reported_apart_and_enters_no_term():
    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=6)
    sp = _split(coll, steps)
    req, tok = make_client(steps, stall=[(3, 10, 1100.0)])
    cs = client_side(req, tok, sp["engine_ms_per_token"], 1)
    st = cs["stalls"]
    assert st["count"] == 1 and st["requests"] == [3] and st["gaps"][0]["token_idx"] == 10
    assert st["total_ms"] == pytest.approx(1100, abs=2)
    assert cs["closure"]["ok"]  # one stalled request of 20 does not move the TPOT p50
    # A closure that fails says so with both numbers and the stall, and names no cause.
    e = sp["engine_ms_per_token"]
    doc = {"concurrency": 1, "repeat": 0, "closure": closure(e, 2 * e, 1), "stalls": st}
    text = closure_text(doc)
    assert doc["closure"]["ok"] is False and "-50.0%" in text and "request(s) 3" in text
    assert "because" not in text and "cause" not in text
    assert closure(1.0, 1.05, 2)["judged"] is False and closure(1.0, 1.05, 2)["ok"] is None


def test_stalled_requests_stay_out_of_the_figure_the_split_is_held_to():
    """Half the requests stalled ~1.1 s near their end (a starved API server, as in the demo at C=4): the plain
    TPOT p50 moves far from the engine's time, the held TPOT p50 of the requests without a stall does not,
    and the closure compares with that one (the stalls are counted apart, as before)."""
    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=6)
    sp = _split(coll, steps)
    req, tok = make_client(steps, stall=[(r, 25, 1100.0) for r in range(0, 20, 2)])
    cs = client_side(req, tok, sp["engine_ms_per_token"], 1)
    e, cl = sp["engine_ms_per_token"], cs["client"]
    assert cs["stalls"]["count"] == 10 and cl["stalled_requests"] == 10
    assert cl["tpot_ms_p50"] > 1.5 * e  # the stalls move the plain p50 (half the requests carry one)
    assert cl["tpot_judged_ms_p50"] == pytest.approx(e, rel=0.1)
    assert cs["closure"]["client_tpot_ms_p50"] == cl["tpot_judged_ms_p50"] and cs["closure"]["ok"]


def test_crosscheck_reports_mismatch_with_detail(synth):
    coll, steps, _ = synth
    a = align(coll)
    d = decode_steps(
        assign_levels(rank_steps(a, steps), [{"concurrency": 1, "repeat": 0, "t_start_ns": 0, "t_end_ns": 2**62}])
    )
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
        rows.append(
            {
                "request_id": i,
                "ok": True,
                "t_start_ns": t0,
                "t_end_ns": ts[-1],
                "output_tokens": tokens_per,
                "ttft_ms": d / tokens_per,
                "tpot_ms": d / tokens_per,
                "e2e_ms": d,
            }
        )
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
    levels = [
        {"concurrency": 32, "repeat": 0, "output_tok_per_s": 799.9, "flags": []},
        {"concurrency": 32, "repeat": 1, "output_tok_per_s": 464.0, "flags": []},
        {"concurrency": 1, "repeat": 0, "output_tok_per_s": 61.3, "flags": []},
        {"concurrency": 1, "repeat": 1, "output_tok_per_s": 62.0, "flags": []},
    ]
    repeat_spread(levels, 10)
    assert levels[0]["repeat_spread_pct"] > 50 and levels[0]["flags"]
    assert levels[2]["repeat_spread_pct"] < 10 and not levels[2]["flags"]


def test_held_tpot_is_not_shrunk_by_a_burst_that_holds_the_first_tokens():
    """A starved API server can hold a stream's first tokens and deliver all of them at the end: plain TPOT
    then drops towards 0 (0.15 ms against a 3.6 ms engine period was seen); the held TPOT keeps E2E's truth."""
    import pandas as pd

    from tpcomm.attribute.closure import closure, held_tpot_ms

    # 32 tokens, engine period 5 ms, prefill 10 ms; request 1 delivered normally, requests 2-3 in one burst at the end.
    req = pd.DataFrame(
        {"ttft_ms": [10.0, 160.0, 161.0], "e2e_ms": [165.0, 166.0, 167.0], "output_tokens": [32, 32, 32]}
    )
    plain = (req["e2e_ms"] - req["ttft_ms"]) / 31
    held = held_tpot_ms(req)
    assert plain.median() < 0.3
    assert held.tolist() == pytest.approx([5.0, 5.032, 5.065], abs=1e-3)
    assert closure(5.0, float(pd.Series(held).median()), 1)["ok"] is True
    assert closure(5.0, float(plain.median()), 1)["ok"] is False
    # Unstarved: the same as TPOT within the TTFT spread / (tokens - 1).
    calm = pd.DataFrame({"ttft_ms": [10.0, 10.5, 11.0], "e2e_ms": [165.0, 165.5, 166.0], "output_tokens": [32] * 3})
    assert held_tpot_ms(calm) == pytest.approx(((calm["e2e_ms"] - calm["ttft_ms"]) / 31).to_numpy(), abs=0.04)


def test_closure_puts_the_engine_on_tpot_footing():
    """A client's TPOT spans the prefill-to-first-decode interval once per request; the engine's per-token time
    (decode-to-decode periods) does not. The closure adds it on the engine's side, from the engine's clock."""
    from tpcomm.attribute.closure import closure, engine_tpot_ms

    # 32 tokens: a 20 ms first interval, then 3.6 ms per token; the client's TPOT is (20 + 30 x 3.6) / 31.
    tpot = (20 + 30 * 3.6) / 31
    assert engine_tpot_ms(3.6, 20.0, 32) == pytest.approx(tpot)
    assert closure(3.6, tpot, 1)["ok"] is False  # the bare per-token time is 12.8% short ...
    c = closure(3.6, tpot, 1, engine_tpot_ms(3.6, 20.0, 32))  # ... on TPOT's footing it closes
    assert c["ok"] is True and c["diff_pct"] == pytest.approx(0) and c["engine_ms_per_token"] == 3.6
    assert engine_tpot_ms(3.6, None, 32) == 3.6 and engine_tpot_ms(3.6, 15.0, 2) == 3.6
