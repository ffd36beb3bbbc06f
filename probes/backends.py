"""The backends a vLLM deployment can route a collective through, each driven
the way vLLM drives it:

    gloo       torch.distributed on a gloo group (vLLM-CPU's fallback, and its path
               for ops the shared-memory communicator lacks)
    shm        vLLM's CpuCommunicator with its shared-memory dist module
               (torch.ops._C.shm_allreduce / shm_all_gather / shm_gather): what
               vLLM-CPU tensor parallelism uses
    nccl       torch.distributed on an NCCL group
    pynccl     vLLM's PyNcclCommunicator (vLLM's own NCCL binding, used in CUDA graphs)
    custom-ar  vLLM's CustomAllreduce (one-shot/two-shot P2P kernels)

A backend that cannot run raises Ineligible with vLLM's own reason. Every
backend builds process groups (and vLLM communicators) of its own: `close()`
destroys them (NCCL communicators, IPC buffers, gloo groups), after its last use
and when its construction fails half-way (`built`), so a probe or a replay that
runs many items does not accumulate communicators.

Before each isolated op the ranks line up on the op's own path (`lineup`): a tiny
collective of the same backend on the same stream, so the op starts as close
together on every rank as that backend can make it. A host barrier (gloo) releases
ranks tens to hundreds of microseconds apart, which an isolated GPU sample would
carry on top of a 5-15 us all-reduce.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from probes.devices import NoDevice, cuda_device, first_reason, one_line, peers_not_visible, rank_layout
from probes.ops import COLLECTIVES, ops_for
from probes.spec import NOT_IN_BACKEND


class Ineligible(Exception):
    """This backend cannot run here; the message says why (as vLLM would)."""


class Backend:
    name = ""
    device = torch.device("cpu")
    graph_capable = False
    # Which call of probes/ops.py's table this backend issues (torch_dist, shm, pynccl), and the ops that has.
    kind: str | None = None
    ops: tuple[str, ...] = ()
    # Ops after which a rank can run ahead of a peer by more than the backend allows:
    # each call (warm-up and isolated sample) is preceded by a host barrier, and they
    # get no pipelined timing.
    no_back_to_back: tuple[str, ...] = ()

    def __init__(self, cpu_group, local_rank: int):
        self.cpu_group = cpu_group
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_rank = local_rank

    def unsupported(self, op: str) -> str | None:
        if op not in self.ops:
            return f"{self.name} has no {op} (vLLM routes {op} elsewhere)"
        if op == "send_recv" and self.world == 1:
            # gloo raises on a send to itself; vLLM never issues one (PP needs 2+ stages)
            return "send_recv needs 2+ ranks (at world size 1 a rank would send to itself)"
        return None

    def run(self, op: str, b) -> torch.Tensor | None:
        """Issue one op on buffers `b`; returns the result tensor."""
        if self.kind is None:
            raise NotImplementedError
        return COLLECTIVES[op].run(self.kind, self, b)

    def sync(self) -> None:
        pass

    # What `lineup` issues, stated with every isolated result.
    lineup_name = "gloo barrier (host)"

    def lineup(self, ctrl) -> None:
        """Line the ranks up before an isolated op (this default: a host barrier on the control group)."""
        dist.barrier(group=ctrl)

    def capture(self):
        return contextlib.nullcontext()

    def _group(self, backend: str):
        """A process group of this backend's own, destroyed by close()."""
        g = dist.new_group(backend=backend)
        self.__dict__.setdefault("_own_groups", []).append(g)
        return g

    def close(self) -> None:
        """Destroy what this backend built (its communicators first, then its process groups). Safe on a backend
        whose construction failed half-way, and twice."""
        self._close_comm()
        for g in reversed(self.__dict__.pop("_own_groups", [])):
            try:
                dist.destroy_process_group(g)
            except Exception:  # noqa: BLE001 - already gone (an aborted communicator): nothing left to free
                pass

    def _close_comm(self) -> None:
        pass


