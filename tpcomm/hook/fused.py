"""FlashInfer's fused all-reduce + RMSNorm: the all-reduces that never reach GroupCoordinator.

vLLM 0.32 turns `PassConfig.fuse_allreduce_rms` on by default for TP > 1 on SM 9.0
and 10.x with FlashInfer installed (`enable_allreduce_rms_fusion` in
vllm/config/vllm.py, applied at -O2 and up). `AllReduceFusionPass`
(vllm/compilation/passes/fusion/allreduce_rms_fusion.py) then rewrites
`tensor_model_parallel_all_reduce` + RMSNorm in the compiled graph into the custom
op `torch.ops.vllm.flashinfer_trtllm_fused_allreduce_norm`, for compile ranges up
to `FI_ALLREDUCE_FUSION_MAX_SIZE_MB[sm][tp]` worth of tokens. Its implementation,
`call_trtllm_fused_allreduce_norm`, is registered as a function object (wrapping
that name would change nothing), but it calls `flashinfer_comm.allreduce_fusion(...)`,
an attribute looked up at call time on the module global `flashinfer_comm` (the
`flashinfer.comm` module). That attribute is what `install` wraps, with the same
eager / CUDA-graph timing as every other collective (core.Hook.timed_path); rows
carry `path` = flashinfer_fused_ar_rmsnorm[_fp8|_fp4] and move the same bytes as
the all-reduce they replace (the input buffer).

vLLM's standalone FlashInfer all-reduce (`FlashInferAllReduce.all_reduce`) calls the
same function from inside `GroupCoordinator._all_reduce_out_place`, which is timed
already; the hook records only the outermost call, so that stays one row with path
group_coordinator. ROCm's AITER fusion (RocmAiterAllReduceFusionPass) is not covered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tpcomm.hook.core import HOOK, logger

FUSION_MODULE = "vllm.compilation.passes.fusion.allreduce_rms_fusion"
FUSED_OP = "flashinfer_trtllm_fused_allreduce_norm"  # torch.ops.vllm.<this>
FUSED_IMPL = "call_trtllm_fused_allreduce_norm"
TARGET_ATTR = "allreduce_fusion"  # on the module global `flashinfer_comm`
PATH = "flashinfer_fused_ar_rmsnorm"
# AllReduceFusionPattern member -> path suffix
_PATTERN_SUFFIX = {
    "kARResidualRMSNorm": "",
    "kARResidualRMSNormFP8Quant": "_fp8",
    "kARResidualRMSNormFP4Quant": "_fp4",
    "kARResidualRMSNormOutFP8Quant": "_fp8",
    "kARResidualRMSNormOutFP4Quant": "_fp4",
}

# Per-process state, for /tpcomm/v1/status. Python runs the op eagerly and once at CUDA graph
# capture; replays do not run Python, so `calls` counts those and `captured` the captured ones.
STATE: dict[str, Any] = {"installed": False, "calls": 0, "captured": 0, "paths": [], "error": None}


def fusion_module() -> Any:
    import importlib

    return importlib.import_module(FUSION_MODULE)


def install(comm: Any = None, group_fn: Callable[[], Any] | None = None) -> bool:
    """Wrap `comm.allreduce_fusion` (default: the `flashinfer_comm` that vLLM's fused op calls).

    Never raises: a failure leaves FlashInfer untouched, logs one line and is reported in status."""
    try:
        if comm is None:
            comm = getattr(fusion_module(), "flashinfer_comm", None)
            if comm is None:
                STATE["error"] = "flashinfer.comm not importable here: vLLM cannot fuse all-reduce + RMSNorm"
                return False
        orig = getattr(comm, TARGET_ATTR)
        if getattr(orig, "_tpcomm_original", None) is not None:
            STATE["installed"] = True
            return True
        setattr(comm, TARGET_ATTR, _wrapped(orig, _path_names(comm), group_fn or _tp_group))
        HOOK.patched.append(f"{getattr(comm, '__name__', type(comm).__name__)}.{TARGET_ATTR}")
        STATE["installed"], STATE["error"] = True, None
        return True
    except Exception as e:  # noqa: BLE001 - serving goes on with the fused path untimed
        STATE["error"] = f"{type(e).__name__}: {e}"
        logger.warning("tpcomm: fused all-reduce + RMSNorm not timed (%s: %s)", type(e).__name__, e)
        return False


def uninstall(comm: Any) -> None:
    orig = getattr(getattr(comm, TARGET_ATTR), "_tpcomm_original", None)
    if orig is not None:
        setattr(comm, TARGET_ATTR, orig)
    STATE["installed"] = False


def _tp_group() -> Any:
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group()


def _path_names(comm: Any) -> dict:
    pat = getattr(comm, "AllReduceFusionPattern", None)
    out = {}
    for name, suffix in _PATTERN_SUFFIX.items():
        code = getattr(pat, name, None)
        if code is not None:
            out[int(code)] = PATH + suffix
    if pat is not None and getattr(pat, "kAllReduce", None) is not None:
        out[int(pat.kAllReduce)] = "flashinfer_allreduce"  # only outside GroupCoordinator
    return out


def _wrapped(orig: Callable, names: dict, group_fn: Callable[[], Any]) -> Callable:
    groups: list = []

    @functools.wraps(orig)
    def allreduce_fusion(*args, **kwargs):
        if HOOK.depth or HOOK.disabled_reason is not None:  # inside a timed GroupCoordinator call
            return orig(*args, **kwargs)
        try:
            pattern = kwargs.get("pattern", args[2] if len(args) > 2 else None)
            path = names.get(int(pattern), PATH) if pattern is not None else PATH
            probe = kwargs.get("input", args[0] if args else None)
            if not groups:
                groups.append(group_fn())
            _count(path, probe)
        except Exception as e:  # noqa: BLE001
            HOOK.fail("fused all-reduce", e)
            return orig(*args, **kwargs)
        return HOOK.timed_path(path, groups[0], "all_reduce", probe, orig, *args, **kwargs)

    allreduce_fusion._tpcomm_original = orig
    return allreduce_fusion


def _count(path: str, probe: Any) -> None:
    STATE["calls"] += 1
    if path not in STATE["paths"]:
        STATE["paths"].append(path)
    if getattr(probe, "is_cuda", False):
        import torch

        if torch.cuda.is_current_stream_capturing():
            STATE["captured"] += 1


def status(worker: Any) -> dict:
    """Which all-reduce paths this worker has: the fusion pass switched on in its config, and whether the
    fused op ran (eagerly or at capture) since start-up."""
    pc = getattr(getattr(getattr(worker, "vllm_config", None), "compilation_config", None), "pass_config", None)
    enabled = getattr(pc, "fuse_allreduce_rms", None)
    max_mb = getattr(pc, "fi_allreduce_fusion_max_size_mb", None)
    paths = ["group_coordinator"] + list(STATE["paths"])  # GroupCoordinator carries every other collective
    return {
        "fusion_pass_enabled": None if enabled is None else bool(enabled),
        "fusion_max_size_mb_override": max_mb,
        "fused_op": f"torch.ops.vllm.{FUSED_OP} -> flashinfer.comm.{TARGET_ATTR}",
        "fused_timed": bool(STATE["installed"]),
        "fused_calls": int(STATE["calls"]),
        "fused_captured": int(STATE["captured"]),
        "allreduce_paths": paths,
        "fused_error": STATE["error"],
    }
