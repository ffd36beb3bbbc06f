"""The comparison's intervals on synthetic steps with a known answer (tests/compare_synthetic.py): a known null
(A/A pairs: how often the band calls anything changed), a known shift (resolved, right sign, covered), why the
blocks (autocorrelated steps) and the repeats (a run-level offset) are there, and that the terms add up in
every draw. Seeds are fixed: each rate is one deterministic figure, printed in the assertion message."""

from __future__ import annotations

import numpy as np
import pytest
from compare_synthetic import sample

from tpcomm.compare.intervals import LEVEL, differences
from tpcomm.compare.samples import estimates

N_DRAWS = 1000  # per comparison (the command uses 4000); enough for a 95% quantile


def _rates(pairs: int, reps: int = 1, offset_us: float = 0.0, block: str = "request", shift_us: float = 0.0):
    """Over `pairs` A/B comparisons: the share with any resolved difference, with the per-token time resolved,
    and with the true shift of the per-token time inside its interval."""
    rng = np.random.default_rng(7)
    any_, per, covered = 0, 0, 0
    for i in range(pairs):
        a = [sample(1000 * i + 2 * j, block=block, offset_us=rng.normal(0, offset_us)) for j in range(reps)]
        b = [
            sample(1000 * i + 2 * j + 1, block=block, offset_us=rng.normal(0, offset_us), shift_us=shift_us)
            for j in range(reps)
        ]
        band = differences(a, b, seed=i, n=N_DRAWS)
        any_ += any(iv.resolved for iv in band.intervals.values())
        iv = band.intervals["per_token"]
        per += iv.resolved
        covered += iv.lo <= shift_us / 1e3 <= iv.hi
    return any_ / pairs, per / pairs, covered / pairs


def test_known_null_false_alarm_rate_is_near_the_nominal_level():
    """200 A/A pairs (autocorrelated steps, 16 requests each): the simultaneous band over all 8 differences
    calls something changed in about 1 - LEVEL of them, the per-token time alone in fewer."""
    fam, per, covered = _rates(200)
    assert fam <= 0.10, f"family-wise false alarms {fam:.1%} (nominal {1 - LEVEL:.0%})"
    assert per <= 0.06, f"per-token false alarms {per:.1%}"
    assert covered >= 0.94


def test_steps_as_independent_draws_would_false_alarm():
    """The same A/A pairs resampled step by step (ignoring that a slow patch lasts many steps): the intervals
    are far too narrow. The request blocks are what keeps the rate above near nominal."""
    fam, per, _ = _rates(30, block="step")
    assert fam >= 0.4 and per >= 0.3, (fam, per)


def test_known_shift_is_resolved_with_its_sign_and_covered():
    """B's compute is 0.8 ms per token slower (about 14% of the token): the per-token time and compute are
    resolved, positive, their intervals hold 0.8 ms; the terms that did not move are not called changed."""
    a, b = sample(11), sample(12, shift_us=800.0)
    band = differences([a], [b], n=N_DRAWS)
    iv = band.intervals
    for k in ("per_token", "compute"):
        assert iv[k].resolved and iv[k].lo > 0, (k, iv[k])
        assert iv[k].lo <= 0.8 <= iv[k].hi, (k, iv[k])
    assert iv["tok_per_s"].resolved and iv["tok_per_s"].hi < 0  # slower per token: fewer tokens per second
    for k in ("transfer", "wait", "host_gap", "delivery"):
        assert not iv[k].resolved, (k, iv[k])
    fam, per, covered = _rates(60, shift_us=800.0)
    assert per >= 0.9, f"the 0.8 ms shift resolved in {per:.0%} of pairs"
    assert covered >= 0.9, f"the true shift inside the per-token interval in {covered:.0%} of pairs"


def test_a_run_level_offset_needs_the_repeats():
    """Each run (repeat) offset by its own N(0, 0.3 ms) (a restart, a neighbour): with one repeat per side the
    within-run intervals call A/A pairs changed far too often; with three repeats per side the spread between
    them enters the band and the rate is back near nominal."""
    one, _, _ = _rates(60, reps=1, offset_us=300.0)
    three, per3, _ = _rates(60, reps=3, offset_us=300.0)
    assert one >= 0.25, f"one repeat per side: {one:.0%} false alarms"
    assert three <= 0.10 and per3 <= 0.07, f"three repeats per side: {three:.0%} ({per3:.0%} per-token)"
    band = differences([sample(1), sample(3), sample(5)], [sample(2), sample(4)], n=N_DRAWS)
    assert band.between_df == 3


def test_a_term_that_never_varies_on_one_side_keeps_its_spread_from_the_other():
    """TP 1 (one repeat, no collectives: transfer and wait exactly 0) against TP 2 (three repeats, each offset
    by N(0, 0.3 ms)): the spread between B's repeats is B's alone, so the collectives (0.1 ms transfer, 0.7 ms
    wait per token) are resolved; the per-token time, which moves by a repeat's offset, is not."""
    rng = np.random.default_rng(3)
    a = [sample(1, collectives=False, compute_us=4800.0)]
    b = [sample(2 + 2 * j, offset_us=rng.normal(0, 300.0)) for j in range(3)]
    band = differences(a, b, n=N_DRAWS)
    iv = band.intervals
    assert band.between_df == 2
    for k in ("transfer", "wait", "collective"):
        assert iv[k].resolved and iv[k].lo > 0, (k, iv[k])
    assert not iv["per_token"].resolved, iv["per_token"]


def test_terms_add_up_in_every_draw():
    """Any weighting of the blocks gives terms that add up to its per-token time (means over the same pairs)."""
    s = sample(5)
    w = np.random.default_rng(0).integers(0, 3, size=(50, s.blocks)).astype(float)
    e = estimates(s, w)
    total = e["compute"] + e["transfer"] + e["wait"] + e["host_gap"]
    np.testing.assert_allclose(total, e["per_token"], rtol=1e-12)
    np.testing.assert_allclose(e["collective"], e["transfer"] + e["wait"], rtol=1e-12)
    # And the point estimate is the plain mean over pairs: weights of one.
    one = estimates(s, np.ones((1, s.blocks)))
    assert one["per_token"][0] == pytest.approx(s.point["per_token"])


def test_intervals_are_reproducible():
    a, b = sample(21), sample(22)
    x, y = differences([a], [b]), differences([a], [b])
    assert x.intervals["per_token"] == y.intervals["per_token"] and x.critical_value == y.critical_value


def test_ordinary_statistics_keep_the_shared_band_with_one_repeat_against_two():
    """1 repeat against 2 (df 1: the between-repeat draw is Cauchy-like) with each repeat offset by N(0, 0.3 ms):
    no statistic is given its own tails; judged after the between draw, statistics whose spread is mostly
    between repeats cleared the bar by chance in 9-27% of such comparisons, each interval then 5-10x wider."""
    rng = np.random.default_rng(11)
    flagged = []
    for i in range(40):
        a = [sample(3000 + i, offset_us=rng.normal(0, 300.0))]
        b = [sample(4000 + 2 * i + j, offset_us=rng.normal(0, 300.0)) for j in range(2)]
        band = differences(a, b, seed=i, n=N_DRAWS)
        assert band.between_df == 1
        flagged += band.own_tails
    assert flagged == [], flagged
