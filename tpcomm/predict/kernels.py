"""GPU-side costs of a decode step that weight bytes alone do not show, each a range with its source.

- Kernel efficiency falls with the bytes one kernel reads: a GEMM of b bytes takes
  b / (memory efficiency x bandwidth) + ramp, the ramp being the time to fill the GPU and drain the tail, a
  fixed cost per kernel (RAMP_US). So a kernel reads at an effective fraction
  e(b) = e_max x b / (b + ramp x e_max x bandwidth) of the bandwidth, which falls as TP shrinks each shard:
  at 1.5 us of ramp on a 1792 GB/s GPU, a 2 MB shard reaches ~40% of e_max and a 50 MB shard ~95%.
- Launch gap (the per-kernel overhead input): the idle time between consecutive kernels replayed from a CUDA
  graph, every kernel of the step.
- A fixed cost per MoE layer by kernel backend and weight dtype (MOE_LAYER_US): routing, alignment and the
  grouped GEMM's per-expert tiles at batch 1 cost time that the expert bytes do not show, and some paths
  (W4A4 NVFP4 on SM 12.x, SGLang 0.4's GPTQ-Marlin MoE) cost far more. The INT4 (Marlin W4A16) and NVFP4
  checkpoints of one model read the same bytes and issue the same collectives, so this term is what predicts
  them apart.

Units: *_us microseconds, bytes, GB/s = 1e9 B/s.
"""

from __future__ import annotations

import re

from tpcomm.models.spec import ModelSpec

RAMP_US = (
    1.0,
    9.5,
    23.0,
    "fixed cost per weight GEMM at batch 1 (fill the GPU, drain the tail; as fitted it also carries the fixed cost "
    "of the layer's other kernels, which TP-1 data cannot tell apart and which does not shrink with TP either): "
    "not fitted for this GPU. Three GPU/engine pairs are fitted to public rows (H20 + SGLang 0.4.6: 6.5 us, 4-9; "
    "A100 + vLLM 0.6.3: 15.5 us, 10.5-23; RTX PRO 6000 + vLLM 0.17: 8.5 us, 1-12.6; profiles h20, a100-*, "
    "rtx-pro-6000*): central = their geometric mean, high = the highest fitted, low = 1 us (assumption: a newer "
    "stack may fuse or shorten these kernels below any fit)",
)
# A GEMM ramp fitted for one engine on one GPU (family, GPU group of coverage.GPU_GROUPS): it replaces the GPU's
# ramp (fitted on another engine's rows) for that engine; the constant's name in validation.json's `fits` is
# engine_ramp_constant(family, group).
ENGINE_RAMP_US = {
    ("gpt-fast", "a100"): (
        5.0,
        7.4,
        11.0,
        "fitted for gpt-fast on A100: Llama-2-7B bf16 at TP 1 / 2 / 4 / 8 on 8x A100 80GB, batch 1 (gpt-fast README "
        "@6ecad9b, rows marked fitted in validation.json: 104.9 / 168.84 / 254.02 / 328.43 tok/s), least squares on "
        "the log error with the A100's memory efficiency and the lm_head on every rank (engine.Engine.vocab_parallel): "
        "7.4 us per weight GEMM as the model counts them (vLLM's fused layout, 4 a dense layer; gpt-fast runs w1 and "
        "w3 apart, 5) against vLLM 0.6.3's 15.5 on the same GPU (torch.compile fuses the layer's small kernels into "
        "fewer); the range keeps the A100 fit's relative width. Held out: the README's Llama-2-70B, "
        "Llama-3.1-8B and -70B and Mixtral-8x7B rows",
    ),
}


def engine_ramp_constant(family: str, group: str) -> str:
    return f"ramp_us.{family}.{group}"


