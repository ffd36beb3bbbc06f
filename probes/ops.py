"""Each collective described once, as nccl-tests' per-collective table
(doc/PERFORMANCE.md): the buffers one rank holds, what it must hold afterwards
(the correctness check), the size nccl-tests reports and its bus-bandwidth
factor, and the call per backend kind:

    torch_dist  torch.distributed on the backend's group (gloo, nccl)
    shm         vLLM's CpuCommunicator (shared-memory dist module)
    pynccl      vLLM's PyNcclCommunicator

Custom all-reduce and FlashInfer IPC have all_reduce only and issue it themselves
(probes/backends.py, probes/flashinfer_ipc.py).

Units: `nbytes` is the per-rank input buffer of one call (probes/spec.py), `numel`
its elements, n the world size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from probes.spec import OPS

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor | None
    gather_list: list | None
    expected: torch.Tensor | None  # what this rank must hold after the op
    count: int  # elements per rank input


def _pattern(rank: int, numel: int, dtype, device) -> torch.Tensor:
    # Small integers stay exact in bf16 after summing over up to 16 ranks.
    return ((torch.arange(numel, device=device) % 5) + rank + 1).to(dtype)


def _sum(n: int, numel: int, dtype, device) -> torch.Tensor:
    return sum(_pattern(r, numel, torch.float32, device) for r in range(n)).to(dtype)


def _cat(n: int, numel: int, dtype, device) -> torch.Tensor:
    return torch.cat([_pattern(r, numel, dtype, device) for r in range(n)])


def _all_to_all_expected(rank, n, numel, dtype, device):
    c = numel // n
    return torch.cat([_pattern(r, numel, dtype, device)[rank * c : (rank + 1) * c] for r in range(n)])


def _all_reduce_torch(be, b):
    dist.all_reduce(b.inp, group=be.group)
    return b.inp


def _torch_out(fn):
    """torch.distributed's (output, input) form: the result is the output buffer."""

    def call(be, b):
        fn(b.out, b.inp, group=be.group)
        return b.out

    return call


def _send_recv_torch(be, b):
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, b.inp, (be.rank + 1) % be.world, be.group),
            dist.P2POp(dist.irecv, b.out, (be.rank - 1) % be.world, be.group),
        ]
    )
    for r in reqs:
        r.wait()
    return b.out


def _send_recv_pynccl(be, b):
    # Even ranks send first: PyNccl has no batched isend/irecv.
    s = torch.cuda.current_stream()
    nxt, prv = (be.rank + 1) % be.world, (be.rank - 1) % be.world
    if be.rank % 2 == 0:
        be.comm.send(b.inp, nxt, stream=s)
        be.comm.recv(b.out, prv, stream=s)
    else:
        be.comm.recv(b.out, prv, stream=s)
        be.comm.send(b.inp, nxt, stream=s)
    return b.out


def _gather_torch(be, b):
    root = be.rank == 0
    dist.gather(b.inp, b.gather_list if root else None, dst=0, group=be.group)
    return torch.cat(b.gather_list) if root else None


def _pynccl_out(method: str):
    """PyNccl's (output, input) form on the current stream."""

    def call(be, b):
        getattr(be.comm, method)(b.out, b.inp, stream=torch.cuda.current_stream())
        return b.out

    return call


Run = Callable[..., torch.Tensor | None]  # (backend, Buffers) -> the result tensor


