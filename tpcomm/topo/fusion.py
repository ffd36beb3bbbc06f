"""vLLM's FlashInfer all-reduce + RMSNorm fusion: when it is on and which all-reduces it takes.

vLLM 0.32 (vllm/config/vllm.py `enable_allreduce_rms_fusion`, the default of
`PassConfig.fuse_allreduce_rms` at -O2/-O3) enables it when TP > 1, the platform is
CUDA, FlashInfer is installed, the GPU is SM 9.0 exactly or any SM 10.x, and
VLLM_BATCH_INVARIANT is off. `AllReduceFusionPass` then needs a size:
`PassConfig.flashinfer_max_size(tp)` = `fi_allreduce_fusion_max_size_mb` or
FI_ALLREDUCE_FUSION_MAX_SIZE_MB[sm][tp] (world sizes 2/4/8/16), and fuses in compile
ranges of at most max_token_num = min(max_size // (hidden * dtype bytes),
max_num_batched_tokens) tokens. Every TP all-reduce of [tokens, hidden] followed by
an RMSNorm (embedding -> first input_layernorm, o_proj -> post_attention_layernorm,
MLP/MoE -> next input_layernorm or the final norm) becomes one FlashInfer kernel
that all-reduces the same bytes and never reaches GroupCoordinator/CudaCommunicator.
It needs torch.compile (not --enforce-eager, not -O0/-O1).

Two more conditions decide which all-reduces it takes. The patterns are registered
for RMSNorm eps 1e-5 and 1e-6 only (`AllReduceFusionPass.register_patterns`): a
model whose config.json rms_norm_eps is another value is never fused. And the
compile range is chosen by the number of tokens the compiled graph runs, which in
CUDA-graph mode is the batch padded to the next capture size (vLLM's default sizes
1, 2, 4, then multiples of 8 to 248, then of 16 up to 512, or 1024 on SM 10.x;
`VllmConfig._set_cudagraph_sizes`); a batch above the largest size runs unpadded.

"FlashInfer installed" is vLLM's `has_flashinfer()` (vllm/utils/flashinfer.py): the
`flashinfer` package, and kernels it can load: the flashinfer-cubin package
(or VLLM_HAS_FLASHINFER_CUBIN=1), else nvcc (CUDA_HOME, CUDA_PATH, PATH or
/usr/local/cuda) and ninja on PATH for its JIT; `flashinfer_usable` mirrors it.
VLLM_BATCH_INVARIANT is the server's: taken from its hook status when the caller has
one, else this shell's value is assumed to be the server's (and the answer says so).

Units: bytes, MiB = 2**20 (vLLM's "MB" in that table).
"""

from __future__ import annotations

import importlib.util
import os
import shutil

MiB = 1024 * 1024
PATH = "flashinfer_fused_ar_rmsnorm"
FUSION_EPS = (1e-5, 1e-6)  # AllReduceFusionPass.register_patterns' epsilons (vLLM 0.32)


def graph_padded(batch: int, sm: str | None) -> int:
    """The token count vLLM's compiled graph runs for a decode batch in CUDA-graph mode: the smallest default
    capture size >= batch (largest 1024 on data-centre Blackwell, SM 10.x, else 512); above it, the batch."""
    top = 1024 if sm is not None and sm_int(sm) // 10 == 10 else 512
    for size in (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)):
        if size >= batch:
            return size
    return batch


FUSED_SITES = ("model.embed_tokens", "self_attn.o_proj", "mlp.down_proj", "mlp.experts")


def sm_int(sm: str) -> int:
    """'9.0' -> 90, '10.3' -> 103 (vLLM's DeviceCapability.to_int)."""
    major, minor = str(sm).split(".")
    return int(major) * 10 + int(minor)


def flashinfer_usable() -> tuple[bool, str]:
    """vLLM's has_flashinfer() for this environment, without importing vLLM or FlashInfer: (usable, why)."""
    if importlib.util.find_spec("flashinfer") is None:
        return False, "the flashinfer package is not installed"
    if _env_int("VLLM_HAS_FLASHINFER_CUBIN") or importlib.util.find_spec("flashinfer_cubin") is not None:
        return True, "flashinfer with flashinfer-cubin (precompiled kernels)"
    if _nvcc_path() is None or shutil.which("ninja") is None:
        return False, (
            "flashinfer is installed but vLLM's has_flashinfer() says no: no flashinfer-cubin, and nvcc "
            "(CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda) or ninja (PATH) is missing for its JIT"
        )
    return True, "flashinfer, kernels compiled by its JIT (nvcc and ninja found)"


