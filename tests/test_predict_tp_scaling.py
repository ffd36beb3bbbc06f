"""How `tpcomm predict` scales with TP against every public TP sweep in the validation table: per sweep, the
predicted speedup (central values) from its lowest to its highest TP within 20% of the measured one. The rows
are in tpcomm/predict/data/validation.json with their sources; a sweep whose rows set a constant says so."""

from __future__ import annotations

import pytest

from tpcomm.predict import Layout, predict
from tpcomm.predict.engine import resolve_engine
from tpcomm.predict.validation import load_rows, run

# (sweep, lower-TP row, higher-TP row, fitted: its rows set engine.HOST_TP (vLLM V0's, or TGI 1.0's) or gpt-fast's
# GEMM ramp on A100 (kernels.ENGINE_RAMP_US))
SWEEPS = [
    (
        "vLLM issue 16300, QwQ-32B, A100, vLLM 0.7.2, batch 1, TP 2 -> 8",
        "qwq-32b-bf16-tp2-a100-b1-v0.7",
        "qwq-32b-bf16-tp8-a100-b1-v0.7",
        True,
    ),
    ("vLLM issue 16300, batch 1, TP 2 -> 4", "qwq-32b-bf16-tp2-a100-b1-v0.7", "qwq-32b-bf16-tp4-a100-b1-v0.7", True),
    (
        "vLLM issue 6955, Llama-3.1-70B AWQ, RTX 3090 Ti PCIe, vLLM 0.5.3, C=1, TP 2 -> 4",
        "llama3.1-70b-awq-tp2-3090ti",
        "llama3.1-70b-awq-tp4-3090ti",
        False,
    ),
    ("vLLM issue 6955, C=5, TP 2 -> 4", "llama3.1-70b-awq-tp2-3090ti-c5", "llama3.1-70b-awq-tp4-3090ti-c5", False),
    (
        "vLLM issue 22331, gpt-oss-120b, A100, vLLM 0.10, TP 1 -> 4",
        "gpt-oss-120b-tp1-a100",
        "gpt-oss-120b-tp4-a100",
        False,
    ),
    ("vLLM issue 22331, TP 2 -> 4", "gpt-oss-120b-tp2-a100", "gpt-oss-120b-tp4-a100", False),
    (
        "gpt-fast README, Llama-2-7B bf16, A100 80GB, batch 1, TP 1 -> 8",
        "llama2-7b-bf16-tp1-a100-gpt-fast",
        "llama2-7b-bf16-tp8-a100-gpt-fast",
        True,
    ),
    # held out from gpt-fast's A100 ramp (fitted on the Llama-2-7B sweep above only)
    (
        "gpt-fast README, Llama-2-70B bf16, TP 2 -> 8",
        "llama2-70b-bf16-tp2-a100-gpt-fast",
        "llama2-70b-bf16-tp8-a100-gpt-fast",
        False,
    ),
    (
        "gpt-fast README, Llama-3.1-8B bf16, TP 1 -> 8",
        "llama3.1-8b-bf16-tp1-a100-gpt-fast",
        "llama3.1-8b-bf16-tp8-a100-gpt-fast",
        False,
    ),
    (
        "gpt-fast README, Llama-3.1-70B bf16, TP 2 -> 8 (a known miss, -23%, while the lm_head was taken as sharded)",
        "llama3.1-70b-bf16-tp2-a100-gpt-fast",
        "llama3.1-70b-bf16-tp8-a100-gpt-fast",
        False,
    ),
    (
        "gpt-fast README, Llama-3.1-70B bf16, TP 4 -> 8",
        "llama3.1-70b-bf16-tp4-a100-gpt-fast",
        "llama3.1-70b-bf16-tp8-a100-gpt-fast",
        False,
    ),
    (
        "gpt-fast README, Mixtral-8x7B bf16 (MoE), TP 2 -> 8",
        "mixtral-8x7b-bf16-tp2-a100-gpt-fast",
        "mixtral-8x7b-bf16-tp8-a100-gpt-fast",
        False,
    ),
    (
        "HF SageMaker benchmark, Llama-2-7B fp16, 8x A10G, TGI 1.0.3, batch 1, TP 4 -> 8",
        "llama2-7b-fp16-tp4-a10g-tgi-1.0.3",
        "llama2-7b-fp16-tp8-a10g-tgi-1.0.3",
        True,
    ),
    (
        "HF SageMaker benchmark, Llama-2-7B fp16, 8x A10G, TGI 1.0.3, TP 1 -> 8",
        "llama2-7b-fp16-tp1-a10g-tgi-1.0.3",
        "llama2-7b-fp16-tp8-a10g-tgi-1.0.3",
        True,
    ),
    # held out from the TGI 1.0 host fit (fitted on the Llama-2-7B sweep above only)
    (
        "HF SageMaker benchmark, Llama-2-13B fp16, A10G, TGI 1.0.3, TP 4 -> 8",
        "llama2-13b-fp16-tp4-a10g-tgi-1.0.3",
        "llama2-13b-fp16-tp8-a10g-tgi-1.0.3",
        False,
    ),
]


