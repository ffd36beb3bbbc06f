"""Rank-side decode-step replay: the plan's collectives in vLLM's order, each
after memory-streaming work of its layer's size. One process per rank, env://
rendezvous like probes/collectives.py (tpcomm's launcher, torchrun, srun):

    torchrun --nproc-per-node 2 probes/replay.py --spec replay_spec.json

The spec (written by `tpcomm probe --replay`, see tpcomm/probe/schedule.py):
    {"schedule": {"slots": [{"site", "layer", "op", "bytes", "dtype", "work_bytes", "footprint_bytes"}], "hidden", "batch"},
     "items": [{"backend", "mode"}], "steps", "warmup", "timeout", "skew_us", "skew_rank", "out_jsonl"}

Per item, three timings of the same step: full (work, then the collective, per
slot), compute (the collectives replaced by nothing), comm (the work removed:
collectives back to back in schedule order). Rank 0 appends one JSON record per
timing to out_jsonl: {"kind": "replay", backend, mode, timing, "ranks": [per rank
step_t0_ns, step_us, coll_t0_ns, coll_us (steps x slots, row-major)]}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: make `probes` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from probes.backends import Ineligible, make_backend
from probes.collectives import RankState, _hardware, _layout, _maybe_fault, end_rank, leave, start_rank
from probes.measure import cpu_wait_ns
from probes.ops import COLLECTIVES, count_wrong
from probes.replay_kernels import CudaClock, HostClock, HostWaits, Skew, Work

TIMINGS = ("full", "compute", "comm")
# Ops a backend lacks go where vLLM sends them (CudaCommunicator: PyNccl; CpuCommunicator: shm has them all).
FALLBACK = {"custom-ar": "pynccl", "flashinfer-ipc": "pynccl", "pynccl": "nccl"}


def _backend(name: str, ctrl, local_rank: int, sched: dict):
    if name == "flashinfer-ipc":
        from probes.backends import built
        from probes.flashinfer_ipc import FlashInferIpcBackend

        return built(FlashInferIpcBackend, ctrl, local_rank, sched["hidden"], sched["batch"])
    return make_backend(name, ctrl, local_rank)


class Step:
    """One decode step on this rank: buffers, work, clock; `issue(timing)` is the body
    that runs eagerly or is captured into a CUDA graph."""

    def __init__(self, primary, fallback, sched: dict, rank: int, skew: Skew, graph: bool):
        self.slots = sched["slots"]
        self.rank, self.skew, self.graph = rank, skew, graph
        dev = primary.device
        self.by_slot = [fallback if (fallback and primary.unsupported(s["op"])) else primary for s in self.slots]
        n = primary.world
        self.bufs = {}
        for s in self.slots:
            key = (s["op"], s["bytes"], s["dtype"])
            if key not in self.bufs:
                self.bufs[key] = COLLECTIVES[s["op"]].buffers(s["bytes"], s["dtype"], rank, n, dev)
        self.work = Work(
            [s["work_bytes"] for s in self.slots], [s.get("footprint_bytes", s["work_bytes"]) for s in self.slots], dev
        )
        self.clock = (CudaClock if dev.type == "cuda" else HostClock)(len(self.slots), graph)

    def check(self) -> int:
        """One call of each distinct collective on its pattern: elements wrong on this rank."""
        wrong = 0
        done = set()
        for s, be in zip(self.slots, self.by_slot):
            key = (s["op"], s["bytes"], s["dtype"])
            if key in done:
                continue
            done.add(key)
            b = self.bufs[key]
            wrong += count_wrong(be.run(s["op"], b), b)
            be.sync()
            if COLLECTIVES[s["op"]].in_place:
                b.inp.zero_()  # zeros keep every later sum finite
        return wrong

    def issue(self, timing: str, state: RankState | None) -> int:
        """The step's body; returns how many collectives it issued."""
        c = self.clock
        c.inner_begin()
        k = 0
        for i, s in enumerate(self.slots):
            if timing != "comm":
                self.work.run(i)
                self.skew()
            if timing == "compute":
                continue
            if state is not None:
                state.tick()
            c.begin(k)
            self.by_slot[i].run(s["op"], self.bufs[(s["op"], s["bytes"], s["dtype"])])
            c.end(k)
            k += 1
        return k


def _capture(step: Step, timing: str, backends):
    """The whole step in one CUDA graph, as vLLM replays a full decode graph.

    Warm-up and capture run on one side stream, inside every backend's capture() context, as vLLM's
    graph_capture does: FlashInfer's PCIe IPC workspace is single-stream (PcieIpcAllReduceWorkspace
    _check_stream raises on another stream); its capture() rebinds it, and the first launch after that
    binds it to the stream it runs on, so a warm-up on a side stream before capture() would raise."""
    import contextlib

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with contextlib.ExitStack() as stack:
        for be in backends:
            stack.enter_context(be.capture())
        with torch.cuda.stream(s):
            for _ in range(2):
                step.issue(timing, None)
        s.synchronize()
        with torch.cuda.graph(g, stream=s):
            n = step.issue(timing, None)
    torch.cuda.current_stream().wait_stream(s)
    return g, n


