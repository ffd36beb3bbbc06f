"""vLLM general plugin: time every collective and every engine step in the workers.

Entry point ``vllm.general_plugins: tpcomm = tpcomm.hook.plugin:register``.
vLLM calls `register()` in each process it starts when ``VLLM_PLUGINS``
names tpcomm (or is unset); it acts only when switched on (TPCOMM_HOOK=1 or
VLLM_PLUGINS naming tpcomm, see switch.py). It patches classes, not objects:

- `GroupCoordinator` (vllm/distributed/parallel_state.py): the methods that
  do the transfer (`_all_reduce_out_place`, `_all_gather_out_place`,
  `_reduce_scatter_out_place`, `all_gatherv`, `reduce_scatterv*`, `gather`,
  `broadcast`, `broadcast_tensor_dict`, `send`, `recv`, `isend_tensor_dict`,
  `irecv_tensor_dict`, `dispatch*`/`combine` for all-to-all) are timed; the
  public `all_reduce`/`all_gather`/`reduce_scatter` only reroute to the
  opaque `tpcomm::` ops while dynamo compiles (see ops.py). On CUDA the
  `vllm::all_reduce` custom op already reaches `_all_reduce_out_place`.
- `WorkerWrapperBase` (vllm/v1/worker/worker_base.py): `execute_model` and
  `sample_tokens` bracket an engine step; `tpcomm_status`, `tpcomm_start`,
  `tpcomm_stop`, `tpcomm_records` are added for `collective_rpc`.
- On CUDA, inside each worker once vLLM has initialised its device (never in
  the API server or EngineCore, which fork the workers later):
  `torch.cuda.CUDAGraph` capture/replay (events inside graphs, see
  timing.py) and the backends behind `CudaCommunicator.all_reduce`, so each
  record names the path that ran (custom_ar, pynccl, symm_mem, ...); and
  `flashinfer.comm.allreduce_fusion`, which vLLM's fused all-reduce + RMSNorm
  op calls without going through GroupCoordinator (fused.py). NCCL symmetric
  memory all-reduce (`torch.ops.vllm.all_reduce_symmetric_with_copy`, opt-in)
  reaches PyNccl too: the decision `should_nccl_symm_mem_allreduce` is wrapped
  so that its rows say `nccl_symm_mem`, not `pynccl`.

Durations: the transfer itself for the blocking ops; for `isend_tensor_dict` /
`irecv_tensor_dict` on torch.distributed (async) only the time to post them
(the CPU shared-memory path is synchronous, so there it is the transfer).
In processes without parallel groups (the engine core) the patches stay inert.
Recording is off until POST /tpcomm/v1/start (or TPCOMM_RECORD_AT_START=1).
Collectives inside CUDA graphs are timed only when the server starts with
TPCOMM_GRAPH_TIMING=1 (events captured into the graphs are replayed recording or
not; timing.py says why it is off by default); the engine steps' GPU spans
(gpuclock.py) and eager collectives are timed either way while recording.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tpcomm.hook import failsafe
from tpcomm.hook.core import HOOK, LAST_BACKEND, SYMM_PENDING, env_flag, logger
from tpcomm.hook.recorder import GROUP_COORDINATOR

# method -> (op name, where the sized tensor is: positional index, keyword, or None = the output)
_TIMED: dict[str, tuple[str, int | None, str | None]] = {
    "_all_reduce_out_place": ("all_reduce", 0, "input_"),
    "_all_gather_out_place": ("all_gather", 0, "input_"),
    "all_gatherv": ("all_gather", 0, "input_"),
    "_reduce_scatter_out_place": ("reduce_scatter", 0, "input_"),
    "reduce_scatterv": ("reduce_scatter", 0, "input_"),
    "reduce_scatterv_into_output": ("reduce_scatter", 0, "input_"),
    "gather": ("gather", 0, "input_"),
    "broadcast": ("broadcast", 0, "input_"),
    "broadcast_tensor_dict": ("broadcast", 0, "tensor_dict"),
    "send": ("send", 0, "tensor"),
    "recv": ("recv", None, None),
    "isend_tensor_dict": ("send", 0, "tensor_dict"),
    "irecv_tensor_dict": ("recv", None, None),
    "dispatch_router_logits": ("all_to_all", 0, "hidden_states"),
    "dispatch": ("all_to_all", 0, "hidden_states"),
    "combine": ("all_to_all", 0, "hidden_states"),
}
# public method -> tpcomm op used while dynamo traces it
_REROUTED = ("all_reduce", "all_gather", "reduce_scatter")

# NCCL symmetric-memory all-reduce (PyNccl on symmetric buffers); the classes that name the other paths behind
# CudaCommunicator are data: tpcomm/backends/*.json ("hook_targets"), read where the hook installs.
SYMM_TAG = "nccl_symm_mem"

_installed = False


def register() -> None:
    """vLLM general-plugin entry point. Never raises: a failure leaves vLLM unpatched."""
    from tpcomm.hook import switch

    global _installed
    if _installed:
        return
    _installed = True
    # vLLM loads every installed general plugin when VLLM_PLUGINS is unset; tpcomm patches nothing unless the
    # operator switches it on: TPCOMM_HOOK=1, or VLLM_PLUGINS naming it (an allow-list: see switch.py).
    if not switch.switched_on():
        return
    try:
        switch.attach_routes_without_allowlist()
        _install()
    except Exception as e:  # noqa: BLE001 - a broken hook must not stop the server
        HOOK.fail("install", e)
        return
    if env_flag("TPCOMM_RECORD_AT_START"):
        HOOK.start()
    logger.info(
        "tpcomm hook installed (pid %d): %d methods patched, recording %s",
        os.getpid(),
        len(HOOK.patched),
        "armed" if HOOK.armed else "off until POST /tpcomm/v1/start",
    )


def _install() -> None:
    from vllm.distributed.parallel_state import GroupCoordinator
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    import tpcomm.hook.ops  # noqa: F401 - registers the tpcomm:: custom ops

    for name, (op, pos, kw) in _TIMED.items():
        if hasattr(GroupCoordinator, name):
            _patch(GroupCoordinator, name, "collective", _timed_part(op, pos, kw))
    try:  # the reroute acts only while dynamo traces, where nothing is caught (failsafe.py): its fault is here
        failsafe.fault("reroute")
    except failsafe.FaultInjected as e:
        failsafe.disable("reroute", str(e))
    for name in _REROUTED:
        _patch(GroupCoordinator, name, "reroute", _rerouted_part(name), replaces=True)
    _patch_worker(WorkerWrapperBase)


def _install_cuda_timing() -> None:
    """CUDA timing, installed in a worker right after vLLM initialised its device.

    Never at register time: vLLM loads general plugins in the API server and in
    EngineCore before it forks the workers, and `torch.cuda.is_available()` there
    initialises the CUDA driver without `torch.cuda.is_initialized()` noticing, so
    vLLM keeps fork and the forked workers die at their first CUDA call. The
    platform is decided as vLLM decides it (NVML-based `current_platform`)."""
    if HOOK.cuda is not None or HOOK.disabled_reason is not None:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cuda_alike():
        return
    if HOOK.enable_cuda_timing():
        HOOK.patched.append("torch.cuda.CUDAGraph.capture_begin/capture_end/replay")
        from tpcomm.hook.selftest import graph_selftest

        graph_selftest(HOOK)  # before vLLM's captures; a failure switches graph timing off (logged, in status)
    _tag_cuda_backends()
    from tpcomm.hook import fused

    fused.install()  # never raises; a failure is logged and shown in status


def _patch(cls: Any, name: str, site: str, part: Callable, replaces: bool = False) -> None:
    """Every patch of a vLLM class or module goes through failsafe.patch: vLLM's call runs whatever `part` does."""
    failsafe.patch(cls, name, site, part, replaces)
    HOOK.patched.append(f"{getattr(cls, '__name__', type(cls).__name__)}.{name}")


