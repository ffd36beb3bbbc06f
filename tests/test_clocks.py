"""Ranks on other clocks put on rank 0's from the collectives' exit times (tpcomm/analysis/clocks.py), on
synthetic records with a known answer: an offset injected into one rank's clock is found, applied, and leaves
the timeline's entry skew as it was without it; the split never moves."""

from __future__ import annotations

import numpy as np
import pytest

from tpcomm.analysis import clocks
from tpcomm.analysis.align import align, alignment_quality
from tpcomm.analysis.split import engine_split, rank_steps
from tpcomm.analysis.synthetic import make_records

SAME, OTHER = {"boot_id": "b0", "host": "n0"}, {"boot_id": "b1", "host": "n1"}


def _shift(df, rank, us):
    out = df.copy()
    m = out["rank"] == rank
    for c in ("t_start_ns", "t_end_ns"):
        out.loc[m, c] = out.loc[m, c] + int(us * 1e3)
    return out


@pytest.mark.parametrize("offset_us", [2000.0, -350.0])
def test_an_injected_offset_is_found_applied_and_the_timeline_restored(offset_us):
    coll, steps, _ = make_records(steps=300, tp=2, calls=10, seed=11, skew_us=200.0)
    base = align(coll)
    moved_c, moved_s = _shift(coll, 1, offset_us), _shift(steps, 1, offset_us)
    off = clocks.decide(clocks.estimate(align(moved_c)), {0: SAME, 1: OTHER})
    o = off[1]
    assert o["applied"] and abs(o["offset_us"] - offset_us) <= 5 and o["lo_us"] <= offset_us + 5
    fixed = align(clocks.apply(moved_c, off))
    # The entry skew after alignment matches the run without the offset; without alignment it is off by it.
    q0, q1, q2 = alignment_quality(base), alignment_quality(align(moved_c)), alignment_quality(fixed)
    assert q2["instance_entry_skew_us_p50"] == pytest.approx(q0["instance_entry_skew_us_p50"], abs=5)
    assert abs(q1["instance_entry_skew_us_p50"] - q0["instance_entry_skew_us_p50"]) > abs(offset_us) / 2
    # The split is durations only: the same with or without the offset.
    a = engine_split(rank_steps(align(moved_c), moved_s).assign(concurrency=1, repeat=0))
    b = engine_split(rank_steps(base, steps).assign(concurrency=1, repeat=0))
    for k in b["per_token_ms"]:
        assert a["per_token_ms"][k] == pytest.approx(b["per_token_ms"][k], rel=1e-4), k
    assert clocks.entry_skew_separable(off) is not None


def test_a_rank_on_rank_0s_machine_keeps_its_clock_unless_it_is_far_off():
    coll, _, _ = make_records(steps=300, tp=2, calls=10, seed=12)
    jitter = coll.copy()
    rng = np.random.default_rng(0)
    m = jitter["rank"] == 1
    jitter.loc[m, "t_end_ns"] += rng.integers(-3000, 3000, m.sum())  # +-3 us of exit jitter, no offset
    off = clocks.decide(clocks.estimate(align(jitter)), {0: SAME, 1: dict(SAME)})
    assert not off[1]["applied"] and abs(off[1]["offset_us"]) < 3
    # A per-process clock (libfaketime) on the same machine: far off and resolved, so it is applied.
    faked = clocks.decide(clocks.estimate(align(_shift(coll, 1, 2000.0))), {0: SAME, 1: dict(SAME)})
    assert faked[1]["applied"] and "per-process clock" in faked[1]["why"]


def test_nodes_come_from_the_hooks_status():
    st = {"per_rank": [{"rank": 0, "host": "a", "identity": "boot-a/11/99", "pid": 11}, {"rank": 1, "host": "b"}]}
    n = clocks.ranks_nodes(st)
    assert n[0] == {"host": "a", "boot_id": "boot-a", "pid": 11} and n[1]["boot_id"] is None
    assert (
        clocks.ranks_nodes(None) == {} and clocks.estimate(align(make_records(steps=1)[0])) == {}
    )  # too few instances
