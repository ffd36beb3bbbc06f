"""What the replay swaps between CPU and GPU: the work kernel, the clock and the
skew delay. The step loop (probes/replay.py) is the same code on both.

Work: one buffer per rank holding every site's bytes back to back, so each site
reads memory no other site touched in that step (a decode step reads each weight
once). The kernel is a full read-reduce (torch.sum), which streams at the memory
roofline on both devices (single thread per rank on CPU: the rank's own core).

Clocks: the host clock reads time.perf_counter_ns (CLOCK_MONOTONIC on Linux, one
timeline for every process of a host); the CUDA clock records events, inside the
graph (external=True) when the step is captured, and is read after the step.

Units: *_ns nanoseconds, *_us microseconds, bytes.
"""

from __future__ import annotations

import time

import torch


class Work:
    """Per slot: read `work_bytes` from a region of `footprint_bytes` (the site's own
    bytes). A scale above 1 re-reads the region (more time, the model's footprint:
    for layers that cost more than their bytes, as a small model on a CPU does);
    below 1 the region is the scaled bytes, read once."""

    def __init__(self, work_bytes: list[int], footprint_bytes: list[int], device):
        elems = [max(0, int(f) // 4) for f in footprint_bytes]  # float32 elements
        # ones, not empty: every page is touched (and owned by this rank's NUMA node) before timing
        self.buf = torch.ones(sum(elems) or 1, dtype=torch.float32, device=device)
        self.plan: list[list[torch.Tensor]] = []
        off = 0
        for e, w in zip(elems, work_bytes):
            view = self.buf[off : off + e]
            off += e
            reads = []
            if e:
                full, rest = divmod(max(0, int(w) // 4), e)
                reads = [view] * full + ([view[:rest]] if rest else [])
            self.plan.append(reads)
        self.outs = [torch.zeros((), dtype=torch.float32, device=device) for _ in elems]
        self.bytes = sum(elems) * 4
        self.read_bytes = sum(int(v.numel()) * 4 for reads in self.plan for v in reads)

    def run(self, i: int) -> None:
        out = self.outs[i]
        for v in self.plan[i]:
            torch.sum(v, dim=0, out=out)


class HostClock:
    name = "perf_counter"

    def __init__(self, ncoll: int, graph: bool = False):
        self.t0 = [0] * ncoll
        self.t1 = [0] * ncoll

    def step_begin(self):
        self.s0 = time.perf_counter_ns()

    def step_end(self):
        self.s1 = time.perf_counter_ns()

    def begin(self, i: int):
        self.t0[i] = time.perf_counter_ns()

    def end(self, i: int):
        self.t1[i] = time.perf_counter_ns()

    def inner_begin(self):
        pass

    def read(self, ncoll_used: int) -> tuple[int, float, list[int], list[float]]:
        """(step start ns, step us, collective start ns, collective us)."""
        n = ncoll_used
        return (
            self.s0,
            (self.s1 - self.s0) / 1e3,
            self.t0[:n],
            [(b - a) / 1e3 for a, b in zip(self.t0[:n], self.t1[:n])],
        )


class CudaClock:
    """Events around the step (outside any graph) and around each collective
    (captured into the graph in graph mode, read after every replay).

    One host wait per step, on the step's end event, after which every event of the
    step is complete and read without waiting (vLLM too waits once per decode step,
    for the sampled tokens); the replay counts the waits it sees (HostWaits below)."""

    def __init__(self, ncoll: int, graph: bool = False):
        self.name = "cuda_event_graph" if graph else "cuda_event"
        ext = {"external": True} if graph else {}
        self.e0 = [torch.cuda.Event(enable_timing=True, **ext) for _ in range(ncoll)]
        self.e1 = [torch.cuda.Event(enable_timing=True, **ext) for _ in range(ncoll)]
        self.anchor = torch.cuda.Event(enable_timing=True, **ext)
        self.graph = graph
        self.s0 = torch.cuda.Event(enable_timing=True)
        self.s1 = torch.cuda.Event(enable_timing=True)

    def step_begin(self):
        self.host0 = time.perf_counter_ns()
        self.s0.record()
        if not self.graph:
            self.anchor.record()

    def step_end(self):
        self.s1.record()

    def inner_begin(self):
        # graph mode: the collectives' offsets are measured from an event inside the graph
        if self.graph:
            self.anchor.record()

    def begin(self, i: int):
        self.e0[i].record()

    def end(self, i: int):
        self.e1[i].record()

    def read(self, ncoll_used: int):
        self.s1.synchronize()
        step_us = self.s0.elapsed_time(self.s1) * 1e3
        n = ncoll_used
        t0 = [self.host0 + int(self.anchor.elapsed_time(e) * 1e6) for e in self.e0[:n]]
        us = [a.elapsed_time(b) * 1e3 for a, b in zip(self.e0[:n], self.e1[:n])]
        return self.host0, step_us, t0, us


class HostWaits:
    """Counts the host's explicit waits on the device while active (a context manager):
    calls of torch.cuda.synchronize, torch.accelerator.synchronize, Event.synchronize
    and Stream.synchronize, wherever they come from (the clock, a backend, vLLM).
    Not seen: implicit waits (.item(), .cpu(), .tolist() of a CUDA tensor) and code
    that bound the function before entry (`from torch.cuda import synchronize`)."""

    def __init__(self):
        self.count = 0
        self._saved: list[tuple[object, str, object]] = []

    def _targets(self):
        out = [(torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize")]
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
            out.append((torch.accelerator, "synchronize"))
        return out

    def __enter__(self) -> HostWaits:
        for owner, name in self._targets():
            orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            self._saved.append((owner, name, orig))

            def counted(*a, _orig=orig, **k):
                self.count += 1
                return _orig(*a, **k)

            setattr(owner, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)
        self._saved.clear()


class Skew:
    """A known delay on one rank before each collective: a spin on CPU (a sleep
    would hand the core away and come back late), a sleep kernel on GPU whose
    cycles per microsecond are measured once with events.

    Clock assumption (GPU): `torch.cuda._sleep` spins a number of SM clock cycles,
    converted from microseconds once, at construction, against a 1 ms spin timed
    with events. The delay is that length only while the SM clock stays where it
    was then: a clock that drops later (power or thermal capping, an idle GPU
    clocking down between samples) makes it longer, one that boosts makes it
    shorter. The probe's slack (probes/measure.py) does not rely on the length:
    each sample checks that the slack covered the host's enqueue (slack_overruns).
    The test fault's delay (TPCOMM_PROBE_FAULT=late) and the replay's --skew-us are
    stated lengths under this assumption."""

    def __init__(self, us: float, device):
        self.us = float(us)
        self.cuda = device.type == "cuda"
        self.cycles = 0
        if self.cuda and self.us > 0:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)  # load the kernel
            a.record()
            torch.cuda._sleep(1_000_000)
            b.record()
            b.synchronize()
            self.cycles = int(self.us * 1_000_000 / max(a.elapsed_time(b) * 1e3, 1e-3))

    def __call__(self) -> None:
        if self.us <= 0:
            return
        if self.cuda:
            torch.cuda._sleep(self.cycles)
            return
        end = time.perf_counter_ns() + int(self.us * 1e3)
        while time.perf_counter_ns() < end:
            pass
