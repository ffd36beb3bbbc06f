"""Engine coverage (issue 29 item 2, tpcomm/predict/coverage.py): predict.json names the rows that informed the
fitted constants in use; where none of them ran the engine predicted for, the prediction says so and its GEMM ramp
(the fitted constant that carries the engine's own per-kernel cost) widens to span the fitted ramps of every
(GPU, engine) pair, its central kept. A covered engine's prediction is exactly what it was without the rule."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.predict import Knobs, Layout, coverage, predict
from tpcomm.predict.hardware import load_profile
from tpcomm.predict.kernels import ENGINE_RAMP_US
from tpcomm.predict.latency_range import LatencyRange
from tpcomm.predict.ranges import Input, RangeInputs
from tpcomm.predict.validation import run

DOC = json.loads(resources.files("tpcomm.predict").joinpath("data", "validation.json").read_text())
ROWS = {r["id"]: r for r in DOC["rows"]}


def _both(monkeypatch, **kw):
    """The same prediction with the coverage rule and with widen_uncovered switched off (identity)."""
    with_rule = predict(**kw, what_if=False)
    with monkeypatch.context() as m:
        m.setattr(coverage, "widen_uncovered", lambda ri, cov, fits: (ri, cov))
        without = predict(**kw, what_if=False)
    return with_rule, without


def _tok(doc):
    return doc["range"]["single_stream"]["tok_per_s"]


def test_an_engine_no_row_ran_says_so_and_its_range_widens_with_the_central_kept(monkeypatch):
    # SGLang before its overlap scheduler (0.4) on A100: no row informing an A100 prediction ran SGLang (the H20
    # fit's rows did, on another GPU)
    # (gpt-fast, the example before, has its own A100 ramp fitted on its rows since: tests/test_predict_gpt_fast.py)
    kw = dict(model="llama-3.1-70b", layout=Layout(tp=8), gpu="a100-sxm", engine="sglang-0.3.6")
    doc, plain = _both(monkeypatch, **kw)
    cov = doc["coverage"]
    assert cov["covered"] is False and cov["engine_family"] == "sglang"
    w = cov["widened"]
    assert w["input"] == "ramp_us" and w["changed"]
    # the widened ramp spans the fitted ramps of every (GPU, engine) pair, hulled with the A100's own range
    a100 = load_profile("a100-sxm")
    fitted = {(f["gpu"], tuple(f["engines"])): f["central_us"] for f in w["fitted_ramps"]}
    gpu_ramps = {g: load_profile(n[0])["ramp_us"] for g, n in coverage.GPU_GROUPS.items()}
    assert {g: c for (g, e), c in fitted.items() if "gpt-fast" not in e} == gpu_ramps
    assert fitted[("a100", ("gpt-fast",))] == ENGINE_RAMP_US[("gpt-fast", "a100")][1]  # a second engine's A100 fit
    assert w["from"] == {"low": 10.5, "central": a100["ramp_us"], "high": 23.0}
    assert w["to"] == {"low": min(fitted.values()), "central": a100["ramp_us"], "high": 23.0}
    assert doc["range"]["inputs"]["ramp_us"]["low"] == min(fitted.values())
    # the range is wider, the central the same; the JSON's before/after are the two predictions
    t, t0 = _tok(doc), _tok(plain)
    assert t["central"] == pytest.approx(t0["central"]) and t["low"] == pytest.approx(t0["low"])
    assert t["high"] > t0["high"] * 1.05
    assert w["tok_per_s_from"] == pytest.approx(t0) and w["tok_per_s_to"] == pytest.approx(t)
    # the rows that informed it are table rows that fit the constants in use, and none ran SGLang
    assert set(cov["informed_by"]) == {"kv_efficiency", "a100.memory_efficiency", "a100.ramp_us"}
    for const, ids in cov["informed_by"].items():
        assert ids and all(const in ROWS[i]["fits"] for i in ids), const
    assert set(cov["rows"]) == {i for ids in cov["informed_by"].values() for i in ids}
    assert cov["engines_of_informing_rows"] == ["vllm-0.6.3"]
    assert "NOT COVERED" in cov["statement"] and "widened 10.5-23 -> 6.5-23 us" in cov["statement"]
    assert "widened for engine sglang-0.3.6" in doc["range"]["inputs"]["ramp_us"]["source"]


def test_a_covered_engine_is_unchanged_by_the_rule(monkeypatch):
    for kw in (
        dict(model="llama-3.1-70b", layout=Layout(tp=8), gpu="a100-sxm", engine="vllm-0.6.3"),
        dict(model="kimi-k2.5", layout=Layout(tp=8), gpu="rtx-pro-6000", engine="vllm-0.32"),
        dict(model="qwen3-32b", layout=Layout(tp=2), gpu="h20", engine="sglang-0.4.6"),
    ):
        doc, plain = _both(monkeypatch, **kw)
        assert doc["coverage"]["covered"] is True and doc["coverage"]["widened"] is None, kw
        assert doc["range"] == plain["range"] and doc["single_stream"] == plain["single_stream"], kw


def test_the_held_out_ci_rows_are_covered_and_keep_their_ranges(monkeypatch):
    """Guard of the in-sample figures: the CI subset (every engine in it vLLM or SGLang) predicts the same
    ranges with the rule as without it."""
    ids = DOC["ci_subset"]["ids"]
    with_rule = {r.row["id"]: r for r in run(ids)}
    with monkeypatch.context() as m:
        m.setattr(coverage, "widen_uncovered", lambda ri, cov, fits: (ri, cov))
        without = {r.row["id"]: r for r in run(ids)}
    for i in ids:
        a, b = with_rule[i], without[i]
        assert a.coverage["covered"] and (a.low, a.central, a.high) == (b.low, b.central, b.high), i


def test_the_console_says_it_only_where_the_engine_is_not_covered():
    base = ["predict", "-m", "llama-3.1-70b", "--tp", "8", "--gpu", "a100-sxm", "--engine"]
    out = CliRunner().invoke(cli, [*base, "sglang-0.3.6"])
    assert out.exit_code == 0, out.output
    assert "engine sglang-0.3.6: NOT COVERED" in out.output and "GEMM ramp widened 10.5-23 -> 6.5-23 us" in out.output
    assert "GEMM ramp 6.5-23 us (central 15.5)" in out.output
    out = CliRunner().invoke(cli, [*base, "vllm-0.6.3"])
    assert out.exit_code == 0 and "COVERED" not in out.output


def test_a_gpu_without_a_fit_already_spans_the_fits_and_a_given_ramp_is_kept():
    # TGI 2.4: an engine version no fitted row ran (TGI 1.0.x is covered: its rows fit its host term)
    doc = predict("llama-3.1-70b", Layout(tp=8), gpu="a10g", engine="tgi-2.4-eager", what_if=False)
    cov = doc["coverage"]
    assert not cov["covered"] and not cov["widened"]["changed"]
    assert coverage.GENERIC_RAMP in cov["informed_by"]  # the generic ramp: informed by every ramp fit
    assert {i for i in cov["informed_by"][coverage.GENERIC_RAMP]} == {
        r["id"] for r in DOC["rows"] if any(f.endswith(".ramp_us") for f in r.get("fits") or [])
    }
    assert "already spans the fitted ramps" in cov["statement"]
    given = predict(
        "llama-3.1-70b", Layout(tp=8), gpu="a100-sxm", engine="gpt-fast", knobs=Knobs(ramp_us=12.0), what_if=False
    )
    assert given["coverage"]["widened"] is None and given["range"]["inputs"]["ramp_us"]["low"] == 12.0
    assert "a100.ramp_us" not in given["coverage"]["informed_by"]


def test_the_widening_rule_is_a_hull_with_the_central_kept():
    lat = LatencyRange(None, None, None, "table", {})
    fits = [coverage.RampFit("a", ("vllm-1",), 6.0), coverage.RampFit("b", ("sglang-1",), 20.0)]

    def ri(lo, c, hi):
        return RangeInputs(Input(0.8, 0.8, 0.8, "m"), Input(1, 1, 1, "k"), lat, ramp_us=Input(lo, c, hi, "fit"))

    uncovered = coverage.Coverage("x", "x", None, {"a.ramp_us": ["r1"]}, {"r1": "vllm-1"})
    covered = replace(uncovered, family="vllm")
    out, cov = coverage.widen_uncovered(ri(10, 12, 15), uncovered, fits)
    assert (out.ramp_us.low, out.ramp_us.central, out.ramp_us.high) == (6.0, 12, 20.0) and cov.widened["changed"]
    out, cov = coverage.widen_uncovered(ri(1, 12, 30), uncovered, fits)  # already spans: unchanged
    assert (out.ramp_us.low, out.ramp_us.high) == (1, 30) and not cov.widened["changed"]
    out, cov = coverage.widen_uncovered(ri(10, 12, 15), covered, fits)
    assert (out.ramp_us.low, out.ramp_us.high) == (10, 15) and cov.widened is None and cov.covered