def _timed_part(op: str, pos: int | None, kw: str | None) -> Callable:
    import torch

    def timed(call, self, *args, **kwargs):
        # Under dynamo, stay traceable: the compiled graph gets vLLM's own code
        # (the public methods reroute to tpcomm:: ops before reaching here).
        if torch.compiler.is_compiling() or self.world_size == 1:
            return call(self, *args, **kwargs)
        probe = None if pos is None else (args[pos] if len(args) > pos else kwargs.get(kw))
        return HOOK.timed_path(
            GROUP_COORDINATOR, self, op, probe, call, self, *args, **kwargs
        )  # not via timed: one call less

    return timed


def _rerouted_part(name: str) -> Callable:
    import torch

    # Extra arguments a later vLLM may add pass straight through to the original (no rerouting then).
    if name == "all_reduce":

        def method(call, self, input_, *args, **kwargs):
            if (
                not args
                and not kwargs
                and self.world_size > 1
                and not getattr(self, "use_custom_op_call", False)
                and torch.compiler.is_compiling()
            ):
                return torch.ops.tpcomm.all_reduce(input_, self.unique_name)
            return call(self, input_, *args, **kwargs)
    else:

        def method(call, self, input_, dim=-1, *args, **kwargs):
            if (
                not args
                and not kwargs
                and self.world_size > 1
                and not getattr(self, "use_custom_op_call", False)
                and torch.compiler.is_compiling()
            ):
                return getattr(torch.ops.tpcomm, name)(input_, dim, self.world_size, self.unique_name)
            return call(self, input_, dim, *args, **kwargs)

    return method