KV_EFFICIENCY = (
    0.3,
    0.45,
    0.6,
    "fitted: decode attention at batch 1 reads the KV cache at 0.3-0.6 of datasheet bandwidth: Qwen2.5-7B and 14B "
    "at 31-65k context at TP 1 on one A100 with vLLM 0.6.3 (Qwen2.5 speed benchmark, rows marked fitted in "
    "validation.json), given that GPU's fitted weight efficiency and ramp",
)
LAUNCH_GAP_US = (
    0.5,
    1.0,
    2.0,
    "assumption: idle time between consecutive kernels replayed from a CUDA graph (launch gap only; the ramp of "
    "small kernels is the separate ramp term); tpcomm attribute measures the whole step",
)
# us per MoE layer per decode step at batch 1, beyond the experts' bytes and the kernels counted in KERNELS.
MOE_LAYER_US = {
    "default": (
        0.0,
        5.0,
        15.0,
        "assumption: routing (top-k), moe_align_block_size and the sum are counted as kernels; the grouped "
        "GEMM's per-expert tiles at batch 1 run below the roofline by 0-15 us per layer (Triton fused_moe for "
        "BF16/FP8, Marlin for INT4 W4A16 / MXFP4)",
    ),
    "nvfp4-sm12": (
        11.8,
        16.8,
        21.8,
        "fitted: NVFP4 W4A4 MoE on SM 12.x (per-token FP4 activation quantization + CUTLASS FP4 grouped GEMM) "
        "measured 78.5-80.5 tok/s against 104.4 tok/s for the AWQ W4A16 checkpoint of the same model "
        "(Qwen3.5-397B-A17B, 4x RTX PRO 6000 Server, TP 4, vLLM 0.17, batch 1: "
        "github.com/local-inference-lab/rtx6kpro benchmarks/inference-throughput, rows marked fitted in "
        "validation.json): 16.8 us more per MoE layer than the model's own NVFP4/AWQ difference (the NVFP4 "
        "checkpoint also reads more bytes: its attention and shared experts stay BF16), refitted on the ratio of "
        "the two by tpcomm/predict/loso.py; +-30% (the earlier hand fit on the raw time difference, 47-53 us, "
        "counted those bytes twice)",
    ),
    "mxfp4-sm8": (
        65.0,
        90.0,
        115.0,
        "fitted: gpt-oss-120b (MXFP4 experts: Marlin MXFP4 MoE and Triton attention with sinks on Ampere) ran at 90 "
        "tok/s at TP 1 on one A100 80GB with vLLM's gptoss image (vLLM issue 22331, row marked fitted): ~90 us "
        "per MoE layer beyond its bytes and kernels (+-25 us: the A100 fit's own spread)",
    ),
    "mla-fp8-sglang-early": (
        240.0,
        400.0,
        560.0,
        "fitted: DeepSeek-V3 (MLA, block FP8) on SGLang 0.4.1.post2 at TP 8 measured 30.29 tok/s at batch 1, input "
        "128, output 256, CUDA graphs and tuned FP8 GEMMs (sglang PR 2643, 2024-12-29; 8x H200 inferred: the "
        "maintainers' own DeepSeek-V3 setup then, and the FP8 checkpoint does not fit 8x 80 GB; row marked "
        "fitted): ~400 us per MoE layer beyond its bytes and kernels. It carries the whole early path, which "
        "TP-8 batch-1 data cannot split: Triton MLA decode before FlashInfer MLA (a maintainer, sglang issue "
        "3196, 2025-01-29: 'wait for next version's flashinfer'), the Triton block-FP8 fused MoE and GEMMs. "
        "+-40%: one row, its GPU inferred (sglang issue 3196 on a stated 8x H200 is consistent: 'order 13' "
        "words/s with 2 s of TTFT in each 64-token request)",
    ),
    "mla-vllm-no-mla-kernel": (
        0.0,
        400.0,
        1500.0,
        "not covered by any measurement: vLLM before 0.7.1 ran DeepSeek-V3-architecture models without an MLA "
        "kernel (attention expanded to per-head K/V) and with Triton block-FP8 kernels; no public batch-1 "
        "figure with its load stated. Widened to span the modern path's cost (0) and the one rough report, "
        "~10 tok/s on 8x H200 TP 8 with vLLM 0.6.6, load not stated (deepseek-ai/DeepSeek-V3 issue 24; row "
        "held out, approximate); central the early SGLang fit",
    ),
    "sglang-gptq-moe": (
        450.0,
        560.0,
        700.0,
        "fitted: SGLang 0.4.6's GPTQ-Marlin MoE path measured 14.69 tok/s for Qwen3-235B-A22B GPTQ-INT4 against "
        "71.65 tok/s for its FP8 checkpoint at TP 4 on 4x H20 (Qwen3 speed benchmark; the publisher notes that "
        "GPTQ-INT4 in SGLang needs improvement; row marked fitted): ~0.56 ms more per MoE layer",
    ),
}

