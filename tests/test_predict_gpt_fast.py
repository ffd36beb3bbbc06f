"""gpt-fast as predict runs it (issue 29): every rank holds and reads the whole lm_head (gpt-fast's tp.py shards only
the layers), so its plan has no embedding all-reduce and no logits gather; and its GEMM ramp on A100 is its own,
fitted on the README's Llama-2-7B sweep only (the other four models' rows held out)."""

from __future__ import annotations

import math

import pytest

from tpcomm.plan.collectives import EMBED_SITE, LOGITS_SITE
from tpcomm.plan.layout import padded_vocab
from tpcomm.plan.weights import weight_components
from tpcomm.predict import Knobs, Layout, plan_for, predict
from tpcomm.predict.engine import resolve_engine
from tpcomm.predict.hardware import load_profile
from tpcomm.predict.kernels import ENGINE_RAMP_US
from tpcomm.predict.validation import load_rows, predict_for_row, run

FIT_ROWS = {f"llama2-7b-bf16-tp{t}-a100-gpt-fast" for t in (1, 2, 4, 8)}


def test_gpt_fast_reads_the_whole_lm_head_on_every_rank_and_issues_no_vocab_collectives():
    gf, vl = resolve_engine("gpt-fast"), resolve_engine("vllm-0.6.3")
    assert not gf.vocab_parallel and vl.vocab_parallel
    p_gf, p_vl = (plan_for("llama-3.1-70b", Layout(tp=8), [1], e) for e in (gf, vl))
    sites = lambda p: {c.site for c in p.for_batch(1)}  # noqa: E731
    assert {EMBED_SITE, LOGITS_SITE} <= sites(p_vl) and not {EMBED_SITE, LOGITS_SITE} & sites(p_gf)
    assert sites(p_vl) - sites(p_gf) == {EMBED_SITE, LOGITS_SITE}
    # the same step, the same fixed inputs: the weights term differs by the lm_head rows the other ranks hold
    k = Knobs(context=100, memory_efficiency=0.8, ramp_us=5.0, host_ms=0.0, kernel_overhead_us=1.0)
    d_gf, d_vl = (
        predict("llama-3.1-70b", Layout(tp=8), gpu="a100-sxm", engine=e, knobs=k, what_if=False)
        for e in ("gpt-fast", "vllm-0.6.3")
    )
    m = p_gf.model
    extra = (m.vocab_size - padded_vocab(m.vocab_size) / 8) * m.hidden_size * m.dtype_bytes  # bytes per rank
    bw = load_profile("a100-sxm")["memory_bandwidth_GBps"] * 1e9 * 0.8
    w_gf, w_vl = (d["single_stream"]["breakdown_ms"]["weights"] for d in (d_gf, d_vl))
    assert w_gf - w_vl == pytest.approx(extra / bw * 1e3, rel=1e-6)
    assert extra > 1.8e9  # Llama-3.1's 128k vocabulary: 1.84 GB more per rank at TP 8
    assert d_gf["single_stream"]["collectives_per_token"] == d_vl["single_stream"]["collectives_per_token"] - 2
    # the README's own accounting, independent of this formula: its "Memory Bandwidth" column is the bytes of one
    # rank's modules but its embeddings (generate.py _get_model_size, since the Llama-3.1 rows) x tok/s: 1129.61 GB/s
    # at 58.78 tok/s = 19.22 GB per rank, which is what predict reads per token but the embedding rows
    read = sum(c.bytes_per_gpu for c in weight_components(m, Layout(tp=8), 1, False) if c.component != "embedding rows")
    assert read / 1e9 == pytest.approx(1129.61 / 58.78, rel=0.002)
    # and the memory check counts both whole tables (lm_head and embedding) on every rank
    stored = lambda d: d["memory"]["weights_stored_per_gpu_GB"]  # noqa: E731
    assert stored(d_gf) - stored(d_vl) == pytest.approx(2 * extra / 1e9, rel=1e-6)


def test_the_tp_what_ifs_run_the_engines_vocab_layout_too():
    d = predict("llama-3.1-70b", Layout(tp=8), gpu="a100-sxm", engine="gpt-fast")
    tp4 = next(w for w in d["what_if"] if w["name"] == "tp4")
    direct = predict("llama-3.1-70b", Layout(tp=4), gpu="a100-sxm", engine="gpt-fast", what_if=False)
    for term in ("weights", "collectives"):
        assert tp4["breakdown_ms"][term] == pytest.approx(direct["single_stream"]["breakdown_ms"][term], rel=1e-9)


@pytest.mark.xfail(
    strict=True,
    reason="known limit: predict's memory check takes 90% of the profile's memory_GB (80 for an A100 80GB, which "
    "holds 80 GiB = 85.9 GB) for every engine, vLLM's gpu_memory_utilization default; gpt-fast reserves no such "
    "fraction, and Llama-3.1-70B at TP 2 (72.65 GB per rank with both whole vocabulary tables, against a 72.0 GB "
    "budget) ran in its README at 16.03 tok/s (docs/predict.md)",
)
def test_every_layout_the_gpt_fast_readme_ran_fits():
    rows, q = load_rows()
    for r in rows:
        if r["engine"] == "gpt-fast":
            assert predict_for_row(r, q)["memory"]["fits_90pct"], r["id"]