def _speedups(lo_id: str, hi_id: str) -> tuple[float, float]:
    by = {r.row["id"]: r for r in run([lo_id, hi_id])}
    lo, hi = by[lo_id], by[hi_id]
    assert lo.central and hi.central
    return hi.measured / lo.measured, hi.central / lo.central


@pytest.mark.parametrize("name,lo_id,hi_id,fitted", SWEEPS, ids=[s[0] for s in SWEEPS])
def test_tp_speedup_within_20pct_of_the_public_sweep(name, lo_id, hi_id, fitted):
    measured, predicted = _speedups(lo_id, hi_id)
    err = predicted / measured - 1
    print(
        f"{name}: measured {measured:.2f}x, predicted {predicted:.2f}x ({100 * err:+.0f}%){' [fitted]' if fitted else ''}"
    )
    assert abs(err) <= 0.20, (name, measured, predicted)


@pytest.mark.xfail(
    strict=True,
    reason="known miss: at batch 16 the same QwQ-32B sweep scales 1.44x from TP 2 to TP 8 and predict says 1.74x "
    "with the GPUs taken as A100 SXM (the missed step time: 1.5 / 4.1 / 4.5 ms at TP 2 / 4 / 8); the one other V0 "
    "sweep above batch 1 (issue 6955, C=5) misses by a flat 7.6 ms at TP 2 and 4, so no batch x TP host form fits "
    "both. Taken as A100 PCIe (the issue does not state it) the sweep is within 7% (the next test), but the gpt-oss "
    "A100 sweep, NVLink stated, then needs the SXM growth: the link decides it (docs/predict.md)",
)
def test_tp_speedup_at_batch_16_known_miss():
    measured, predicted = _speedups("qwq-32b-bf16-tp2-a100-b16-v0.7", "qwq-32b-bf16-tp8-a100-b16-v0.7")
    assert abs(predicted / measured - 1) <= 0.20


def test_the_unstated_link_of_the_host_growth_fit_sets_its_low_end():
    """vLLM issue 16300 does not state the A100s' form factor. Taken as PCIe (NCCL at TP 4 and 8) its batch-1 sweep
    fits a host growth of 0.69 ms per doubling (least squares on the log error, as the SXM fit's 1.52), which is
    engine.HOST_TP's low end; and with it the batch-16 sweep, held out, is within 10% (the SXM miss above is +21%)."""
    import math

    from tpcomm.predict.engine import HOST_TP
    from tpcomm.predict.model import Knobs

    rows, _ = load_rows()
    meas = {
        b: {t: _row(rows, f"qwq-32b-bf16-tp{t}-a100-b{b}-v0.7")["measured_tok_per_s"] for t in (2, 4, 8)}
        for b in (1, 16)
    }
    v0 = resolve_engine("vllm-0.7.2")

    def step(gpu, b, t):  # the step without the host term (given as 0): the host term is added below
        d = predict(
            "qwen2.5-32b",
            Layout(tp=t),
            gpu=gpu,
            engine="vllm-0.7.2",
            batches=[b],
            knobs=Knobs(context=100, host_ms=0.0),
            what_if=False,
        )
        return next(x for x in d["batches"] if x["batch"] == b)["step_ms"]

    def fit(gpu):
        base = {(b, t): step(gpu, b, t) for b in (1, 16) for t in (2, 4, 8)}

        def tok(b, t, g):
            return b * 1e3 / (base[b, t] + v0.host_ms[1] + g * math.log2(t))

        g = min(
            (sum(math.log(tok(1, t, x / 1000) / meas[1][t]) ** 2 for t in (2, 4, 8)), x / 1000) for x in range(3001)
        )[1]
        return g, tok(16, 8, g) / tok(16, 2, g) / (meas[16][8] / meas[16][2]) - 1

    g_sxm, err_sxm = fit("a100-sxm")
    g_pcie, err_pcie = fit("a100-pcie")
    assert g_sxm == pytest.approx(HOST_TP["vllm-v0"][1], abs=0.006)
    assert g_pcie == pytest.approx(HOST_TP["vllm-v0"][0], abs=0.006) and g_pcie < 0.5 * g_sxm
    assert abs(err_pcie) <= 0.10 < err_sxm


