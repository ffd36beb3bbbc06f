"""One measurement's timing: isolated and pipelined samples, their summary
(buffers, correctness check and busbw factor per op: probes/ops.py).

Units: times in microseconds (us), sizes in bytes, bandwidth in GB/s (1e9 B/s).
Isolated: every rank waits on a barrier before each op, then times that op alone
(what a decode step sees: the op starts cold, its latency includes rank skew).
Pipelined: ops back to back with no barrier, time / count (nccl-tests' default).
A sample's time is the slowest rank's, as nccl-tests reports.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


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

    return {
        "p50_us": pct(50),
        "p90_us": pct(90),
        "p99_us": pct(99),
        "min_us": s[0],
        "max_us": s[-1],
        "mean_us": statistics.fmean(s),
        "samples": len(s),
    }


def slowest_rank(samples: list[float], ctrl_group) -> list[float]:
    """Per-sample maximum over ranks (all ranks run the same number of samples)."""
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl_group)
    return t.tolist()