# The validation rows (tpcomm/predict/data/validation.json ids) that informed each MoE backend's range: fitted
# on them, or (default) checked by them; an empty list: no public measurement covers the backend's engine version.
MOE_ROWS = {
    "default": ["qwen3-30b-a3b-tp1-h20", "qwen3-30b-a3b-tp1-a100", "qwen3-235b-a22b-fp8-tp4-h20"],
    "nvfp4-sm12": [
        "qwen3.5-397b-nvfp4-tp4-rtx-pro-6000-server",
        "qwen3.5-397b-nvfp4-lukealonso-tp4-rtx-pro-6000-server",
    ],
    "mxfp4-sm8": ["gpt-oss-120b-tp1-a100"],
    "mla-fp8-sglang-early": ["deepseek-v3-fp8-tp8-h200-sglang-0.4.1"],
    "mla-vllm-no-mla-kernel": [],
    "sglang-gptq-moe": ["qwen3-235b-a22b-gptq4-tp4-h20"],
}


# Weight GEMM kernels that read quantized weights below the streaming efficiency of the others: a factor on
# the memory efficiency of the quantized layers' bytes (low, central, high, source).
WEIGHT_KERNEL = {
    "awq-gemm": (
        0.3,
        0.43,
        0.55,
        "fitted: vLLM before 0.5.3 ran AWQ checkpoints on its own AWQ GEMM kernel (AWQ-Marlin came with vLLM PR "
        "6612, July 2024): Qwen2-7B AWQ ran at 96.65 tok/s against 143.40 for GPTQ-Int4 (GPTQ-Marlin) at TP 1 on "
        "one A100 with vLLM 0.4.2 (Qwen2 speed benchmark, rows marked fitted): 0.43 of the streaming efficiency "
        "gives the measured AWQ/GPTQ ratio, 0.3 the AWQ figure itself",
    ),
}


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: '0.7.2+cu118' -> (0, 7, 2), '0.4.10rc1' -> (0, 4, 10),
    '0.4.1.post2' -> (0, 4, 1), '0.7' -> (0, 7)."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(x) for x in m.group().split(".")[:3]) if m else ()


def weight_kernel(m: ModelSpec, engine) -> str:
    """The WEIGHT_KERNEL key for this checkpoint on this engine ('' = the quantized GEMMs stream like the rest)."""
    if m.quant.method == "awq" and engine is not None and engine.family == "vllm" and engine.version:
        if release(engine.version) < (0, 5, 3):
            return "awq-gemm"
    return ""


def moe_backend(m: ModelSpec, engine, hw: dict) -> str:
    """The MOE_LAYER_US key for this checkpoint on this engine and GPU."""
    if not m.is_moe:
        return ""
    q = m.quant
    cc = str(hw.get("compute_capability") or "")
    if q.activations.startswith("fp4") and cc.startswith("12."):
        return "nvfp4-sm12"
    if q.method == "mxfp4" and cc.startswith("8."):
        return "mxfp4-sm8"
    if m.attention == "mla" and q.method == "fp8" and engine is not None and engine.version:
        v = release(engine.version)
        if engine.family == "sglang" and v < (0, 4, 3):
            return "mla-fp8-sglang-early"
        if engine.family == "vllm" and v < (0, 7, 1):
            return "mla-vllm-no-mla-kernel"
    if q.method == "gptq" and engine.family == "sglang" and (engine.version or "0.4").startswith("0."):
        major_minor = tuple(int(x) for x in (engine.version or "0.4").split(".")[:2] if x.isdigit())
        if major_minor <= (0, 4):
            return "sglang-gptq-moe"
    return "default"


def effective_efficiency(nbytes: float, e_max: float, bw_GBps: float, ramp_us: float) -> float:
    """Fraction of datasheet bandwidth a kernel reading `nbytes` reaches (see the module docstring)."""
    if nbytes <= 0:
        return 0.0
    t = nbytes / (e_max * bw_GBps * 1e9) + ramp_us * 1e-6
    return nbytes / (bw_GBps * 1e9) / t
