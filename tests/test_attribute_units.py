"""Fast tests of the attribution analysis: synthetic records with a known
answer (tpcomm.analysis.synthetic) and the steadiness / repeat checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpcomm.analysis.align import align, alignment_quality, instances
from tpcomm.analysis.attribution import client_side
from tpcomm.analysis.closure import STALLED, closure_text, delivery, delivery_text, median_interval
from tpcomm.analysis.crosscheck import compare, observed_per_step
from tpcomm.analysis.split import assign_levels, decode_steps, engine_split, rank_steps, shares_pct, top_sites
from tpcomm.analysis.synthetic import make_client, make_records
from tpcomm.attribute.levels import level_figures, repeat_spread, steadiness
from tpcomm.columns import delivery_cell, fmt


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
    assert sum(shares_pct(sp["per_token_ms"], sp["engine_ms_per_token"]).values()) == pytest.approx(100, abs=1e-9)
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
    assert sp["decode_pairs"] == 640  # every decode step: each has the step before it (its prefill or a decode)


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


def _rows1(coll, steps):
    return rank_steps(align(coll), steps).assign(concurrency=1, repeat=0)


def test_client_side_bursts_change_no_engine_term_and_close():
    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=5)
    rows = _rows1(coll, steps)
    for burst in (1, 6):
        req, tok = make_client(steps, burst=burst)
        cs = client_side(rows, req, tok, 1)
        assert cs["stalls"].count == 0, burst
        # Every request paired with its own prefill segment, each compared: the closure is judged and holds.
        cz = cs["closure"]
        assert cz.pairing == "prefill segments" and cz.requests == 20 and cz.excluded == {}, (burst, cz)
        assert cz.judged and cz.ok and abs(cz.diff_pct) < 0.5, (burst, cz)
        # A fixed delay per token (150 us) cancels in each request's difference: delivery keeps none of it.
        assert abs(cs["delivery"].ms) < 0.015, cs["delivery"]
        # The headline rests on the compared requests' decode steps: all of them here, so the known answer.
        assert cs["split"]["engine_ms_per_token"] * 1e3 == pytest.approx(truth["period_us"], rel=1e-6)
    assert cs["client"].itl_ms_p50 < 0.2 * cs["client"].tpot_ms_p50  # bursty: ITL p50 says nothing


def test_closure_fails_when_the_client_saw_another_pace():
    """Client tokens 30% further apart than the engine made them (an engine clock that runs slow, or steps the
    hook did not see): the closure is judged, fails, and says so with both numbers and no cause."""
    coll, steps, _ = make_records(steps=660, prefill_every=33, seed=7)
    req, tok = make_client(steps)
    first = tok.groupby("request_id")["t_ns"].transform("min")
    tok = tok.assign(t_ns=(first + (tok["t_ns"] - first) * 1.3).astype("int64"))
    cs = client_side(_rows1(coll, steps), req, tok, 1)
    cz = cs["closure"]
    assert cz.judged and cz.ok is False and cz.diff_pct == pytest.approx(-100 * 0.3 / 1.3, abs=0.5)
    text = closure_text(1, 0, cz, cs["stalls"])
    assert f"{cz.diff_pct:+.1f}%" in text and f"{cz.engine_ms:.2f} ms" in text and "cause" not in text
    assert cs["delivery"].resolved and cs["delivery"].lo_ms > 0  # every request slower at the client


def test_a_held_stream_is_compared_on_neither_side():
    """A starved API server held request 4 back whole (all its tokens in one burst at its end): its TPOT
    (0 ms) observes nothing. It is named and left out of both sides; the others still close."""
    coll, steps, _ = make_records(steps=660, prefill_every=33, seed=8)
    req, tok = make_client(steps)
    m = tok["request_id"] == 4
    tok.loc[m, "t_ns"] = tok.loc[m, "t_ns"].max()
    cs = client_side(_rows1(coll, steps), req, tok, 1)
    cz = cs["closure"]
    assert cz.excluded == {"held back (nearly) whole by the API server": [4]} and cz.requests == 19
    assert cz.ok and cs["client"].held_requests == [4]


def test_unpaired_requests_are_named_and_the_closure_not_judged_without_enough():
    coll, steps, _ = make_records(steps=660, prefill_every=33, seed=9)
    req, tok = make_client(steps)
    # One request too many for the prefill steps recorded: the pairing refuses to guess.
    extra = req.iloc[[0]].assign(request_id=99, t_start_ns=req["t_start_ns"].max() + 1)
    cs = client_side(_rows1(coll, steps), pd.concat([req, extra]), tok, 1)
    assert not cs["closure"].judged and "20 prefill steps" in cs["closure"].why_not_judged
    # ... and names the request whose send-to-first-token span holds no prefill step, with the nearest one
    assert "request 99: 0 (the nearest ends" in cs["closure"].why_not_judged, cs["closure"].why_not_judged
    # Three requests only: compared, not judged.
    few = client_side(_rows1(coll, steps), req[req["request_id"] < 3], tok[tok["request_id"] < 3], 1)
    assert few["closure"].why_not_judged is not None and few["closure"].judged is False


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


def test_median_interval_above_a_thousand_values_agrees_with_the_exact_walk():
    """Past EXACT_INTERVAL_N the coverage is summed in float64 (linear in n; the exact walk grew as n squared and
    would not end on the clock estimate's millions of instances): the same order statistic as the exact integer
    walk, its coverage within 1e-9, on every n where the walk is still quick (and where j steps up)."""
    from tpcomm.analysis.closure import EXACT_INTERVAL_N, _order_statistic, _order_statistic_exact

    for n in [*range(6, 80), *range(EXACT_INTERVAL_N - 5, 3001, 3), 4001]:
        (j, cov), (jf, covf) = _order_statistic_exact(n), _order_statistic(n)
        assert j == jf and covf == pytest.approx(cov, abs=1e-9), (n, j, jf, cov, covf)
    # Through median_interval itself, above the threshold: the interval around the middle of 0..n-1.
    n = 200_001
    lo, hi, cov = median_interval(np.arange(n, dtype=float)[::-1])
    j, cov_f = _order_statistic(n)
    assert (lo, hi, cov) == (j - 1, n - j, cov_f) and 0.95 <= cov < 0.951 and (n - 1) / 2 - 500 < lo < (n - 1) / 2


def test_delivery_is_signed_only_when_its_interval_excludes_zero():
    spread = [0.1 * k for k in range(-6, 6)]  # client - engine, -0.6 .. 0.5 ms
    d = delivery(spread)
    assert d.lo_ms < 0 < d.hi_ms and not d.resolved and d.requests == 12
    text = delivery_text(d, fmt)
    assert text.startswith("not separable from zero (") and "96% interval" in text and "over 12 requests" in text
    assert delivery_cell(d, fmt).startswith("n.s. (")
    late = delivery([0.4 + 0.01 * k for k in range(12)])  # every request 0.4-0.51 ms slower than the engine
    assert late.resolved and late.lo_ms > 0
    assert delivery_text(late, fmt).startswith(f"{fmt(late.ms)} ms (96% interval")
    assert delivery_cell(late, fmt) == fmt(late.ms)
    assert delivery([]) is None
    # Five requests all 0.4 ms late: the range excludes 0 but covers 93.75%, short of the 95% asked.
    few = delivery([0.4, 0.41, 0.42, 0.43, 0.44, float("nan")])  # a non-finite value is no request
    assert not few.resolved and few.lo_ms > 0 and few.requests == 5
    assert delivery_cell(few, fmt).startswith("n.r. (")
    assert delivery_text(few, fmt).startswith("not resolved with 5 requests (") and "93% interval" in delivery_text(
        few, fmt
    )


def test_client_stall_is_reported_apart_and_enters_no_term():
    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=6)
    req, tok = make_client(steps, stall=[(3, 10, 1100.0)])
    cs = client_side(_rows1(coll, steps), req, tok, 1)
    st = cs["stalls"]
    assert st.count == 1 and st.requests == [3] and st.total_ms == pytest.approx(1100, abs=2)
    assert [(g.request_id, g.token_idx) for g in st.gaps] == [(3, 10)] and st.gaps[0].gap_ms == pytest.approx(
        1100, abs=2
    )
    # The stall at token 10 of 32 held back the rest of the request: its window holds most of its tokens.
    assert cs["closure"].excluded == {STALLED: [3]}
    assert cs["closure"].ok and cs["closure"].requests == 19


def test_stall_windows_stay_out_of_both_sides_of_the_closure():
    """Half the requests stalled ~1.1 s near their end (a starved API server, as in the demo at C=4), the
    tokens made meanwhile released in one burst: the plain TPOT p50 moves far from the engine's time; the
    closure compares every request over the tokens outside the stall windows, on both sides, and holds.
    Over whole spans, the stalled half would carry the stall."""
    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=6)
    req, tok = make_client(steps, stall=[(r, 25, 1100.0) for r in range(0, 20, 2)])
    cs = client_side(_rows1(coll, steps), req, tok, 1)
    e, cl, cz = cs["whole"]["engine_ms_per_token"], cs["client"], cs["closure"]
    assert cs["stalls"].count == 10 and cl.stalled_requests == list(range(0, 20, 2))
    assert cl.tpot_ms_p50 > 1.5 * e  # the stalls move the plain p50 (half the requests carry one)
    assert cz.requests == 20 and cz.excluded == {} and cz.client_ms == pytest.approx(e, rel=0.05) and cz.ok
    assert "10 stall windows (80 tokens) left out of both sides" in cz.statistic, cz.statistic
    p = cs["pairs"].set_index("request_id")
    assert (p.loc[0:19:2, "client_ms_span"] > 3 * p.loc[0:19:2, "engine_ms_span"]).all()


def test_a_stall_just_before_the_last_burst_leaves_the_closure_alone():
    """A pattern like CI's failure of 2026-12-01 (-12.6%, five ~1 s stalls in 8 requests): the client's reading
    stops ~1 s late in most requests and the tokens made meanwhile arrive in one last burst. Over whole spans
    the client's figure carries the wait; with the stall windows out of both sides, client and engine agree."""
    coll, steps, _ = make_records(steps=660, prefill_every=33, seed=11)
    req, tok = make_client(steps, stall=[(r, 30, 1000.0) for r in range(0, 20) if r % 3])
    cs = client_side(_rows1(coll, steps), req, tok, 1)
    cz = cs["closure"]
    assert cz.judged and cz.ok and abs(cz.diff_pct) < 1 and cz.requests == 20 and cz.excluded == {}, cz
    assert "13 stall windows" in cz.statistic, cz.statistic


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


def test_empty_steps_between_decode_steps_keep_them_consecutive():
    """PP's batch queue runs an empty step per stage slot (the hook records it as kind "empty"): decode steps
    separated only by recorded empty steps are consecutive, and the empty step's time is in the period; a step
    number missing from the records (dropped, not known empty) breaks the pair."""
    from tpcomm.analysis.split import decode_pairs

    kinds = ["decode", "empty", "decode", "empty", "decode", "decode"]
    steps = [10, 11, 12, 13, 14, 16]  # 15 not recorded
    rows = pd.DataFrame(
        {
            "rank": 0,
            "step": steps,
            "kind": kinds,
            "t_start_ns": [s * 1_000_000 for s in steps],
            "t_end_ns": [s * 1_000_000 + 400_000 for s in steps],
        }
    )
    p = decode_pairs(rows)
    assert p["step"].tolist() == [12, 14] and p["period_us"].tolist() == [2000.0, 2000.0]
    assert p["gap_us"].tolist() == [1600.0, 1600.0]


def test_speculative_decoding_gives_the_split_per_accepted_token_at_c1():
    """Decode steps that schedule 3 draft tokens per sequence and emit 2 tokens each (1 accepted draft): the
    level says so, and at C=1 the client's tokens over each request's own decode steps give 2.00 tokens per
    step, so the split per accepted token is the per-step split halved, its terms adding up to it. Above C=1:
    the drafts stated, the tokens per step not measured, and why. Without drafts: nothing said."""
    from tpcomm.analysis import specdecode

    coll, steps, truth = make_records(steps=660, prefill_every=33, seed=11)
    plain_rows = _rows1(coll, steps)
    assert specdecode.spec_decode(plain_rows, pd.DataFrame(), pd.DataFrame(), 1, {}) is None
    steps = steps.assign(num_tokens=np.where(steps["kind"] == "decode", 4, steps["num_tokens"]).astype(np.int32))
    rows = _rows1(coll, steps)
    req, tok = make_client(steps)
    req = req.assign(output_tokens=1 + 2 * (req["output_tokens"] - 1))  # every decode step's chunk held 2 tokens
    cs = client_side(rows, req, tok, 1)
    sd = specdecode.spec_decode(rows, cs["pairs"], req, 1, cs["split"])
    assert sd is not None and sd.drafts_per_seq == pytest.approx(3.0) and sd.requests == 20, sd
    assert sd.tokens_per_step == pytest.approx(2.0)
    assert sd.engine_ms_per_token == pytest.approx(cs["split"]["engine_ms_per_token"] / 2, rel=1e-9)
    assert sd.engine_ms_per_token * 1e3 == pytest.approx(truth["period_us"] / 2, rel=1e-6)
    assert sd.per_token_ms.total == pytest.approx(sd.engine_ms_per_token, rel=1e-9)
    text = specdecode.flag(sd)
    assert "3.00 draft tokens" in text and "2.00 tokens" in text and f"{sd.engine_ms_per_token:.3f} ms" in text
    # The pairing that assumes one token per step does not pretend: the closure is not judged.
    assert not cs["closure"].judged
    above = specdecode.spec_decode(rows.assign(concurrency=2), cs["pairs"], req, 2, cs["split"])
    assert above.tokens_per_step is None and above.per_token_ms is None and "not measured above C=1" in above.why_not


def _spec_level(reqs: dict[int, list[int]], most: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step rows and step requests (rank 0 and 1 alike) for requests given as the tokens each of their steps
    scheduled, served two at a time in turn; every step a decode step with `most` drafts in it somewhere."""
    sr, steps, step = [], [], 100
    lists = {r: list(t) for r, t in reqs.items()}
    while any(lists.values()):
        live = [r for r, t in lists.items() if t][:2]
        for r in live:
            n = lists[r].pop(0)
            sr += [(rank, step, r, n) for rank in (0, 1)]
        steps += [(rank, step, "decode", len(live) + most, len(live)) for rank in (0, 1)]
        step += 1
    return (
        pd.DataFrame(steps, columns=["rank", "step", "kind", "num_tokens", "num_seqs"]),
        pd.DataFrame(sr, columns=["rank", "step", "request", "tokens"]),
    )


def test_speculative_decoding_counted_from_the_hook_s_step_requests_at_any_concurrency():
    """The steps the hook saw serve each request (its step requests) give the tokens per decode step above C=1
    too: each request's tokens after the first over its decode steps, the steps after its prompt was complete.
    Known answers: request 1 a one-chunk prompt, request 2 a prompt in two chunks whose last (3 tokens) is no
    larger than a decode step and completes it exactly, request 3 a prompt whose first 15 tokens vLLM's prefix
    cache served (never scheduled). Left out, each with its reason: a recompute after preemption (a 40-token
    step after the prefill), a request with fewer tokens than decode steps."""
    from tpcomm.analysis import specdecode

    reqs = {
        1: [16, 1, 2, 4, 3, 1],  # 5 decode steps scheduling 11 tokens (6 drafts)
        2: [32, 3, 4, 4, 1],  # prompt 35: 32 + 3; 3 decode steps, 9 tokens (6 drafts)
        3: [17, 2, 2, 1, 4],  # prompt 32, 15 cached; 4 decode steps, 9 tokens (5 drafts)
        4: [16, 2, 40, 1],  # recompute
        5: [16, 1, 1, 1],  # 3 decode steps, 2 tokens after the first: impossible
    }
    out = {1: 1 + 8, 2: 1 + 7, 3: 1 + 6, 4: 1 + 20, 5: 1 + 2}  # tokens the client received
    prompt = {1: 16, 2: 35, 3: 32, 4: 16, 5: 16}
    rows, sr = _spec_level(reqs)
    req = pd.DataFrame(
        {
            "request_id": list(out),
            "ok": True,
            "output_tokens": list(out.values()),
            "prompt_tokens": list(prompt.values()),
        }
    )
    c = specdecode.by_step_requests(sr, req, most_drafts=3)
    assert (c.requests, c.steps, c.tokens, c.drafted) == (3, 5 + 3 + 4, 8 + 7 + 6, 6 + 6 + 5), c
    split = {
        "engine_ms_per_token": 6.0,
        "per_token_ms": {"compute": 3.0, "transfer": 1.0, "wait": 0.5, "host_gap": 1.5},
    }
    sd = specdecode.spec_decode(rows, pd.DataFrame(), req, 2, split, sr)
    tps = 21 / 12
    assert (
        sd.tokens_per_step == pytest.approx(tps)
        and sd.requests == 3
        and sd.measured_from == specdecode.BY_STEP_REQUESTS
    )
    assert (sd.decode_steps, sd.draft_tokens, sd.accepted_tokens) == (12, 17, 9)
    assert sd.engine_ms_per_token == pytest.approx(6.0 / tps) and sd.per_token_ms.total == pytest.approx(6.0 / tps)
    assert "9 of 17 drafts accepted" in specdecode.flag(sd)
    # Without step requests above C=1: not measured, and why; with none countable: each reason named.
    assert "not measured above C=1" in specdecode.spec_decode(rows, pd.DataFrame(), req, 2, split).why_not
    bad = specdecode.spec_decode(rows, pd.DataFrame(), req[req["request_id"] >= 4], 2, split, sr)
    assert bad.tokens_per_step is None and "(a recompute after preemption): 1" in bad.why_not, bad.why_not
    assert "fewer tokens than decode steps: 1" in bad.why_not
    failed = specdecode.spec_decode(rows, pd.DataFrame(), req.assign(ok=False), 2, split, sr)
    assert failed.tokens_per_step is None and failed.why_not == "no request of the level completed", failed.why_not


def test_a_request_across_a_clock_step_is_not_paired_by_client_times_and_the_level_says_so():
    """Pairing by the client's times (C > 1) puts the client's arrivals against the hook's stamps: a request
    across a wall-clock step cannot be, and is named; the level's flags name the step."""
    from tpcomm.analysis import pairing
    from tpcomm.analysis.synthetic import make_client, make_records
    from tpcomm.attribute.run import clock_step_flag

    coll, steps, _ = make_records(steps=200, prefill_every=40, seed=3)
    req, tok = make_client(steps)
    assert len(req) == 5
    req = req.assign(clock_step_ms=[np.nan, 10_000.0, np.nan, np.nan, np.nan])
    spans = pairing.client_spans(req, tok, period_ms=1.0)  # make_records' steps: about 1.1 ms apart
    assert spans["observed"].all() and spans["clock_step_ms"].notna().tolist() == [False, True, False, False, False]
    pairs = pairing.by_client_times(steps, spans).set_index("request_id")
    assert pairs.loc[1, "why"] == "the wall clock was stepped during it" and not pairs.loc[1, "paired"]
    assert pairs.drop(index=1)["paired"].all(), pairs[["paired", "why"]]
    # one stream at a time: its prefill segment is still its own (the order holds), but it is compared on neither
    # side and its delivery delays are not taken (the hook's stamps jumped inside its segment)
    pairs, problem = pairing.by_prefill(steps, spans, req)
    assert problem is None and pairs.set_index("request_id").loc[1, "why"] == pairing.STEPPED, pairs
    cs = client_side(_rows1(coll, steps), req, tok, 1)
    assert cs["closure"].excluded == {f"not paired ({pairing.STEPPED})": [1]}, cs["closure"]
    assert cs["compared"] == [0, 2, 3, 4] and cs["split_requests"] == [0, 2, 3, 4], cs["split_requests"]
    assert cs["delivery_term"].requests == 4 and cs["closure"].judged, cs["delivery_term"]
    flag = clock_step_flag(req)
    assert flag and "+10000.0 ms in request 1" in flag, flag
    assert clock_step_flag(req.drop(columns="clock_step_ms")) is None
    assert clock_step_flag(req.assign(clock_step_ms=np.nan)) is None


def test_a_rounds_duration_is_the_monotonic_clocks_across_a_wall_clock_step():
    """Two requests, the wall clock stepped +10 s between them (each placed on the wall clock at its own send):
    the round lasted 2 s on the monotonic clock, and tok/s is over that, not over 12 s."""
    from tpcomm.attribute.levels import round_seconds

    rows = pd.DataFrame(
        {
            "ok": [True, True],
            "output_tokens": [32, 32],
            "t_start_ns": [0, 11_000_000_000],
            "t_end_ns": [1_000_000_000, 12_000_000_000],
            "t_start_mono_ns": [5_000_000_000, 6_000_000_000],
            "t_end_mono_ns": [6_000_000_000, 7_000_000_000],
        }
    )
    assert round_seconds(rows) == 2.0
    assert round_seconds(rows.drop(columns=["t_start_mono_ns", "t_end_mono_ns"])) == 12.0  # older files


def test_one_stream_at_a_time_pairs_requests_in_send_order_whatever_the_wall_clock_did():
    """A backward step of the wall clock (-60 s) between requests 1 and 2: request 2 reads an earlier send time
    than request 1. Requests are paired with prefill segments in send order (request id), not by those times:
    each gets its own segment and the closure compares all five."""
    from tpcomm.analysis import pairing

    coll, steps, _ = make_records(steps=200, prefill_every=40, seed=3)
    req, tok = make_client(steps)
    back = req["request_id"] >= 2
    req.loc[back, "t_start_ns"] -= 60_000_000_000
    tok.loc[tok["request_id"] >= 2, "t_ns"] -= 60_000_000_000
    spans = pairing.client_spans(req, tok, period_ms=1.0)
    pairs, problem = pairing.by_prefill(steps, spans, req)
    assert problem is None and pairs["paired"].all(), pairs[["request_id", "why"]]
    first = {int(r): min(s) for r, s in zip(pairs["request_id"], pairs["steps"])}
    assert first == {0: 0, 1: 40, 2: 80, 3: 120, 4: 160}, first


def test_a_peer_that_stamps_its_step_end_late_does_not_move_the_token():
    """Rank 1 stamps the end of each request's last decode step 15 ms late (descheduled after its step's work on
    a busy host; the multinode run of 2026-12-05 saw 1.7 s and a closure of +11.4%). vLLM takes the step's
    output from rank 0 alone (its output rank), so the token left on time: paired by rank 0's step ends the
    closure holds; by the mean over ranks it fails (this is what the test guards)."""
    from tpcomm.analysis import pairing

    coll, steps, _ = make_records(steps=660, prefill_every=33, seed=5)
    rows = _rows1(coll, steps)
    req, tok = make_client(steps)
    last = rows[rows["kind"] == "decode"].groupby(rows["step"] // 33)["step"].max()  # each request's last step
    late = (rows["rank"] == 1) & rows["step"].isin(last)
    rows.loc[late, "t_end_ns"] += 15_000_000
    assert pairing.output_rank([0, 1], 2) == 0
    mean = client_side(rows, req, tok, 1)["closure"]
    own = client_side(rows, req, tok, 1, out_rank=0)["closure"]
    assert mean.judged and mean.ok is False and mean.diff_pct > 10, mean
    assert own.judged and own.ok and abs(own.diff_pct) < 0.5, own


def test_the_output_rank_is_the_first_tp_rank_of_the_last_stage():
    """vLLM 0.32 MultiprocExecutor._get_output_rank: world size - TP (PCP 1)."""
    from tpcomm.analysis.pairing import output_rank

    assert output_rank([0, 1], 2) == 0
    assert output_rank([0, 1, 2, 3], 2) == 2  # TP 2 x PP 2
    assert output_rank([0, 1], 1) == 1  # PP 2, one rank per stage
    assert output_rank([0, 1], None) is None and output_rank([], 2) is None
    assert output_rank([1], 2) is None  # rank 0 not recorded: the mean over ranks, not a guess


def _finished(request_id: int, t0: int, tokens: int = 8) -> dict:
    """A finished request as load.run_round returns it (before run.py keeps it)."""
    tn = [t0 + 10_000_000 * (i + 1) for i in range(tokens)]
    return dict(
        request_id=request_id, ok=True, error=None, prompt_tokens=16, output_tokens=tokens, ttft_ms=10.0,
        tpot_ms=10.0, itl_ms_mean=10.0, e2e_ms=10.0 * tokens, t_start_ns=t0, t_end_ns=tn[-1], t_end_wall_ns=tn[-1],
        clock_step_ms=None, t_start_mono_ns=t0, t_end_mono_ns=tn[-1], token_ns=tn, token_counts=[1] * tokens,
    )  # fmt: skip


def test_a_ctrl_c_between_rounds_keeps_the_level_from_the_rows_in_its_figures():
    """attribute's Ctrl-C path (run.Attribute._keep_interrupted) when the press lands outside a round's own
    handler: the level is made from the last round whose rows are in the figures; a round set aside as not
    steady gives a level of the next round, with no requests, not one counting rows that are out."""
    from tpcomm.attribute.run import Attribute, AttributeConfig
    from tpcomm.attribute.server import ServerInfo

    att = Attribute(AttributeConfig(server_url="http://127.0.0.1:1", out="unused"))
    att.info = ServerInfo(url="http://127.0.0.1:1", model="tiny", served=["tiny"])
    t0 = 1_000_000_000_000
    att._add_rows([_finished(i, t0 + i * 200_000_000) for i in range(4)], (1, 0), 0, True)  # C=1 repeat 0
    # C=2 repeat 1: round 0 not steady, set aside (as _rounds does); the press before round 1 ends
    att._add_rows([_finished(10 + i, t0 + i * 10_000_000) for i in range(4)], (2, 1), 0, True)
    for r in att.requests[-4:]:
        r["in_stats"] = False
    att._keep_interrupted(2, 1)
    (lv,) = att.levels
    assert (lv["concurrency"], lv["repeat"], lv["round"], lv["requests"]) == (2, 1, 1, 0), lv
    assert lv["interrupted"] == "interrupted (Ctrl-C) during this level"
    # pressed in the bookkeeping after a round whose rows are kept: the level holds them and their tokens
    att.levels.clear()
    att._add_rows([_finished(20 + i, t0 + i * 10_000_000, tokens=6) for i in range(3)], (2, 1), 1, True)
    att._keep_interrupted(2, 1)
    (lv,) = att.levels
    assert (lv["round"], lv["requests"], lv["failed"]) == (1, 3, 0) and lv["tpot_ms_p50"] > 0, lv
    req, tok = att._frames([r for r in att.requests if r["round"] == 1])
    assert sorted(req["request_id"]) == [20, 21, 22] and len(tok) == 18
    # a level already made is not made twice; without a started recording it is not marked for its records
    att._keep_interrupted(2, 1)
    assert len(att.levels) == 1
    att.levels[0].pop("interrupted")
    att._keep_interrupted(2, 1)
    assert "interrupted" not in att.levels[0]
    att._recorded.add((2, 1))
    att._keep_interrupted(2, 1)
    assert att.levels[0]["interrupted"] == "interrupted (Ctrl-C) before this level's records were fetched"


def test_a_death_before_the_levels_first_request_keeps_the_level(monkeypatch):
    """A TP worker that dies as a level starts (its recording being started, or before any request of it
    finished): the level stays in load/levels.json with no requests, marked with the death, as one with
    requests is. It was left out, and a run that said "TP rank 1 died during C=2" had no C=2 in its summary
    (2026-12-06, beside a busy process). The watch here is a stand-in holding a real RankDeath."""
    import time as _time

    from tpcomm.attribute import load, run
    from tpcomm.attribute.ranks import RankDeath, RankDied
    from tpcomm.attribute.run import Attribute, AttributeConfig
    from tpcomm.attribute.server import ServerInfo

    death = RankDeath(rank=1, pid=4242, t_ns=_time.time_ns(), concurrency=2, same_time=[], others=[0])

    class Watch:
        death, note = None, None
        local, api = {}, None  # not on the server's machine: no host figures

        def __init__(self, *a):
            pass

        def start(self):
            return self

        def stop(self, requests_failed=False):
            return death

    att = Attribute(AttributeConfig(server_url="http://127.0.0.1:1", out="unused"))
    att.info = ServerInfo(url="http://127.0.0.1:1", model="tiny", served=["tiny"], plugin={"enabled": True})
    # In the rounds: the server went before any of the level's requests was kept.
    with pytest.raises(RankDied):
        att._gone([], 2, 0, 0, Watch(), _time.time_ns())
    (lv,) = att.levels
    assert (lv["concurrency"], lv["repeat"], lv["requests"]) == (2, 0, 0), lv
    assert lv["worker_problem"].startswith("TP rank 1 (pid 4242) died") and lv["rank_died"]["pid"] == 4242
    assert lv["flags"] == [f"incomplete: {lv['worker_problem']}"]
    # As its recording was being started.
    att.levels.clear()
    monkeypatch.setattr(run, "RankWatch", Watch)

    def gone(*a, **k):
        raise load.ServerGone([])

    monkeypatch.setattr(att, "_hook", gone)
    with pytest.raises(RankDied):
        att._level(2, 1, None)
    (lv,) = att.levels
    assert (lv["concurrency"], lv["repeat"], lv["requests"]) == (2, 1, 0), lv
    assert "the level's hook recording was being started" in lv["worker_problem"], lv