@dataclass(frozen=True)
class Op:
    name: str
    out_numel: Callable[[int, int], int] | None  # (input elements, n) -> output elements; None: in place
    expected: Callable[..., torch.Tensor | None]  # (rank, n, numel, dtype, device) -> what the rank holds after
    busbw_factor: Callable[[int], float]  # nccl-tests: busbw = algbw x factor(n)
    size_is_output: bool = False  # nccl-tests' size is the whole output (n x the per-rank input)
    chunked: bool = False  # the input is n equal chunks: elements rounded up to a multiple of n
    root_list: bool = False  # rank 0 receives into a list of n tensors (gather)
    torch_dist: Run | None = None
    shm: Run | None = None
    pynccl: Run | None = None

    @property
    def in_place(self) -> bool:
        """The result overwrites the input: repeated calls compound (zero it before timing)."""
        return self.out_numel is None

    def nccl_size_and_factor(self, nbytes: int, n: int) -> tuple[int, float]:
        return (nbytes * n if self.size_is_output else nbytes), self.busbw_factor(n)

    def buffers(self, nbytes: int, dtype_name: str, rank: int, n: int, device) -> Buffers:
        dtype = DTYPES[dtype_name]
        esize = torch.empty((), dtype=dtype).element_size()
        numel = max(1, -(-nbytes // esize))
        if self.chunked:
            numel = -(-numel // n) * n
        inp = _pattern(rank, numel, dtype, device)
        out = None if self.out_numel is None else torch.empty(self.out_numel(numel, n), dtype=dtype, device=device)
        glist = None
        if self.root_list and rank == 0:
            glist = [torch.empty(numel, dtype=dtype, device=device) for _ in range(n)]
        return Buffers(inp, out, glist, self.expected(rank, n, numel, dtype, device), numel)

    def run(self, kind: str, backend, b: Buffers):
        fn = getattr(self, kind)
        if fn is None:
            raise ValueError(self.name)
        return fn(backend, b)


COLLECTIVES: dict[str, Op] = {
    o.name: o
    for o in (
        Op(
            "all_reduce",
            out_numel=None,
            expected=lambda rank, n, numel, dt, dev: _sum(n, numel, dt, dev),
            busbw_factor=lambda n: 2 * (n - 1) / n,
            torch_dist=_all_reduce_torch,
            shm=lambda be, b: be.comm.all_reduce(b.inp),
            pynccl=lambda be, b: be.comm.all_reduce(b.inp, b.out, stream=torch.cuda.current_stream()),
        ),
        Op(
            "all_gather",
            out_numel=lambda numel, n: numel * n,
            expected=lambda rank, n, numel, dt, dev: _cat(n, numel, dt, dev),
            busbw_factor=lambda n: (n - 1) / n,
            size_is_output=True,
            torch_dist=_torch_out(dist.all_gather_into_tensor),
            shm=lambda be, b: be.comm.all_gather(b.inp, dim=0),
            pynccl=_pynccl_out("all_gather"),
        ),
        Op(
            "gather",
            out_numel=lambda numel, n: numel * n,
            expected=lambda rank, n, numel, dt, dev: _cat(n, numel, dt, dev) if rank == 0 else None,
            busbw_factor=lambda n: (n - 1) / n,
            size_is_output=True,
            root_list=True,
            torch_dist=_gather_torch,
            shm=lambda be, b: be.comm.gather(b.inp, dst=0, dim=0),
        ),
        Op(
            "reduce_scatter",
            out_numel=lambda numel, n: numel // n,
            expected=lambda rank, n, numel, dt, dev: _sum(n, numel, dt, dev).view(n, -1)[rank].clone(),
            busbw_factor=lambda n: (n - 1) / n,
            chunked=True,
            torch_dist=_torch_out(dist.reduce_scatter_tensor),
            pynccl=_pynccl_out("reduce_scatter"),
        ),
        Op(
            "all_to_all",
            out_numel=lambda numel, n: numel,
            expected=_all_to_all_expected,
            busbw_factor=lambda n: (n - 1) / n,
            chunked=True,
            torch_dist=_torch_out(dist.all_to_all_single),
        ),
        Op(
            "send_recv",
            out_numel=lambda numel, n: numel,
            expected=lambda rank, n, numel, dt, dev: _pattern((rank - 1) % n, numel, dt, dev),
            busbw_factor=lambda n: 1.0,
            torch_dist=_send_recv_torch,
            pynccl=_send_recv_pynccl,
        ),
    )
}
assert tuple(COLLECTIVES) == OPS, "probes/spec.py's OPS (torch-free, for tpcomm probe) must list this table"


def ops_for(kind: str) -> tuple[str, ...]:
    """The ops a backend kind can issue."""
    return tuple(name for name, o in COLLECTIVES.items() if getattr(o, kind) is not None)


def count_wrong(result, b: Buffers) -> int:
    """Elements of `result` that differ from what this rank must hold (nccl-tests' #wrong)."""
    if b.expected is None:
        return 0
    if result is None:
        return b.expected.numel()
    got = result.reshape(-1)
    if got.numel() != b.expected.numel():
        return b.expected.numel()
    return int((got.float() != b.expected.float()).sum().item())