class GlooBackend(Backend):
    name = "gloo"
    kind = "torch_dist"
    ops = ops_for(kind)

    def __init__(self, cpu_group, local_rank):
        super().__init__(cpu_group, local_rank)
        # A group of its own, so barriers on the control group never queue behind it.
        self.group = self._group("gloo")
        self._token = torch.zeros(1, dtype=torch.float32)

    lineup_name = "tiny gloo all_reduce"

    def lineup(self, ctrl):
        dist.all_reduce(self._token, group=self.group)

    def unsupported(self, op):
        return NOT_IN_BACKEND["gloo"].get(op) or super().unsupported(op)


def _unlink_own_segment(group_name: str, rank: int) -> None:
    """Remove this rank's shared-memory name once every rank has mapped every segment.

    vLLM's SHMManager (csrc/cpu/shm.cpp) creates "<group name>_<rank>" with O_EXCL and unlinks the names only
    in its destructor, a static one that a rank leaving by os._exit or a kill never runs: each probe left two
    names in /dev/shm, and a later probe that drew the same port (the default ident's part) died at "create shm
    in SHMManager failed. errno: 17" (CI, 2026-12-07). _init_cpu_shm's second barrier follows every rank's
    join, so the mappings are all made; the memory stays until the last one goes."""
    try:
        from _posixshmem import shm_unlink
    except ImportError:  # not a POSIX CPython: nothing was created by name here
        return
    try:
        shm_unlink(f"/{group_name}_{rank}")
    except OSError:
        pass  # already gone: the destructor's own unlink ignores this too


class ShmBackend(Backend):
    """vLLM's CpuCommunicator, built the way GroupCoordinator builds it for the TP group."""

    name = "shm"
    kind = "shm"
    ops = ops_for(kind)
    # A non-destination rank returns from shm_gather without waiting for anyone, so it
    # can commit the next op's ready stamp while the destination still spins in the op
    # before the gather. vLLM's shm protocol (csrc/cpu/shm.cpp, check_stamp_ready)
    # accepts a peer one stamp ahead, not two: lineup, gather, lineup with the
    # destination descheduled in the first lineup deadlocks both ranks (seen on a
    # 2-core CI machine; tests/test_probe_dist.py forces it with SIGSTOP). A host
    # barrier before each gather's lineup keeps the lead at one. vLLM's own decode
    # path does not call gather on CPU (use_all_gather() is True), so serving cannot
    # meet this order.
    no_back_to_back = ("gather",)

    def __init__(self, cpu_group, local_rank):
        super().__init__(cpu_group, local_rank)
        try:
            from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator, _CPUSHMDistributed
            from vllm.platforms import current_platform
        except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
            raise Ineligible(f"vLLM is not importable ({type(e).__name__}: {e})") from None
        if not current_platform.is_cpu():
            raise Ineligible("vLLM's shared-memory all-reduce is the CPU platform's; this vLLM is a GPU build")
        # vLLM's CPU worker loads its kernels and sets the group identity before building groups.
        current_platform.import_kernels()
        if not hasattr(torch.ops._C, "init_shm_manager"):
            raise Ineligible("this vLLM build has no torch.ops._C.init_shm_manager (shared-memory communicator)")
        os.environ.setdefault("VLLM_DIST_IDENT", f"tpcomm-probe-{os.environ.get('MASTER_PORT', '0')}")
        self.group = self._group("gloo")
        # unique_name must start with "tp" for vLLM to pick the shm module (cpu_communicator.py).
        self.comm = CpuCommunicator(cpu_group=self.group, device_group=self.group, unique_name="tp:0")
        if not isinstance(self.comm.dist_module, _CPUSHMDistributed):
            raise Ineligible(
                "vLLM's CpuCommunicator fell back to torch.distributed (ranks disagree on the SHM group name)"
            )
        _unlink_own_segment(self.comm.dist_module.group_name, self.comm.rank)

    lineup_name = "tiny shm all_reduce"

    def lineup(self, ctrl):
        # A gloo barrier releases ranks up to ~1 ms apart (TCP, a sleeping thread to
        # wake): that skew, not the shm op, would be timed. vLLM's ranks reach an
        # all-reduce hot, spinning; a tiny shm all-reduce lines them up the same way.
        if not hasattr(self, "_token"):
            self._token = torch.zeros(8, dtype=torch.float32)
        self.comm.all_reduce(self._token)