def replay_item(primary, fallback, item: dict, spec: dict, ctrl, state: RankState, emit) -> None:
    """The three timings of one (backend, mode); each record is handed to `emit` as soon as it is
    gathered, so a rank lost in a later timing leaves the earlier ones on disk."""
    rank, world = primary.rank, primary.world
    sched = spec["schedule"]
    graph = item["mode"] == "graph"
    skew = Skew(spec.get("skew_us", 0.0) if rank == spec.get("skew_rank", world - 1) else 0.0, primary.device)
    state.set("check", {**item, "op": "decode step", "bytes": sum(s["bytes"] for s in sched["slots"])})
    step = Step(primary, fallback, sched, rank, skew, graph)
    wrong = torch.tensor([step.check()], dtype=torch.int64)
    dist.all_reduce(wrong, group=ctrl)
    used = list(dict.fromkeys(step.by_slot))
    for timing in TIMINGS:
        state.set(timing, {**item, "op": f"decode-step replay ({timing})", "bytes": 0, "timing": timing})
        if timing == "comm":  # test-only fault (TPCOMM_PROBE_FAULT): after two timings, so a kill leaves some finished
            for s in sched["slots"]:
                _maybe_fault(rank, s)
        g = None
        if graph:
            g, ncoll = _capture(step, timing, used)
        # cpu_wait_us: how long this rank waited for a CPU during the step (runnable, another task on its core;
        # CPU ranks; 0 on a GPU, whose clock times the device)
        rows = {"step_t0_ns": [], "step_us": [], "coll_t0_ns": [], "coll_us": [], "cpu_wait_us": []}
        cpu = primary.device.type != "cuda"
        for b in used:
            b.sync()
        dist.barrier(group=ctrl)
        # what the host really waits on while replaying, the clock's read included (explicit waits only)
        with HostWaits() as waits:
            for i in range(spec["warmup"] + spec["steps"]):
                c0 = cpu_wait_ns() if cpu else 0
                step.clock.step_begin()
                if g is not None:
                    state.tick(ncoll)
                    g.replay()
                else:
                    ncoll = step.issue(timing, state)
                step.clock.step_end()
                t0, us, ct0, cus = step.clock.read(ncoll)
                lost = (cpu_wait_ns() - c0) / 1e3 if cpu else 0.0
                if i >= spec["warmup"]:
                    rows["cpu_wait_us"].append(lost)
                    rows["step_t0_ns"].append(t0)
                    rows["step_us"].append(us)
                    rows["coll_t0_ns"] += ct0
                    rows["coll_us"] += cus
        for b in used:
            b.sync()
        state.set("gather")
        got = [None] * world if rank == 0 else None
        dist.gather_object({"rank": rank, **rows}, got, dst=0, group=ctrl)
        emit(
            {
                "kind": "replay",
                **item,
                "timing": timing,
                "world_size": world,
                "steps": spec["steps"],
                "warmup": spec["warmup"],
                "collectives_per_step": ncoll,
                "wrong": int(wrong.item()),
                "timer": step.clock.name,
                # explicit host waits on the device per replayed step, counted as they happen (HostWaits)
                "host_syncs_per_step": waits.count / (spec["warmup"] + spec["steps"]),
                "work_footprint_bytes_per_rank": step.work.bytes,
                "work_read_bytes_per_rank": step.work.read_bytes,
                "backends_used": [b.name for b in used],
                "ranks": got,
            }
        )
        del g


def run(spec: dict, sink=None) -> int:
    local_rank, state, ctrl, emit, common = start_rank(spec, sink, len(spec["items"]))
    for item in spec["items"]:
        state.set("setup", None)
        name = item["backend"]
        primary = fallback = None
        try:
            primary = _backend(name, ctrl, local_rank, spec["schedule"])
            fb_name = FALLBACK.get(name)
            need_fb = fb_name and any(primary.unsupported(s["op"]) for s in spec["schedule"]["slots"])
            fallback = make_backend(fb_name, ctrl, local_rank) if need_fb else None
            bad = [s["op"] for s in spec["schedule"]["slots"] if primary.unsupported(s["op"]) and fallback is None]
            if bad:
                raise Ineligible(primary.unsupported(bad[0]))
            if item["mode"] == "graph" and not primary.graph_capable:
                raise Ineligible(f"{name} runs on the CPU: no CUDA graph mode")
        except Ineligible as e:
            for b in (primary, fallback):
                if b is not None:
                    b.close()
            emit({"kind": "skipped", **item, "op": "decode step", "bytes": 0, "reason": str(e), **common, **_layout()})
            continue
        where = {**common, "hardware": _hardware(primary.device), "device": str(primary.device), **_layout()}
        try:
            replay_item(primary, fallback, item, spec, ctrl, state, lambda rec, where=where: emit({**rec, **where}))
        finally:  # each item builds its own communicators: destroyed before the next one builds more
            for b in (primary, fallback):
                if b is not None:
                    b.close()
    return end_rank(state, ctrl, emit, common)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Replay a decode step's collectives on one rank (one process per rank).")
    p.add_argument(
        "--spec", required=True, help="JSON spec written by `tpcomm probe --replay` (see the module docstring)"
    )
    a = p.parse_args(argv)
    with open(a.spec) as f:
        return run(json.load(f))


if __name__ == "__main__":
    leave(main())
