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

Rows carry `backend` = "flashinfer_" + the FlashInfer workspace's backend (vLLM's
call_trtllm_fused_allreduce_norm reads `workspace.backend`: "trtllm" or "mnnvl";
"trtllm" when the workspace does not say), and the same label goes to the
GroupCoordinator row of vLLM's standalone FlashInfer all-reduce.

PDL: vLLM launches the fused kernel with `launch_with_pdl=True` (programmatic
dependent launch: the kernel may start while the one before it finishes). In a CUDA
graph, the event-record nodes the hook captures around the kernel sit between it and
its neighbours, which likely turns the programmatic edge into a full dependency in
every replay, recording on or off (graphs are captured once, at start-up). Not
measured on this machine (no GPU); benchmarks/bench_hook_overhead.py --graph-events
compares a PDL kernel chain with and without the events. The events exist only with
graph timing on (TPCOMM_GRAPH_TIMING=1 at server start, timing.py: one switch for the
GroupCoordinator collectives and this op); TPCOMM_FUSED_GRAPH_EVENTS=0 leaves them out
of this op alone. Captured without events, its graph replays go untimed (counted in
status as fused_untimed_graph_calls and in the sampled steps' untimed_collectives);
eager calls are still timed.

Not covered: kernels in vLLM 0.32 that move TP data on their own, through neither
GroupCoordinator nor flashinfer.comm.allreduce_fusion (UNCOVERED below; their bytes
and time are missing from the hook's rows for the models that use them). Status lists
each with when it applies and whether this worker has loaded (or initialised) it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tpcomm.hook import failsafe
from tpcomm.hook.core import HOOK, LAST_BACKEND, logger
from tpcomm.hook.recorder import GROUP_COORDINATOR

FUSION_MODULE = "vllm.compilation.passes.fusion.allreduce_rms_fusion"
FUSED_OP = "flashinfer_trtllm_fused_allreduce_norm"  # torch.ops.vllm.<this>
FUSED_IMPL = "call_trtllm_fused_allreduce_norm"
TARGET_ATTR = "allreduce_fusion"  # on the module global `flashinfer_comm`
PATH = "flashinfer_fused_ar_rmsnorm"
SITE = "fused_allreduce"  # failsafe.py: an error in the hook's part switches this timing off, FlashInfer's call runs
BACKEND_PREFIX = "flashinfer_"
DEFAULT_WORKSPACE_BACKEND = "trtllm"  # vLLM's default when VLLM_FLASHINFER_ALLREDUCE_BACKEND cannot pick mnnvl
PDL_NOTE = (
    "vLLM launches the fused kernel with PDL; timing events captured around it in CUDA graphs likely cost "
    "the programmatic-launch overlap on every replay (graph timing off, or TPCOMM_FUSED_GRAPH_EVENTS=0, leaves "
    "them out)"
)
# vLLM 0.32 kernels that all-reduce outside GroupCoordinator and flashinfer.comm.allreduce_fusion:
# (model, module under vllm/, what it does). tests/test_hook_fused.py checks the modules exist.
UNCOVERED = (
    ("deepseek_v41", "models/deepseek_v41/nvidia/ops/cute_dsl/all_reduce_mhc.py", "Lamport all-reduce + mHC + RMSNorm"),
    (
        "kimi_k3",
        "models/kimi_k3/nvidia/ops/cute_dsl/latent_moe_tail/allreduce_rmsnorm_reduce_scatter_early_exit.py",
        "all-reduce + RMSNorm with reduce-scatter early exit (MoE tail)",
    ),
    ("inkling", "models/inkling/nvidia/ops/lamport.py", "Lamport reduce-scatter + short conv + all-gather + RMSNorm"),
    ("minimax", "model_executor/layers/minimax_rms_norm/rms_norm_tp.py", "Lamport all-reduce + RMSNorm (q/k norm)"),
    (
        "kimi_k3, deepseek_v41 (SM100)",
        "model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py",
        "GEMM + TP all-reduce (GEMM-AR, VLLM_KIMI_K3_GEMM_AR=1, vLLM's default) or + reduce-scatter "
        "(GEMM-RS, VLLM_ENABLE_GEMM_RS=1) fused in one CUTLASS kernel on symmetric memory",
    ),
    (
        "deepseek_v4, deepseek_v41, qwen4_exp under sequence parallelism (DP+EP+TP)",
        "models/common/ops/sequence_parallel.py",
        "all-gather / reduce-scatter through the device communicator's custom_all_gather / "
        "custom_reduce_scatter, not GroupCoordinator; traced into the compiled graph, so no wrapper can time it",
    ),
)
# When each UNCOVERED path is live in a worker: its module loaded, and for GEMM-RS/AR the workspace that
# maybe_init_gemm_rs_ar sets up (None: the module is not loaded in this worker).
_GEMM_RS_AR_MODULE = "vllm.model_executor.kernels.linear.cute_dsl.gemm_rs_ar"
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
STATE: dict[str, Any] = {
    "installed": False,
    "calls": 0,
    "captured": 0,
    "untimed_graph_calls": 0,  # captured without events (TPCOMM_FUSED_GRAPH_EVENTS=0)
    "paths": [],
    "backends": [],
    "graph_events": True,
    "error": None,
}


def graph_events_on() -> bool:
    """Timing events around the fused op in CUDA graphs: graph timing on (TPCOMM_GRAPH_TIMING=1, default off)
    and not TPCOMM_FUSED_GRAPH_EVENTS=0."""
    from tpcomm.hook.timing import graph_timing_on

    fused_on = os.environ.get("TPCOMM_FUSED_GRAPH_EVENTS", "1").strip().lower() not in ("0", "false", "no", "off")
    return graph_timing_on() and fused_on


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
        STATE["graph_events"] = graph_events_on()
        failsafe.patch(comm, TARGET_ATTR, SITE, _part(_path_names(comm), group_fn or _tp_group, STATE["graph_events"]))
        HOOK.patched.append(f"{getattr(comm, '__name__', type(comm).__name__)}.{TARGET_ATTR}")
        STATE["installed"], STATE["error"] = True, None
        return True
    except Exception as e:  # noqa: BLE001 - serving goes on with the fused path untimed
        STATE["error"] = f"{type(e).__name__}: {e}"
        logger.warning("tpcomm: fused all-reduce + RMSNorm not timed (%s: %s)", type(e).__name__, e)
        return False


def uninstall(comm: Any) -> None:
    failsafe.unpatch(comm, TARGET_ATTR)
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


def _wrapped(orig: Callable, names: dict, group_fn: Callable[[], Any], graph_events: bool = True) -> Callable:
    """`orig` behind the hook's fail-safe wrapper (site fused_allreduce, failsafe.py)."""
    return failsafe.wrap(orig, SITE, _part(names, group_fn, graph_events))


def _part(names: dict, group_fn: Callable[[], Any], graph_events: bool = True) -> Callable:
    """The hook's part around `allreduce_fusion`: `call` runs FlashInfer's (failsafe.py)."""
    groups: list = []

    def allreduce_fusion(call, *args, **kwargs):
        ws = kwargs.get("workspace", args[1] if len(args) > 1 else None)
        backend = BACKEND_PREFIX + str(getattr(ws, "backend", None) or DEFAULT_WORKSPACE_BACKEND)
        if HOOK.depth or HOOK.disabled_reason is not None:  # inside a timed GroupCoordinator call
            LAST_BACKEND[0] = backend  # that row's transport (vLLM's standalone FlashInfer all-reduce)
            return call(*args, **kwargs)
        pattern = kwargs.get("pattern", args[2] if len(args) > 2 else None)
        path = names.get(int(pattern), PATH) if pattern is not None else PATH
        probe = kwargs.get("input", args[0] if args else None)
        if not groups:
            groups.append(group_fn())
        if _count(path, probe, backend) and not graph_events:
            STATE["untimed_graph_calls"] += 1
            if HOOK.cuda is not None:
                HOOK.cuda.capture_untimed()  # the graph's replays count it as untimed
            return call(*args, **kwargs)

        def run(*a, **k):
            out = call(*a, **k)
            LAST_BACKEND[0] = backend  # read by the timed call once this returns
            return out

        return HOOK.timed_path(path, groups[0], "all_reduce", probe, run, *args, **kwargs)

    return allreduce_fusion


def _count(path: str, probe: Any, backend: str) -> bool:
    """Count a call; True when it is being captured into a CUDA graph."""
    STATE["calls"] += 1
    if path not in STATE["paths"]:
        STATE["paths"].append(path)
    if backend not in STATE["backends"]:
        STATE["backends"].append(backend)
    if getattr(probe, "is_cuda", False):
        import torch

        if torch.cuda.is_current_stream_capturing():
            STATE["captured"] += 1
            return True
    return False


def status(worker: Any) -> dict:
    """Which all-reduce paths this worker has. `fusion_pass_configured`: the fusion pass is on in its config
    and the config compiles with vLLM's passes (compilation mode VLLM_COMPILE; --enforce-eager sets NONE,
    which runs no pass); `fusion_seen_running`: the fused op ran here (eagerly or at capture) since start-up."""
    cc = getattr(getattr(worker, "vllm_config", None), "compilation_config", None)
    pc = getattr(cc, "pass_config", None)
    flag = getattr(pc, "fuse_allreduce_rms", None)
    mode = getattr(cc, "mode", None)
    mode_name = getattr(mode, "name", None if mode is None else str(mode))
    configured = None if flag is None else bool(flag) and mode_name == "VLLM_COMPILE"
    max_mb = getattr(pc, "fi_allreduce_fusion_max_size_mb", None)
    paths = [GROUP_COORDINATOR] + list(STATE["paths"])  # GroupCoordinator carries every other collective
    graph_events = bool(STATE["graph_events"])
    return {
        "fusion_pass_configured": configured,
        "fusion_pass_flag": None if flag is None else bool(flag),
        "compilation_mode": mode_name,
        "fusion_seen_running": STATE["calls"] > 0,
        "fusion_max_size_mb_override": max_mb,
        "fused_op": f"torch.ops.vllm.{FUSED_OP} -> flashinfer.comm.{TARGET_ATTR}",
        "fused_timed": bool(STATE["installed"]),
        "fused_calls": int(STATE["calls"]),
        "fused_captured": int(STATE["captured"]),
        "fused_backends": list(STATE["backends"]),
        "fused_graph_events": graph_events,
        "fused_untimed_graph_calls": int(STATE["untimed_graph_calls"]),
        "fused_graph_note": PDL_NOTE
        if graph_events
        else "graph timing off (TPCOMM_GRAPH_TIMING) or TPCOMM_FUSED_GRAPH_EVENTS=0: the fused op's CUDA-graph "
        "calls are not timed (eager calls are)",
        "batch_invariant": _batch_invariant(),
        "allreduce_paths": paths,
        "not_covered": [f"{m}: {what} (vllm/{mod})" for m, mod, what in UNCOVERED],
        "not_covered_detail": uncovered_detail(getattr(worker, "vllm_config", None)),
        "fused_error": STATE["error"],
    }


def uncovered_detail(vllm_config: Any = None) -> list[dict]:
    """Each UNCOVERED path with whether this worker has its module loaded (the served model imports it) and,
    for GEMM-RS/AR, whether vLLM initialised it (then it runs in every step of that model); for sequence
    parallelism whether this layout turns it on (bypasses.py: loaded is not on), then the layout-dependent
    bypasses (dual-batch overlap, EP all-to-all)."""
    import sys

    from tpcomm.hook.bypasses import SP_MODULE, layout_bypasses, sequence_parallel_on

    out = []
    for models, mod, what in UNCOVERED:
        name = "vllm." + mod.removesuffix(".py").replace("/", ".")
        m = sys.modules.get(name)
        d = {"models": models, "module": f"vllm/{mod}", "what": what, "loaded_in_worker": m is not None}
        if name == _GEMM_RS_AR_MODULE:
            ws = getattr(m, "_gemm_rs_ar", None) if m is not None else None
            d["initialised"] = ws is not None
            d["mode"] = None if ws is None else ("all-reduce" if getattr(ws, "all_reduce", False) else "reduce-scatter")
        if d["module"] == SP_MODULE and m is not None:
            sp = sequence_parallel_on(vllm_config)
            if sp is not None:
                d["initialised"] = sp
        out.append(d)
    return out + layout_bypasses(vllm_config)


def _batch_invariant() -> bool | None:
    """The server's VLLM_BATCH_INVARIANT, as vLLM reads it (clients judge the fusion with it: topo/fusion.py)."""
    try:
        import vllm.envs as envs

        return bool(envs.VLLM_BATCH_INVARIANT)
    except Exception:  # noqa: BLE001
        return None
