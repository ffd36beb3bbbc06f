"""The analytic per-token decode model.

    step time = host (the engine's own work per step, engine.py)
              + GPU time, or for eager engines max(kernel launch time, GPU time)
    GPU time  = sum over weight GEMMs of bytes / (memory efficiency x bandwidth) + ramp   [or compute, if larger]
              + KV / attention-state bytes read / (KV efficiency x bandwidth)
              + sum over collectives of count x latency(op, bytes)
              + kernels per step x launch gap
              + MoE layers x fixed cost per MoE layer (by kernel backend and dtype, kernels.py)
              + stated extra terms (fitted MoE-kernel penalties)

Units: *_ms milliseconds, *_us microseconds, bytes, GB/s = 1e9 B/s, tok/s.

Defaults and their sources (also in `tpcomm predict --help`); the uncertain ones are ranges (ranges.py), these
are their central values:
- memory efficiency 0.8 (range 0.7-0.85, or the profile's): achieved fraction of datasheet DRAM bandwidth for
  large streaming reads (assumption; H20's range is fitted to public TP-1 rows, see its profile).
- ramp 1.5 us per GEMM kernel (0.5-3), launch gap 1 us per kernel (0.5-2), MoE fixed cost per layer: kernels.py.
- host per step: the engine's (engine.py).
- kernels per layer: counted from vLLM 0.32's decode path (KERNELS below).
- compute efficiency 0.5 of dense BF16 peak for decode GEMMs (assumption).
- context 1024 tokens per sequence for KV reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpcomm.models.spec import ModelSpec
from tpcomm.plan import Plan
from tpcomm.plan.layout import Layout
from tpcomm.plan.weights import kv_read_bytes, weight_components
from tpcomm.predict.latency import LatencySource

DEFAULT_MEMORY_EFFICIENCY = 0.8
DEFAULT_KERNEL_OVERHEAD_US = 1.0  # launch gap per kernel (kernels.LAUNCH_GAP_US central)
DEFAULT_COMPUTE_EFFICIENCY = 0.5
DEFAULT_CONTEXT = 1024

# Kernels per decode step by site (vLLM 0.32 decode path, fused ops counted once; collectives excluded).
KERNELS = {
    "mla_attention": 14,  # fused add+norm, fused_qkv_a GEMM, q_a/kv_a norms (2), q_b GEMM, rope, W_UK bmm, concat, MLA decode (2), W_UV bmm, o_proj GEMM, cache write, residual
    "gqa_attention": 8,  # fused add+norm, qkv GEMM, (q/k norm), rope, cache write, attention decode, o_proj GEMM, residual
    "linear_attention": 9,  # fused add+norm, in_proj_qkvz GEMM, in_proj_ba GEMM, conv1d update, gated delta rule, gated norm, out_proj GEMM, gating, residual
    "dense_mlp": 4,  # fused add+norm, gate_up GEMM, act_and_mul, down GEMM
    "moe": 10,  # router GEMM, grouped top-k, shared gate_up/act/down (3), align, fused_moe w13, act, w2, sum
    "head": 5,  # final norm, lm_head GEMM, gather/slice, sampler (2)
}


@dataclass
class Knobs:
    # None: the range of ranges.py (the profile's, the engine's, else the defaults); a value: fixed, as given.
    memory_efficiency: float | None = None
    kernel_overhead_us: float | None = None  # launch gap per kernel
    ramp_us: float | None = None  # per GEMM kernel
    host_ms: float | None = None  # per decode step (engine)
    moe_layer_us: float | None = None  # per MoE layer (kernel backend)
    kv_efficiency: float | None = None  # fraction of datasheet bandwidth decode attention reads the KV at
    quant_kernel_factor: float | None = None  # x memory efficiency for quantized GEMMs on a slow kernel (kernels.py)
    launch_us: float | None = None  # eager engines: host launch cost per kernel
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    context: int = DEFAULT_CONTEXT
    moe_penalty_us: float = 0.0  # per MoE layer per step (user-given extra term)
    moe_bw_factor: float = 1.0  # routed-expert streaming takes this many times its roofline time


def kernels_per_step(m: ModelSpec) -> float:
    if m.attention == "mla":
        attn = m.num_layers * KERNELS["mla_attention"]
    else:
        n_lin = m.layers_of("linear")
        attn = (m.num_layers - n_lin) * KERNELS["gqa_attention"] + n_lin * KERNELS["linear_attention"]
    return attn + len(m.dense_layers) * KERNELS["dense_mlp"] + len(m.moe_layers) * KERNELS["moe"] + KERNELS["head"]
    # with PP the stages run in sequence for one token: all kernels are on the path


def _v(x, default):
    return default if x is None else x


def step_time(plan: Plan, batch: int, hw: dict, lat: LatencySource, k: Knobs, eager: bool = False) -> dict:
    """One decode step at `batch` sequences: breakdown in ms (the terms sum to step_ms) and throughput.
    Unset knobs take their central defaults; `eager`: no CUDA graphs (max(launch, GPU) per step)."""
    m, lay = plan.model, plan.layout
    e_max = _v(k.memory_efficiency, DEFAULT_MEMORY_EFFICIENCY)
    ramp_us = _v(k.ramp_us, 1.5)
    bw = hw["memory_bandwidth_GBps"] * 1e9 * e_max  # B/s
    comps = weight_components(m, lay, batch, plan.vocab_parallel)
    # Components cover all layers. With PP each stage's GPU reads 1/pp of them, but the
    # stages run one after another for a token, so the path reads the whole sum.
    routed = sum(c.bytes_per_gpu for c in comps if c.sharding == "expert")
    total_bytes = sum(c.bytes_per_gpu for c in comps)
    n_gemm = sum(c.kernels for c in comps)
    # Quantized GEMMs on a slower kernel (kernels.WEIGHT_KERNEL) read their bytes at a fraction of e_max.
    slow = _v(k.quant_kernel_factor, 1.0)
    q_bytes = sum(c.bytes_per_gpu for c in comps if c.bits_per_weight < m.quant.base_bits) if slow != 1.0 else 0.0
    weights_ms = ((total_bytes - q_bytes) + q_bytes / slow) / bw * 1e3 + n_gemm * ramp_us / 1e3
    params_active = sum(c.params_per_gpu for c in weight_components(m, lay, 1, plan.vocab_parallel))
    compute_ms = 2 * params_active * batch / (hw["bf16_tflops"] * 1e12 * k.compute_efficiency) * 1e3
    kv_bw = hw["memory_bandwidth_GBps"] * 1e9 * _v(k.kv_efficiency, e_max)
    kv_ms = batch * kv_read_bytes(m, lay, k.context) / kv_bw * 1e3
    coll_us = 0.0
    per_site = []
    n_coll = 0
    for c in plan.for_batch(batch):
        t = lat(c.op, c.bytes, c.group_size)
        coll_us += c.count * t
        n_coll += c.count
        per_site.append(
            {"op": c.op, "site": c.site, "bytes": c.bytes, "count": c.count, "latency_us": t, "time_us": c.count * t}
        )
    n_kernels = kernels_per_step(m)
    overhead_ms = n_kernels * _v(k.kernel_overhead_us, DEFAULT_KERNEL_OVERHEAD_US) / 1e3
    extra = {}
    if m.moe_layers:
        extra["moe_layers"] = len(m.moe_layers) * _v(k.moe_layer_us, 5.0) / 1e3
    if k.moe_penalty_us:
        extra["moe_kernel_penalty"] = len(m.moe_layers) * k.moe_penalty_us / 1e3
    if k.moe_bw_factor != 1.0:
        extra["moe_kernel_bandwidth"] = (k.moe_bw_factor - 1.0) * routed / bw * 1e3
    mem_ms = weights_ms + kv_ms
    bound = "memory" if mem_ms >= compute_ms else "compute"
    breakdown = {
        "weights": max(weights_ms, compute_ms - kv_ms) if bound == "compute" else weights_ms,
        "kv_cache": kv_ms,
        "collectives": coll_us / 1e3,
        "overhead": overhead_ms,
        **extra,
    }
    gpu_ms = sum(breakdown.values())
    launch_ms = 0.0
    if eager:
        # The CPU launches every kernel and collective; the GPU runs behind it: the slower of the two sets the step.
        launch_ms = (n_kernels + n_coll) * _v(k.launch_us, 6.0) / 1e3
        breakdown["launch_bound"] = max(0.0, launch_ms - gpu_ms)
        if breakdown["launch_bound"] > 0:
            bound = "host-launch"
    breakdown["host"] = _v(k.host_ms, 0.0)
    total = sum(breakdown.values())
    return {
        "batch": batch,
        "step_ms": total,
        "tok_per_s": batch * 1e3 / total,
        "ms_per_token": total,
        "bound": bound,
        "compute_ms": compute_ms,
        "gpu_ms": gpu_ms,
        "launch_ms": launch_ms,
        "kernel_efficiency": (total_bytes / (hw["memory_bandwidth_GBps"] * 1e9) * 1e3) / weights_ms
        if weights_ms
        else None,
        "breakdown_ms": breakdown,
        "collectives": sorted(per_site, key=lambda r: -r["time_us"]),
    }


def fits_memory(m: ModelSpec, layout: Layout, hw: dict, vocab_parallel: bool = True) -> tuple[bool, float]:
    """Weights stored per GPU (all experts) against 90% of its memory (`vocab_parallel`: Plan.vocab_parallel)."""
    # Only TP and EP shard the weights here (as before: dp/pp/dcp left at 1, every layer counted).
    lay = Layout(tp=layout.tp, ep=layout.ep)
    # A batch large enough that every expert is touched: the components then cover every stored weight,
    # plus the full embedding shard (not counted by the per-step reads).
    comps = weight_components(m, lay, batch=10**7, vocab_parallel=vocab_parallel)
    stored = sum(c.bytes_per_gpu for c in comps)
    return stored <= 0.9 * hw["memory_GB"] * 1e9, stored