def _row(rows, i):
    return next(r for r in rows if r["id"] == i)


def test_host_term_grows_with_tp_only_where_the_engine_does_not_overlap_it():
    v0, asy = resolve_engine("vllm-0.7.2"), resolve_engine("vllm-0.32")
    assert v0.host_at(8)[0][1] == pytest.approx(v0.host_ms[1] + 3 * v0.host_tp_ms[1])
    assert v0.host_at(1)[0] == v0.host_ms
    assert asy.host_at(8)[0] == asy.host_ms  # async scheduling overlaps it (stated as an assumption)
    d2, d8 = (predict("qwen2.5-32b", Layout(tp=t), gpu="a100-sxm", engine="vllm-0.7.2", what_if=False) for t in (2, 8))
    h2, h8 = (d["single_stream"]["breakdown_ms"]["host"] for d in (d2, d8))
    assert h8 - h2 == pytest.approx(2 * v0.host_tp_ms[1])
    assert "log2(8)" in d8["range"]["inputs"]["host_ms"]["source"]
    # the TP what-if carries the host term of its own TP: TP 8 -> TP 2 saves the growth
    d = predict("qwen2.5-32b", Layout(tp=8), gpu="a100-sxm", engine="vllm-0.7.2")
    tp2 = next(w for w in d["what_if"] if w["name"] == "tp2")
    assert tp2["breakdown_ms"]["host"] == pytest.approx(h2)
    # a given --host-ms is the whole term, at every TP
    from tpcomm.predict.model import Knobs

    g = predict(
        "qwen2.5-32b", Layout(tp=8), gpu="a100-sxm", engine="vllm-0.7.2", knobs=Knobs(host_ms=1.0), what_if=False
    )
    assert g["single_stream"]["breakdown_ms"]["host"] == 1.0


TGI_FIT_ROWS = {
    "llama2-7b-fp16-tp1-a10g-tgi-1.0.3",
    "llama2-7b-fp16-tp4-a10g-tgi-1.0.3",
    "llama2-7b-fp16-tp8-a10g-tgi-1.0.3",
}


def test_tgi_1_0_host_term_is_fitted_on_one_sweep_and_reproduced_from_its_rows():
    """TGI 1.0.x's host term and its growth with TP (engine.HOST / HOST_TP['tgi-1.0']) are fitted on the Llama-2-7B
    A10G sweep only (the 13B, 70B and A100 40GB rows of the same benchmark stay held out): least squares on the log
    error of host + log2(TP) x growth; other TGI versions keep the stated assumption."""
    import math

    from tpcomm.predict.validation import load_rows, predict_for_row

    e, later = resolve_engine("tgi-1.0.3-eager"), resolve_engine("tgi-2.4")
    assert e.runner == "tgi-1.0" and e.host_source.startswith("TGI 1.0.x") and "fitted" in e.host_source
    assert e.host_tp_source.startswith("fitted") and e.host_tp_ms[1] > 2 * resolve_engine("vllm-0.7.2").host_tp_ms[1]
    assert later.runner == "tgi" and "assumption" in later.host_source
    rows, q = load_rows()
    fitting = [r for r in rows if {"host.tgi-1.0", "host_tp.tgi-1.0"} & set(r.get("fits") or [])]
    assert {r["id"] for r in fitting} == TGI_FIT_ROWS and all(r["fitted"] for r in fitting)

    def step_ms(r, host_ms):  # the whole host term given (--host-ms): the step is linear in it
        return predict_for_row(r, q, host_ms=host_ms)["single_stream"]["ms_per_token"]

    g = {r["id"]: step_ms(r, 0.0) for r in fitting}

    def loss(h, t):
        return sum(
            math.log(r["measured_tok_per_s"] * (g[r["id"]] + h + t * math.log2(r["tp"])) / 1e3) ** 2 for r in fitting
        )

    _, h, t = min((loss(a / 100, b / 100), a / 100, b / 100) for a in range(0, 301) for b in range(200, 501))
    assert h == pytest.approx(e.host_ms[1], abs=0.011) and t == pytest.approx(e.host_tp_ms[1], abs=0.011)