def _patch_worker(cls: type) -> None:
    """execute_model: two sites around one call (the step's start, then its end), each its own wrapper; sample_tokens
    (WorkerWrapperBase has none: vLLM reaches the worker's through __getattr__, which stays the original)."""
    _patch(cls, "execute_model", "step_begin", _step_begin_part)
    _patch(cls, "execute_model", "step_end", _step_end_part)
    if "sample_tokens" not in cls.__dict__:
        cls.sample_tokens = _worker_sample_tokens
    _patch(cls, "sample_tokens", "sampling", _sampling_part)
    _patch(cls, "init_device", "device_init", _device_init_part)
    _patch(cls, "init_device", "publish", _publish_part)  # its own site: CUDA timing's failure leaves it on
    from tpcomm.hook import rpc

    for name in rpc.METHODS:  # new methods (no vLLM call to keep): collective_rpc returns their errors as replies
        setattr(cls, name, getattr(rpc, name))


def _worker_sample_tokens(self, *args, **kwargs):
    """vLLM's own path when the wrapper class has no sample_tokens: the worker's."""
    return self.worker.sample_tokens(*args, **kwargs)


def _step_begin_part(call, self, scheduler_output, *args, **kwargs):
    HOOK.step_begin(scheduler_output)
    return call(self, scheduler_output, *args, **kwargs)


def _step_end_part(call, self, *args, **kwargs):
    out = call(self, *args, **kwargs)
    HOOK.step_end(out)
    return out


def _sampling_part(call, self, *args, **kwargs):
    out = call(self, *args, **kwargs)
    HOOK.sample_end()
    return out


def _device_init_part(call, self, *args, **kwargs):
    out = call(self, *args, **kwargs)
    # The worker's device is up: CUDA timing may go in now (see _install_cuda_timing). A failure there leaves
    # vLLM's device as it is and this site off.
    _install_cuda_timing()
    return out


def _publish_part(call, self, *args, **kwargs):
    out = call(self, *args, **kwargs)
    from tpcomm.hook import publish, rpc

    publish.start(HOOK, rpc._rank(self))  # metrics for scrapes, by a thread of this worker (publish.py)
    return out


def _tag_cuda_backends() -> None:
    import importlib

    from tpcomm import backends
    from tpcomm.hook import failsafe

    try:
        targets = backends.hook_targets()
    except Exception as e:  # noqa: BLE001 - a broken registry loses the backend tags, nothing else
        failsafe.disable("backend_tag", f"{type(e).__name__}: {e}")
        targets = []
    for mod, cls_name, methods, tag in targets:
        try:
            cls = getattr(importlib.import_module(f"vllm.distributed.device_communicators.{mod}"), cls_name)
        except Exception:  # noqa: BLE001 - a backend this build lacks
            continue
        for m in methods:
            if hasattr(cls, m) and not hasattr(getattr(cls, m), "_tpcomm_original"):
                _patch(
                    cls, m, "backend_tag", _tag_part(SYMM_TAG if (tag, m) == ("pynccl", "all_reduce") else None, tag)
                )
    _tag_symm_decision()


def _tag_symm_decision() -> None:
    """CudaCommunicator.all_reduce asks `should_nccl_symm_mem_allreduce` (imported into its module) before
    calling torch.ops.vllm.all_reduce_symmetric_with_copy, whose implementation calls PyNccl's all_reduce on
    symmetric buffers. The answer is remembered so that PyNccl's tag says which path it was."""
    import importlib

    try:
        mod = importlib.import_module("vllm.distributed.device_communicators.cuda_communicator")
        orig = mod.should_nccl_symm_mem_allreduce
    except Exception:  # noqa: BLE001 - a build without the symmetric-memory path
        return
    if getattr(orig, "_tpcomm_original", None) is not None:
        return
    _patch(mod, "should_nccl_symm_mem_allreduce", "backend_tag", _symm_decision_part)


def _symm_decision_part(call, *args, **kwargs):
    ok = call(*args, **kwargs)
    SYMM_PENDING[0] = bool(ok)
    if ok:
        LAST_BACKEND[0] = SYMM_TAG
    return ok


def _tag_part(symm: str | None, tag: str) -> Callable:
    """A backend's method names its transport for the record being timed around it. PyNccl's all_reduce
    (`symm` set) says `nccl_symm_mem` when the symmetric-memory decision just said yes (consumed here)."""

    def tagged(call, self, *args, **kwargs):
        if symm is None:
            LAST_BACKEND[0] = tag
        else:
            LAST_BACKEND[0] = symm if SYMM_PENDING[0] else tag
            SYMM_PENDING[0] = False
        return call(self, *args, **kwargs)

    return tagged