class NcclBackend(Backend):
    name = "nccl"
    graph_capable = True
    kind = "torch_dist"
    ops = ops_for(kind)

    def __init__(self, cpu_group, local_rank):
        super().__init__(cpu_group, local_rank)
        self.device = _rank_device(cpu_group, local_rank)
        if not dist.is_nccl_available():
            raise Ineligible("this torch build has no NCCL")
        self.group = self._group("nccl")

    lineup_name = "tiny nccl all_reduce (device stream)"

    def lineup(self, ctrl):
        # Enqueued on the current stream: the start event after it fires when this rank's
        # copy of the tiny all-reduce is done, i.e. once every rank has arrived.
        dist.all_reduce(self._tiny(), group=self.group)

    def _tiny(self) -> torch.Tensor:
        if not hasattr(self, "_token"):
            self._token = torch.zeros(4, dtype=torch.float32, device=self.device)  # 16 B: custom AR's minimum unit
        return self._token

    def sync(self):
        torch.cuda.synchronize(self.device)


class PyNcclBackend(NcclBackend):
    name = "pynccl"
    kind = "pynccl"
    ops = ops_for(kind)

    def __init__(self, cpu_group, local_rank):
        pynccl = _vllm_cuda_setup(self, cpu_group, local_rank, "vllm.distributed.device_communicators.pynccl", "PyNccl")
        self.comm = pynccl.PyNcclCommunicator(group=self.group, device=self.device)
        if self.comm.disabled:
            raise Ineligible("PyNcclCommunicator disabled itself (world size 1 or libnccl not found)")

    def _close_comm(self):
        comm = self.__dict__.pop("comm", None)
        if comm is not None and not comm.disabled:
            comm.destroy()  # vLLM's: ncclCommAbort in a daemon thread with a timeout

    lineup_name = "tiny pynccl all_reduce (device stream)"

    def lineup(self, ctrl):
        self.comm.all_reduce(self._tiny(), stream=torch.cuda.current_stream())


class CustomArBackend(NcclBackend):
    name = "custom-ar"
    kind = None  # vLLM's CustomAllreduce issues its all-reduce itself (run below)
    ops = ("all_reduce",)

    def __init__(self, cpu_group, local_rank):
        car = _vllm_cuda_setup(
            self, cpu_group, local_rank, "vllm.distributed.device_communicators.custom_all_reduce", "custom all-reduce"
        )
        layout = rank_layout() or []
        why = peers_not_visible([x["host"] for x in layout], [x["visible_gpus"] for x in layout])
        if why:  # the same verdict on every rank: all ranks gathered the same layout
            raise Ineligible(why)
        # vLLM's constructor and its checks raise on layouts it never sees in its own workers; any exception is
        # "not eligible here", agreed by all ranks so none goes on to measure alone.
        err = None
        try:
            self.comm = car.CustomAllreduce(group=self.group, device=self.device)
            if self.comm.disabled:
                err = custom_ar_reason(car, self.world, self.rank, self.group)
        except Exception as e:  # noqa: BLE001
            err = f"vLLM's CustomAllreduce raised {one_line(e)}"
        agree_or_ineligible(cpu_group, err)  # refused anywhere: make_backend's close() frees its IPC buffers

    lineup_name = "tiny custom-ar all_reduce (device stream)"

    def lineup(self, ctrl):
        if self.comm.custom_all_reduce(self._tiny()) is None:  # never expected (16 B, fp32); say so if it is
            self.lineup_name = "gloo barrier (host; custom-ar refused a 16 B all_reduce)"
            dist.barrier(group=ctrl)

    def run(self, op, b):
        out = self.comm.custom_all_reduce(b.inp)
        if out is None:  # vLLM would fall through to PyNccl for this tensor
            raise Ineligible(
                f"vLLM's should_custom_ar() refuses {b.inp.numel() * b.inp.element_size()} B "
                f"(max_size {self.comm.max_size} B, multiple of 16 B, fp16/bf16/fp32)"
            )
        return out

    def capture(self):
        return self.comm.capture()

    def _close_comm(self):
        comm = self.__dict__.pop("comm", None)
        if comm is not None and not comm.disabled:
            comm.close()  # vLLM's: frees the IPC buffers


