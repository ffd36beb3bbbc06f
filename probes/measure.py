"""One measurement's timing: isolated and pipelined samples, their summary
(buffers, correctness check and busbw factor per op: probes/ops.py).

Units: times in microseconds (us), sizes in bytes, bandwidth in GB/s (1e9 B/s).
Isolated: before each op the ranks line up with a tiny collective of the op's own
backend on the op's stream (probes/backends.py `lineup`), then each times the op
alone (what a decode step sees: the op starts cold). On a GPU a sleep kernel (the
slack) follows the line-up, so every rank's host has enqueued the op before its
device reaches it, and a second line-up follows the slack: the slack spins a count
of SM clock cycles calibrated once per rank, so on ranks whose clocks have moved
since it lasts different times, and without the second line-up each rank would
start the op when its own slack ended, the maximum over ranks carrying that
difference as skew. None of these is inside the timed interval. Whether the slack
was long enough is checked per sample: once the op and the end event are queued,
the start event must not have fired yet (else the device idled, waiting for the
host, inside the interval); samples where it had are counted as `slack_overruns`.
Pipelined: ops back to back with no barrier, time / count (nccl-tests' default).
A sample's time is the slowest rank's, as nccl-tests reports. The skew left after
the line-up is measured per sample as the spread of the op's duration over ranks
(slowest - fastest): a collective ends at about the same moment on every rank, so
a rank that started late shows a shorter duration by the time it was late.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

# Device time between the line-up and the start event: more than a host needs to enqueue one
# collective (ProcessGroupNCCL eager: ~20-40 us of host time, more on a busy host) or a graph
# replay, plus the events; outside the timed interval, small against the run's wall time.
LAUNCH_SLACK_US = 300.0


def slack_us() -> float:
    """The slack in use: LAUNCH_SLACK_US, or TPCOMM_PROBE_SLACK_US (tests set 0 to provoke overruns)."""
    return float(os.environ.get("TPCOMM_PROBE_SLACK_US", LAUNCH_SLACK_US))


class Timer:
    """Wall clock on CPU; CUDA events on GPU (the op is asynchronous there)."""

    def __init__(self, backend):
        from probes.replay_kernels import Skew

        self.backend = backend
        self.cuda = backend.device.type == "cuda"
        self.name = "cuda_event" if self.cuda else "perf_counter"
        self.slack_us = slack_us() if self.cuda else None
        # Built here, before any line-up: its calibration waits on the device, which after a
        # line-up would line the first sample up on the host instead.
        self._slack = Skew(self.slack_us, backend.device) if self.cuda else None
        self.overran = False  # the last lined-up sample's slack ran out before the op was queued
        # CPU: this rank's thread waited for a CPU (runnable, another task on it) for over PREEMPTED_NS between the
        # start of the last sample's line-up and the end of its op: its time and the skew then hold that wait.
        self.preempted = False

    def time_us(self, fn, lineup=None, after=None) -> float:
        """Time one call of `fn`; `lineup()` runs first (on a GPU: line-up, slack, line-up), then `after()` (a
        test's known delay on one rank), all outside the timed interval."""
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if lineup is not None:
                lineup()
                self._slack()
                lineup()  # the slack's length differs between ranks whose clocks differ: line up again after it
            if after is not None:
                after()
            s.record()
            fn()
            e.record()
            # Queried once both are queued: if the start event has already fired, the device reached
            # it before the host had queued the op (or the end event), and waited inside the interval.
            self.overran = lineup is not None and s.query()
            e.synchronize()
            return s.elapsed_time(e) * 1000.0
        c0 = cpu_wait_ns()
        if lineup is not None:
            lineup()
        if after is not None:
            after()
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        self.preempted = cpu_wait_ns() - c0 > PREEMPTED_NS
        return (t1 - t0) / 1000.0


PREEMPTED_NS = 100_000  # a sample in which some rank waited this long for a CPU counts as preempted


def cpu_wait_ns() -> int:
    """Time this thread has spent runnable but waiting for a CPU (Linux schedstat run_delay, ns): a rank
    preempted by another runnable task. 0 where the kernel does not keep it."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


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


def rank_spread(samples: list[float], ctrl_group) -> tuple[list[float], list[float]]:
    """Per sample: (slowest rank's time, slowest - fastest), the latter the skew left after the line-up."""
    hi = torch.tensor(samples, dtype=torch.float64)
    lo = hi.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=ctrl_group)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=ctrl_group)
    return hi.tolist(), (hi - lo).tolist()
