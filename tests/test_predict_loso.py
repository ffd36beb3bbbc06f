"""Leave-one-source-out validation of `tpcomm predict` (tpcomm/predict/loso.py): every row of a source held out
together while the fitted constants are refitted on the other sources. The figures are printed beside the
in-sample ones (run with -s to see them); benchmarks/predict_validation.py --loso prints every row."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tpcomm.predict import loso
from tpcomm.predict.validation import summary

RECORDED = json.loads(resources.files("tpcomm.predict").joinpath("data", "validation.json").read_text())["loso"]


@pytest.fixture(scope="module")
def folds():
    return loso.run("source")


def _tp2(results):
    return [r for r in results if r.row["tp"] >= 2]


def test_leave_one_source_out_inside_share_and_error(folds):
    fs, full = folds
    held = [r for f in fs for r in f.rows]
    inside = loso.in_sample(full)
    s_loso, s_in = summary(_tp2(held)), summary(_tp2(inside))
    for name, s in (("leave one source out", s_loso), ("in sample (same refit, every source)", s_in)):
        print(
            f"{name}, TP >= 2 rows: {s['inside']}/{s['rows']} inside = {100 * s['share_inside']:.0f}%, "
            f"median |error| {s['median_abs_error_pct']:.1f}%, median half-width {s['median_half_width_pct']:.1f}%"
        )
    s_all = summary(held)
    print(
        f"leave one source out, every row: {100 * s_all['share_inside']:.0f}% inside, {s_all['median_abs_error_pct']:.1f}%"
    )
    assert s_loso["predicted"] == s_loso["rows"]  # no row refused
    # every row is predicted exactly once, by the fold that holds its source out
    assert sorted(r.row["id"] for r in held) == sorted(r.row["id"] for r in inside)
    rec = RECORDED["tp_2_and_more"]
    # no worse than recorded in validation.json (the 80%-inside target is the test below)
    assert s_loso["share_inside"] >= rec["share_inside"] - 1e-9, [
        (r.row["id"], r.measured, r.low, r.high) for r in _tp2(held) if not r.inside
    ]
    assert s_loso["median_abs_error_pct"] <= rec["median_abs_error_pct"] + 0.05
    # nor wider: a wider range must be a decision recorded in validation.json, not a side effect
    assert s_loso["median_half_width_pct"] <= rec["median_half_width_pct"] + 0.05
    assert s_loso["median_abs_error_pct"] <= 20.0  # issue 29's target
    # holding sources out costs accuracy: in-sample must be at least as good, else the refit is not what it says
    assert s_in["median_abs_error_pct"] <= s_loso["median_abs_error_pct"]


def test_leave_one_source_out_meets_the_80pct_inside_target(folds):
    """Issue 29's target. Met since the coverage rule (tpcomm/predict/coverage.py): before it 44 of 62 TP >= 2 rows
    were inside (71%); the gpt-fast rows, an engine no fitted row ran, now take a GEMM ramp widened to span the
    fitted ramps (docs/predict.md, 'Leave one source out')."""
    fs, _ = folds
    s = summary(_tp2([r for f in fs for r in f.rows]))
    assert s["share_inside"] >= 0.80, [(r.row["id"], r.measured, r.low, r.high) for f in fs for r in _tp2(f.rows)]


def test_a_held_out_engine_no_row_ran_is_widened_on_its_folds_own_fits(folds):
    """In a fold, coverage is judged on the rows left: no held-out row informs a prediction, an engine none of the
    rows left ran says so, and its ramp spans the ramps refitted on the rows left (not the shipped ones)."""
    fs, _ = folds
    for f in fs:
        held = {r.row["id"] for r in f.rows}
        left = {r["id"] for r in f.rest}
        for r in f.rows:
            assert set(r.coverage["rows"]) <= left and not set(r.coverage["rows"]) & held, r.row["id"]
    gf = next(f for f in fs if "gpt-fast" in f.source)
    for r in gf.rows:
        cov = r.coverage
        assert not cov["covered"] and cov["widened"]["changed"], r.row["id"]
        fitted = {x["gpu"]: x["central_us"] for x in cov["widened"]["fitted_ramps"]}
        assert fitted["a100"] == pytest.approx(gf.values["a100.ramp_us"].central)  # the fold's refit, not 15.5
        assert cov["widened"]["to"]["low"] == pytest.approx(min(fitted.values()))
    covered = [r for f in fs for r in f.rows if r.coverage["covered"]]
    assert covered and all(r.coverage["widened"] is None for r in covered)
    assert {r.row["engine"].split("-")[0] for r in covered} == {"vllm", "sglang"}


def test_a_held_out_source_informs_nothing_in_its_fold(folds):
    fs, full = folds
    by = {loso.short(f.source): f for f in fs}
    qwen3 = next(f for s, f in by.items() if s.endswith("speed_benchmark.md"))
    # the Qwen3 page is the only source of the H20 fit: without it the H20 constants are the unfitted assumptions
    assert "h20.memory_efficiency" in qwen3.informed
    assert qwen3.values["h20.memory_efficiency"].source.startswith("unfitted")
    assert not full["h20.memory_efficiency"].source.startswith("unfitted")
    # a constant fitted on other sources only is refitted without the held-out rows, and says how many it used
    a100 = next(f for s, f in by.items() if "010c37c" in s)
    assert a100.values["a100.memory_efficiency"].source.startswith("unfitted")
    assert (
        "6 rows" in qwen3.values["a100.memory_efficiency"].source
        or "8 rows" in qwen3.values["a100.memory_efficiency"].source
    )
    # a source that fits nothing is predicted with the constants of every source
    plain = next(f for f in fs if not f.informed)
    assert plain.values is full


def test_every_fitted_row_names_what_it_fits():
    rows, _ = loso.load_rows()
    ids = {r["id"] for r in rows}
    for r in rows:
        if r["fitted"]:
            assert isinstance(r.get("fits"), list), r["id"]
            assert set(r["fits"]) <= set(loso.CONSTS), r["id"]
        else:
            assert not r.get("fits"), r["id"]
        assert r.get("fits_relative_to") in (None, *ids)