def _nvcc_path() -> str | None:
    """vllm.utils.flashinfer._flashinfer_nvcc_path: the nvcc FlashInfer's JIT would run."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not cuda_home:
        nvcc = shutil.which("nvcc")
        cuda_home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
    return shutil.which(os.path.join(cuda_home, "bin", "nvcc"))


def _env_int(name: str) -> bool:
    try:
        return bool(int(os.environ.get(name, "0") or "0"))
    except ValueError:
        return False


def batch_invariant(server: bool | None = None) -> tuple[bool, str]:
    """VLLM_BATCH_INVARIANT as the server has it: `server` (from its status) when known, else this shell's."""
    if server is not None:
        return bool(server), "the server's VLLM_BATCH_INVARIANT (hook status)"
    return _env_int("VLLM_BATCH_INVARIANT"), "this shell's VLLM_BATCH_INVARIANT, assumed to be the server's"


def allreduce_fusion(
    sm: str | None,
    tp: int,
    flashinfer: bool | None,
    tables: dict,
    hidden: int | None = None,
    dtype_bytes: int | None = None,
    max_num_batched_tokens: int = 2048,
    server_batch_invariant: bool | None = None,
    rms_norm_eps: float | None = None,
) -> dict:
    """{enabled: True/False/None (unknown), why, max_bytes, max_tokens (the limit on the graph-padded batch, see
    graph_padded: a smaller batch that pads past it is not fused), lever, batch_invariant_from} for this
    GPU and TP. `server_batch_invariant`: the server's VLLM_BATCH_INVARIANT when known (see the docstring).
    `rms_norm_eps`: the model's (None: no model, or its config does not say; not judged)."""
    bi, bi_from = batch_invariant(server_batch_invariant)
    out = {
        "path": PATH,
        "enabled": False,
        "why": "",
        "max_bytes": None,
        "max_tokens": None,
        "lever": None,
        "batch_invariant_from": bi_from,
    }
    if sm is None:
        return {**out, "enabled": None, "why": "GPU unknown: give its compute capability (--sm) to judge the fusion"}
    if tp <= 1:
        return {**out, "why": "TP=1: no all-reduce"}
    if bi:
        return {**out, "why": f"VLLM_BATCH_INVARIANT is set ({bi_from}): the fused path is not batch-invariant"}
    cap = sm_int(sm)
    if not (cap == 90 or cap // 10 == 10):
        return {**out, "why": f"SM {sm}: vLLM fuses all-reduce + RMSNorm only on SM 9.0 and 10.x"}
    if flashinfer is False:
        return {
            **out,
            "why": "FlashInfer is not usable (vLLM's has_flashinfer(): package, and flashinfer-cubin or nvcc+ninja)",
            "lever": "install flashinfer-cubin (or put nvcc and ninja on PATH)",
        }
    if rms_norm_eps is not None and not any(abs(rms_norm_eps - e) <= 1e-12 for e in FUSION_EPS):
        return {
            **out,
            "why": f"the model's RMSNorm eps {rms_norm_eps:g} is not one vLLM's fusion patterns match "
            f"({', '.join(f'{e:g}' for e in FUSION_EPS)}): no all-reduce is fused",
        }
    sizes = tables["fi_fusion_max_size_mb"].get(cap, {})
    if tp not in tables["fi_fusion_world_sizes"] or tp not in sizes:
        return {**out, "why": f"no FlashInfer fusion size for SM {sm} at world size {tp} (vLLM disables the pass)"}
    max_bytes = int(sizes[tp] * MiB)
    max_tokens = None
    if hidden and dtype_bytes:
        max_tokens = min(max_bytes // (hidden * dtype_bytes), max_num_batched_tokens)
    maybe = "" if flashinfer else " if FlashInfer is usable in the server"
    assumed = (
        "" if server_batch_invariant is not None else "; VLLM_BATCH_INVARIANT off in this shell, assumed the server's"
    )
    return {
        **out,
        "enabled": True,
        "why": (
            f"on by default at -O2{maybe}: all-reduce + RMSNorm run as one FlashInfer kernel for messages "
            f"up to {max_bytes / MiB:g} MiB (SM {sm}, TP {tp}), judged at the batch padded to its CUDA-graph "
            "capture size (vLLM's default sizes: true without --max-num-seqs below 256, "
            "cudagraph_capture_sizes or speculative decoding); they bypass GroupCoordinator and move the same "
            f"bytes{assumed}"
        ),
        "max_bytes": max_bytes,
        "max_tokens": max_tokens,
        "lever": (
            """--compilation-config '{"pass_config": {"fuse_allreduce_rms": false}}' to compare; """
            "pass_config.fi_allreduce_fusion_max_size_mb sets the size"
        ),
    }


def is_fused(site: str, op: str, group: str, nbytes: int, rule: dict, batch: int = 1, sm: str | None = None) -> bool:
    """Whether a plan row's all-reduce ([batch, hidden], `nbytes` at `batch`) is one that the fusion takes:
    judged at the graph-padded batch (see the module docstring)."""
    if not (rule.get("enabled") and op == "all_reduce" and group == "tp" and rule["max_bytes"] is not None):
        return False
    padded = nbytes * graph_padded(batch, sm) // max(batch, 1)
    return padded <= rule["max_bytes"] and any(s in site for s in FUSED_SITES)