def custom_ar_reason(car, world: int, rank: int, group) -> str:
    """Why vLLM's CustomAllreduce disabled itself: the checks of its __init__, in its order."""
    try:
        return _custom_ar_reason(car, world, rank, group)
    except Exception as e:  # noqa: BLE001 - its checks index devices the way vLLM does and can raise the same way
        return f"disabled by vLLM; asking why raised {one_line(e)}"


def _custom_ar_reason(car, world: int, rank: int, group) -> str:
    from vllm.distributed.parallel_state import in_the_same_node_as
    from vllm.platforms import current_platform

    if not car.custom_ar:
        return "vLLM's custom all-reduce library (_C custom_ar ops) is not in this build"
    if world not in car.CustomAllreduce._SUPPORTED_WORLD_SIZES:
        return f"world size {world} not in {car.CustomAllreduce._SUPPORTED_WORLD_SIZES}"
    if not all(in_the_same_node_as(group, source_rank=0)):
        return "ranks span nodes and not every GPU is MNNVL-capable"
    try:  # each rank seeing every GPU (vLLM itself all-gathers each rank's own physical id instead)
        ids = [current_platform.visible_device_id_to_physical_device_id(i) for i in range(world)]
    except (IndexError, ValueError):
        ids = None
    if world > 2 and ids is not None and not current_platform.is_fully_connected(ids):
        return "not supported on more than two PCIe-only GPUs (no NVLink between all of them)"
    if not car._can_p2p(rank, world):
        return "GPU P2P capability missing or vLLM's P2P test failed"
    return "disabled by vLLM (see its log)"


def agree_or_ineligible(cpu_group, err: str | None) -> None:
    """Every rank says whether its set-up failed; all raise Ineligible (with the first rank's reason) if any did."""
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, err, group=cpu_group)
    bad = [(r, e) for r, e in enumerate(got) if e]
    if bad:
        raise Ineligible(first_reason(bad, len(got), dist.get_rank()))


BACKEND_CLASSES = {c.name: c for c in (GlooBackend, ShmBackend, NcclBackend, PyNcclBackend, CustomArBackend)}


def make_backend(name: str, cpu_group, local_rank: int) -> Backend:
    return built(BACKEND_CLASSES[name], cpu_group, local_rank)


def built(cls: type, *args) -> Backend:
    """`cls(*args)`, or, when its construction raises (Ineligible, or vLLM's own errors), what it built so far
    destroyed before the exception goes on."""
    obj = cls.__new__(cls)
    try:
        obj.__init__(*args)
    except BaseException:
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - the construction's own error is the one to report
            pass
        raise
    return obj


def _vllm_cuda_setup(backend: Backend, cpu_group, local_rank: int, module: str, what: str):
    """Shared set-up of the backends built on a vLLM communicator: CUDA device, a gloo
    side group (vLLM's communicators take one), and the vLLM module, or Ineligible."""
    import importlib

    Backend.__init__(backend, cpu_group, local_rank)
    backend.device = _rank_device(cpu_group, local_rank)
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        raise Ineligible(f"vLLM's {what} is not importable ({type(e).__name__}: {e})") from None
    backend.group = backend._group("gloo")
    return mod


def _rank_device(cpu_group, local_rank: int) -> torch.device:
    """This rank's GPU, mapped by the visible count and checked against every other rank's
    (probes/devices.py); made current, or Ineligible on every rank."""
    try:
        device = cuda_device(local_rank, cpu_group)
    except NoDevice as e:
        raise Ineligible(str(e)) from None
    torch.cuda.set_device(device)
    return device
