"""The analytic per-token decode model.

    step time = weight bytes / (memory efficiency x memory bandwidth)   [or compute, if larger]
              + KV bytes read / (memory efficiency x memory bandwidth)
              + sum over collectives of count x latency(op, bytes)
              + kernels per step x per-kernel overhead
              + stated extra terms (MoE-kernel penalty)

Units: *_ms milliseconds, *_us microseconds, bytes, GB/s = 1e9 B/s, tok/s.

Defaults and their sources (also in `tpcomm predict --help`); the uncertain
ones are ranges (ranges.py), these are their central values:
- memory efficiency 0.8 (range 0.7-0.85): typical achievable fraction of
  datasheet DRAM bandwidth for large streaming reads (assumption).
- per-kernel overhead 3 us (range 1-5 us): CUDA-graph launch gap (~1 us) plus
  the ramp and tail of decode kernels too small to reach the bandwidth
  roofline (assumption, the dominant uncertainty; `tpcomm attribute` measures it).
- kernels per layer: counted from vLLM 0.32's decode path (KERNELS below).
- compute efficiency 0.5 of dense BF16 peak for decode GEMMs (assumption).
- context 1024 tokens per sequence for KV reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpcomm.models.spec import ModelSpec
from tpcomm.plan import Plan
from tpcomm.plan.layout import Layout
from tpcomm.plan.weights import kv_bytes_per_token, weight_components
from tpcomm.predict.latency import LatencySource

DEFAULT_MEMORY_EFFICIENCY = 0.8
DEFAULT_KERNEL_OVERHEAD_US = 3.0
DEFAULT_COMPUTE_EFFICIENCY = 0.5
DEFAULT_CONTEXT = 1024

# Kernels per decode step by site (vLLM 0.32 decode path, fused ops counted once; collectives excluded).
KERNELS = {
    "mla_attention": 14,  # fused add+norm, fused_qkv_a GEMM, q_a/kv_a norms (2), q_b GEMM, rope, W_UK bmm, concat, MLA decode (2), W_UV bmm, o_proj GEMM, cache write, residual
    "gqa_attention": 8,  # fused add+norm, qkv GEMM, (q/k norm), rope, cache write, attention decode, o_proj GEMM, residual
    "dense_mlp": 4,  # fused add+norm, gate_up GEMM, act_and_mul, down GEMM
    "moe": 10,  # router GEMM, grouped top-k, shared gate_up/act/down (3), align, fused_moe w13, act, w2, sum
    "head": 5,  # final norm, lm_head GEMM, gather/slice, sampler (2)
}


@dataclass
class Knobs:
    # None: the range of ranges.py (the profile's, else the defaults); a value: fixed, as given.
    memory_efficiency: float | None = None
    kernel_overhead_us: float | None = None
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    context: int = DEFAULT_CONTEXT
    moe_penalty_us: float = 0.0  # per MoE layer per step (user-given extra term)
    moe_bw_factor: float = 1.0  # routed-expert streaming takes this many times its roofline time


def kernels_per_step(m: ModelSpec) -> float:
    attn = KERNELS["mla_attention"] if m.attention == "mla" else KERNELS["gqa_attention"]
    n = (
        m.num_layers * attn
        + len(m.dense_layers) * KERNELS["dense_mlp"]
        + len(m.moe_layers) * KERNELS["moe"]
        + KERNELS["head"]
    )
    return n  # with PP the stages run in sequence for one token: all kernels are on the path


def step_time(plan: Plan, batch: int, hw: dict, lat: LatencySource, k: Knobs) -> dict:
    """One decode step at `batch` sequences: breakdown in ms and throughput."""
    m, lay = plan.model, plan.layout
    bw = hw["memory_bandwidth_GBps"] * 1e9 * k.memory_efficiency  # B/s
    comps = weight_components(m, lay, batch)
    # Components cover all layers. With PP each stage's GPU reads 1/pp of them, but the
    # stages run one after another for a token, so the path reads the whole sum.
    routed = sum(c.bytes_per_gpu for c in comps if c.sharding == "expert")
    other = sum(c.bytes_per_gpu for c in comps if c.sharding != "expert")
    weights_ms = (other + routed) / bw * 1e3
    params_active = sum(c.params_per_gpu for c in weight_components(m, lay, 1))
    compute_ms = 2 * params_active * batch / (hw["bf16_tflops"] * 1e12 * k.compute_efficiency) * 1e3
    kv = kv_bytes_per_token(m, lay)
    kv_ms = batch * k.context * kv["bytes_per_token_per_gpu"] * lay.pp / bw * 1e3
    coll_us = 0.0
    per_site = []
    for c in plan.for_batch(batch):
        t = lat(c.op, c.bytes, c.group_size)
        coll_us += c.count * t
        per_site.append(
            {"op": c.op, "site": c.site, "bytes": c.bytes, "count": c.count, "latency_us": t, "time_us": c.count * t}
        )
    overhead_ms = kernels_per_step(m) * k.kernel_overhead_us / 1e3
    extra = {}
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
    total = sum(breakdown.values())
    return {
        "batch": batch,
        "step_ms": total,
        "tok_per_s": batch * 1e3 / total,
        "ms_per_token": total,
        "bound": bound,
        "compute_ms": compute_ms,
        "breakdown_ms": breakdown,
        "collectives": sorted(per_site, key=lambda r: -r["time_us"]),
    }


def fits_memory(m: ModelSpec, layout: Layout, hw: dict) -> tuple[bool, float]:
    """Weights stored per GPU (all experts) against 90% of its memory."""
    # Only TP and EP shard the weights here (as before: dp/pp/dcp left at 1, every layer counted).
    lay = Layout(tp=layout.tp, ep=layout.ep)
    # A batch large enough that every expert is touched: the components then cover every stored weight,
    # plus the full embedding shard (not counted by the per-step reads).
    comps = weight_components(m, lay, batch=10**7)
    stored = sum(c.bytes_per_gpu for c in comps)
    return stored <= 0.9 * hw["memory_GB"] * 1e9, stored
