"""The terms added for issue 19, each checked at two TP degrees with its source string: the engine's host time per
step, eager engines' max(launch, GPU), the GEMM ramp (kernel efficiency falling with the bytes per kernel), the KV
efficiency, the fixed MoE cost per layer by kernel backend and dtype, and the AWQ-GEMM kernel factor."""

from __future__ import annotations

import math

import pytest

from tpcomm.plan import build_plan
from tpcomm.plan.weights import kv_read_bytes, weight_components
from tpcomm.predict import Layout, predict
from tpcomm.predict.engine import HOST, HOST_TP, HOST_TP_NONE, resolve_engine
from tpcomm.predict.hardware import load_profile
from tpcomm.predict.kernels import MOE_LAYER_US, RAMP_US, effective_efficiency
from tpcomm.predict.latency import LatencySource
from tpcomm.predict.model import Knobs, kernels_per_step, step_time

ZERO = LatencySource("zero", "", lambda op, b, n: 0.0)


def _ss(model, tp, gpu, **kw):
    return predict(model, Layout(tp=tp), gpu=gpu, what_if=False, **kw)


@pytest.mark.parametrize(
    "engine,runner,source_needle",
    [
        ("vllm-0.32", "vllm-v1-async", "vLLM PR 11133"),
        ("vllm-0.32-no-async", "vllm-v1", "vLLM V1 blog"),
        ("vllm-0.10", "vllm-v1", "vLLM V1 blog"),
        ("vllm-0.6.3", "vllm-v0", "Qwen2.5 speed benchmark"),
        ("sglang-0.4.6", "sglang-overlap", "SGLang v0.4"),
        ("sglang-0.3", "sglang", "SGLang before 0.4"),
    ],
)
def test_host_term_per_engine_at_two_tp_degrees_names_its_source(engine, runner, source_needle):
    lo, c, hi, _ = HOST[runner]
    # it grows by log2(TP) x HOST_TP where the engine does not overlap its workers' broadcast, else it is flat
    tlo, tc, thi, _ = HOST_TP.get(runner, HOST_TP_NONE)
    for tp in (2, 8):
        f = math.log2(tp)
        d = _ss("llama-3.1-70b", tp, "h100-sxm", engine=engine)
        assert d["engine"]["runner"] == runner
        assert d["single_stream"]["breakdown_ms"]["host"] == pytest.approx(c + f * tc)
        h = d["range"]["inputs"]["host_ms"]
        assert (h["low"], h["central"], h["high"]) == pytest.approx((lo + f * tlo, c + f * tc, hi + f * thi))
        assert source_needle in h["source"]
        assert sum(d["single_stream"]["breakdown_ms"].values()) == pytest.approx(d["single_stream"]["ms_per_token"])


def test_default_engine_is_the_installed_vllm():
    eng = resolve_engine(None)
    assert eng.family == "vllm" and eng.version == "0.32.0" and eng.runner == "vllm-v1-async"
    assert any("installed" in n for n in eng.notes)


def test_cpu_platform_forces_async_scheduling_off():
    d = predict("qwen3-32b", Layout(tp=2), gpu="cpu", allreduce_us=50.0, what_if=False)
    assert d["engine"]["runner"] == "vllm-v1" and any("CPU platform" in n for n in d["engine"]["notes"])


def test_eager_engine_takes_the_slower_of_launch_and_gpu_at_two_tp_degrees():
    plan_hw = load_profile("a100-sxm")
    for tp in (2, 4):
        d = _ss("qwen2.5-72b", tp, "a100-sxm", engine="vllm-0.6.3-eager")
        assert d["engine"]["cuda_graphs"] is False and "enforce-eager" in d["range"]["inputs"]["launch_us"]["source"]
        # Recompute: host + max(launch of every kernel and collective, GPU time).
        plan = build_plan("qwen2.5-72b", tp=tp, batches=[1])
        k = Knobs(**{n: v["central"] for n, v in d["range"]["inputs"].items() if n != "collective_latency"})
        gpu = step_time(plan, 1, plan_hw, ZERO, k)
        n_coll = sum(c.count for c in plan.for_batch(1))
        launch = (kernels_per_step(plan.model) + n_coll) * k.launch_us / 1e3
        bd = d["single_stream"]["breakdown_ms"]
        gpu_ms = sum(v for n, v in bd.items() if n not in ("host", "launch_bound"))
        assert bd["launch_bound"] == pytest.approx(max(0.0, launch - gpu_ms))
        assert d["single_stream"]["ms_per_token"] == pytest.approx(k.host_ms + max(launch, gpu_ms))
        assert gpu["step_ms"] > 0
    d = predict("qwen2.5-72b", Layout(tp=4), gpu="a100-sxm", engine="vllm-0.6.3-eager")  # TP 2 does not fit
    w = {x["name"]: x for x in d["what_if"]}
    assert "cuda-graphs" in w and w["cuda-graphs"]["delta_pct"] >= 0 and "async-scheduling" in w