def test_gpt_fast_a100_ramp_is_fitted_on_one_sweep_and_reproduced_from_its_rows():
    """kernels.ENGINE_RAMP_US[('gpt-fast', 'a100')]: least squares on the log error of the four Llama-2-7B rows,
    the given ramp the only free input; every other gpt-fast row stays held out."""
    rows, q = load_rows()
    fitting = [r for r in rows if "ramp_us.gpt-fast.a100" in (r.get("fits") or [])]
    assert {r["id"] for r in fitting} == FIT_ROWS and all(r["fitted"] for r in fitting)
    assert not any(r.get("fits") for r in rows if r["engine"] == "gpt-fast" and r["id"] not in FIT_ROWS)

    def tok(r, ramp):
        return predict_for_row(r, q, ramp_us=ramp)["single_stream"]["tok_per_s"]

    loss = lambda v: sum(math.log(tok(r, v) / r["measured_tok_per_s"]) ** 2 for r in fitting)  # noqa: E731
    best = min((loss(a / 20), a / 20) for a in range(60, 200))[1]
    lo, c, hi, src = ENGINE_RAMP_US[("gpt-fast", "a100")]
    assert best == pytest.approx(c, abs=0.051) and lo < c < hi and "fitted" in src
    assert c < 0.6 * 15.5  # well below vLLM 0.6.3's fitted A100 ramp


def test_gpt_fast_on_a100_is_covered_by_its_own_rows_and_elsewhere_says_it_is_not():
    d = predict("llama-3.1-70b", Layout(tp=8), gpu="a100-sxm", engine="gpt-fast", what_if=False)
    cov = d["coverage"]
    assert cov["covered"] and cov["widened"] is None
    assert set(cov["informed_by"]["ramp_us.gpt-fast.a100"]) == FIT_ROWS and "a100.ramp_us" not in cov["informed_by"]
    r = d["range"]["inputs"]["ramp_us"]
    assert (r["low"], r["central"], r["high"]) == ENGINE_RAMP_US[("gpt-fast", "a100")][:3]
    # the same chip in another profile (same GPU group) takes the same fit
    p = predict("llama-3.1-70b", Layout(tp=8), gpu="a100-pcie", engine="gpt-fast", what_if=False)
    assert p["coverage"]["covered"] and "ramp_us.gpt-fast.a100" in p["coverage"]["informed_by"]
    # a GPU with its own ramp fit from another engine: gpt-fast is not covered there and its ramp widens
    h = predict("qwen3-32b", Layout(tp=2), gpu="h20", engine="gpt-fast", what_if=False)
    cov = h["coverage"]
    assert not cov["covered"] and "h20.ramp_us" in cov["informed_by"] and cov["widened"]["changed"]
    assert "ramp_us.gpt-fast.a100" not in cov["informed_by"]


def test_the_held_out_gpt_fast_rows_are_within_5pct_but_the_published_outlier():
    """The README's Llama-2-70B, Llama-3.1-8B / 70B and Mixtral rows (13, held out from the fit): each within 5% of
    the measured figure except Llama-3.1-70B at TP 2, whose published figure is below the README's own trend (1130.81
    GB/s achieved against Llama-2-70B's 1481.87 at TP 2 with the same layers): +28%."""
    res = [r for r in run() if r.row["engine"] == "gpt-fast" and r.row["id"] not in FIT_ROWS]
    assert len(res) == 13
    errs = {r.row["id"]: r.central / r.measured - 1 for r in res}
    outlier = "llama3.1-70b-bf16-tp2-a100-gpt-fast"
    assert all(abs(e) <= 0.05 for i, e in errs.items() if i != outlier), errs
    assert errs[outlier] > 0.2


def test_compare_model_plans_both_checkpoints_as_the_engine_runs_them():
    """--compare-model's weight bytes per GPU are the engine's (the lm_head whole on every rank for gpt-fast)."""
    from tpcomm.predict.compare import compare_models

    kw = dict(layout=Layout(tp=8), gpu="a100-sxm", what_if=False)
    out = {}
    for e in ("gpt-fast", "vllm-0.6.3"):
        d = predict("llama-3.1-70b", engine=e, **kw)
        out[e] = compare_models("llama-3.1-70b", "qwen2.5-72b", d, d, Layout(tp=8), engine=e)
    read = out["gpt-fast"]["weight_bytes_per_gpu"][0] - 8192 * 2  # less the embedding row of the one token
    assert read / 1e9 == pytest.approx(1129.61 / 58.78, rel=0.002)  # the README's bytes per rank at TP 8
    assert out["gpt-fast"]["weight_bytes_per_gpu"][0] - out["vllm-0.6.3"]["weight_bytes_per_gpu"][0] > 1.8e9
