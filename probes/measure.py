"""One measurement: buffers, the correctness check, isolated and pipelined timing.

Units: times in microseconds (us), sizes in bytes, bandwidth in GB/s (1e9 B/s).
Isolated: every rank waits on a barrier before each op, then times that op alone
(what a decode step sees: the op starts cold, its latency includes rank skew).
Pipelined: ops back to back with no barrier, time / count (nccl-tests' default).
A sample's time is the slowest rank's, as nccl-tests reports.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8}

# nccl-tests (doc/PERFORMANCE.md): size reported, and the busbw factor, per op.
def nccl_size_and_factor(op: str, nbytes: int, n: int) -> tuple[int, float]:
    if op == "all_reduce":
        return nbytes, 2 * (n - 1) / n
    if op in ("all_gather", "gather"):
        return nbytes * n, (n - 1) / n
    if op in ("reduce_scatter", "all_to_all"):
        return nbytes, (n - 1) / n
    return nbytes, 1.0  # send_recv


@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor | None
    gather_list: list | None
    expected: torch.Tensor | None  # what this rank must hold after the op
    count: int                     # elements per rank input


def _pattern(rank: int, numel: int, dtype, device) -> torch.Tensor:
    # Small integers stay exact in bf16 after summing over up to 16 ranks.
    return ((torch.arange(numel, device=device) % 5) + rank + 1).to(dtype)


def make_buffers(op: str, nbytes: int, dtype_name: str, rank: int, n: int, device) -> Buffers:
    dtype = DTYPES[dtype_name]
    esize = torch.empty((), dtype=dtype).element_size()
    numel = max(1, -(-nbytes // esize))
    if op in ("reduce_scatter", "all_to_all"):
        numel = -(-numel // n) * n
    inp = _pattern(rank, numel, dtype, device)
    out, glist, expected = None, None, None
    if op == "all_reduce":
        expected = sum(_pattern(r, numel, torch.float32, device) for r in range(n)).to(dtype)
    elif op in ("all_gather", "gather"):
        out = torch.empty(numel * n, dtype=dtype, device=device)
        if op == "gather" and rank == 0:
            glist = [torch.empty(numel, dtype=dtype, device=device) for _ in range(n)]
        if op == "all_gather" or rank == 0:
            expected = torch.cat([_pattern(r, numel, dtype, device) for r in range(n)])
    elif op == "reduce_scatter":
        out = torch.empty(numel // n, dtype=dtype, device=device)
        full = sum(_pattern(r, numel, torch.float32, device) for r in range(n)).to(dtype)
        expected = full.view(n, -1)[rank].clone()
    elif op == "all_to_all":
        out = torch.empty(numel, dtype=dtype, device=device)
        c = numel // n
        expected = torch.cat([_pattern(r, numel, dtype, device)[rank * c:(rank + 1) * c] for r in range(n)])
    elif op == "send_recv":
        out = torch.empty(numel, dtype=dtype, device=device)
        expected = _pattern((rank - 1) % n, numel, dtype, device)
    return Buffers(inp, out, glist, expected, numel)


def count_wrong(result, b: Buffers) -> int:
    if b.expected is None:
        return 0
    if result is None:
        return b.expected.numel()
    got = result.reshape(-1)
    if got.numel() != b.expected.numel():
        return b.expected.numel()
    return int((got.float() != b.expected.float()).sum().item())


class Timer:
    """Wall clock on CPU; CUDA events on GPU (the op is asynchronous there)."""

    def __init__(self, backend):
        self.backend = backend
        self.cuda = backend.device.type == "cuda"
        self.name = "cuda_event" if self.cuda else "perf_counter"

    def time_us(self, fn) -> float:
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) * 1000.0
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1000.0


def summarize(samples_us: list[float]) -> dict:
    s = sorted(samples_us)

    def pct(p):
        if len(s) == 1:
            return s[0]
        k = (len(s) - 1) * p / 100
        lo = int(k)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99), "min_us": s[0], "max_us": s[-1],
            "mean_us": statistics.fmean(s), "samples": len(s)}


def slowest_rank(samples: list[float], ctrl_group) -> list[float]:
    """Per-sample maximum over ranks (all ranks run the same number of samples)."""
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl_group)
    return t.tolist()