def test_gemm_ramp_lowers_kernel_efficiency_as_tp_grows():
    hw = load_profile("h100-sxm")  # a GPU without a ramp fit: the generic ramp
    eff = {}
    for tp in (2, 8):
        d = _ss("llama-3.1-70b", tp, "h100-sxm")
        ramp = d["range"]["inputs"]["ramp_us"]
        assert (ramp["low"], ramp["central"], ramp["high"]) == RAMP_US[:3] and "geometric mean" in ramp["source"]
        comps = weight_components(build_plan("llama-3.1-70b", tp=tp).model, Layout(tp=tp), 1)
        me = d["range"]["inputs"]["memory_efficiency"]["central"]
        expect = (
            sum(c.bytes_per_gpu for c in comps) / (me * hw["memory_bandwidth_GBps"] * 1e9) * 1e3
            + sum(c.kernels for c in comps) * ramp["central"] / 1e3
        )
        assert d["single_stream"]["breakdown_ms"]["weights"] == pytest.approx(expect)
        eff[tp] = d["single_stream"]["kernel_efficiency"]
    assert eff[8] < eff[2] < 0.8  # smaller shards per kernel: further from the roofline
    assert effective_efficiency(50e6, 0.8, 1792, 1.5) > effective_efficiency(2e6, 0.8, 1792, 1.5)


def test_a100_and_h20_ramps_are_fitted_to_tp1_rows():
    for gpu, needle in (("a100-sxm", "Qwen2.5 0.5B-14B"), ("h20", "Qwen3 dense")):
        inp = _ss("qwen3-32b", 2, gpu)["range"]["inputs"]
        assert "fitted" in inp["ramp_us"]["source"] and needle in inp["memory_efficiency"]["source"]


def test_kv_efficiency_term_at_two_tp_degrees():
    hw = load_profile("a100-sxm")
    for tp in (2, 4):
        d = predict("qwen2.5-72b", Layout(tp=tp), gpu="a100-sxm", knobs=Knobs(context=32768), what_if=False)
        kv = d["range"]["inputs"]["kv_efficiency"]
        assert "Qwen2.5-7B and 14B" in kv["source"]
        m = build_plan("qwen2.5-72b", tp=tp).model
        expect = kv_read_bytes(m, Layout(tp=tp), 32768) / (kv["central"] * hw["memory_bandwidth_GBps"] * 1e9) * 1e3
        assert d["single_stream"]["breakdown_ms"]["kv_cache"] == pytest.approx(expect)


def test_moe_fixed_cost_by_backend_and_dtype_tells_int4_and_nvfp4_apart():
    for tp in (4, 8):
        i4 = _ss("kimi-k2.5", tp, "rtx-pro-6000")
        fp4 = _ss("kimi-k2.5-nvfp4", tp, "rtx-pro-6000")
        mi, mf = i4["range"]["inputs"]["moe_layer_us"], fp4["range"]["inputs"]["moe_layer_us"]
        assert mi["backend"] == "default" and mf["backend"] == "nvfp4-sm12"
        assert "rtx6kpro" in mf["source"] and mf["central"] == MOE_LAYER_US["nvfp4-sm12"][1]
        # 60 MoE layers x the per-layer cost, the same at every TP; everything else identical.
        assert fp4["single_stream"]["breakdown_ms"]["moe_layers"] == pytest.approx(60 * mf["central"] / 1e3)
        gap = fp4["single_stream"]["ms_per_token"] - i4["single_stream"]["ms_per_token"]
        assert gap == pytest.approx(60 * (mf["central"] - mi["central"]) / 1e3)
    # Off SM 12.x there is no measurement of the NVFP4 path: the default range, and the output says which.
    assert _ss("kimi-k2.5-nvfp4", 8, "b200")["range"]["inputs"]["moe_layer_us"]["backend"] == "default"


def test_mxfp4_on_ampere_and_sglang_gptq_moe_costs_are_fitted_rows():
    oss = _ss("gpt-oss-120b", 2, "a100-sxm", engine="vllm-0.10")["range"]["inputs"]["moe_layer_us"]
    assert oss["backend"] == "mxfp4-sm8" and "vLLM issue 22331" in oss["source"]
    cfg = {**__import__("tpcomm.models", fromlist=["load_config"]).load_config("qwen3-235b-a22b")[0]}
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    g = _ss(cfg, 4, "h20", engine="sglang-0.4.6")["range"]["inputs"]["moe_layer_us"]
    assert g["backend"] == "sglang-gptq-moe" and "14.69 tok/s" in g["source"]


def test_awq_gemm_kernel_factor_only_before_awq_marlin():
    from tpcomm.models import load_config

    cfg, _, _ = load_config("qwen2-72b")
    cfg = {**cfg, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}}
    for tp in (2, 4):
        old = _ss(cfg, tp, "a100-sxm", engine="vllm-0.4.2")
        new = _ss(cfg, tp, "a100-sxm", engine="vllm-0.6.3")
        q = old["range"]["inputs"]["quant_kernel_factor"]
        assert "vLLM PR 6612" in q["source"] and q["central"] == 0.43
        assert "quant_kernel_factor" not in new["range"]["inputs"]
        # Only the quantized GEMMs' bytes slow down: lm_head and embeddings stay BF16.
        d_ms = old["single_stream"]["breakdown_ms"]["weights"] - new["single_stream"]["breakdown_ms"]["weights"]
        qb = sum(
            c.bytes_per_gpu
            for c in weight_components(build_plan(cfg, tp=tp).model, Layout(tp=tp), 1)
            if c.bits_per_weight < 16
        )
        me = old["range"]["inputs"]["memory_efficiency"]["central"]
        assert d_ms == pytest.approx(qb * (1 / 0.43 - 1) / (me * 2039e9) * 1e3)
