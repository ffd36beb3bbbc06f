"""Rank-side collective probe. One process per rank; torch.distributed env://
rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the local rank from
LOCAL_RANK, else srun's SLURM_LOCALID), so it runs under `tpcomm probe`'s own
launcher, torchrun or srun alike:

    torchrun --nproc-per-node 2 probes/collectives.py --backend gloo,shm \
        --ops all_reduce --sizes 14336,1M --out /tmp/probe

Rank 0 appends one JSON record per line to OUT/results.jsonl as each measurement
finishes ({"kind": "result" | "skipped" | "start" | "done", ...}).

Test-only fault injection: TPCOMM_PROBE_FAULT="hang|die:RANK:OP|*:BYTES|*" makes
that rank sleep forever (or exit 17) when it reaches that measurement;
"late:RANK:OP|*:BYTES|*:US" makes it start every isolated op US microseconds after
the line-up (a known skew, read back as the result's skew_p50_us; outside the timed
interval of the late rank itself). TPCOMM_PROBE_SLACK_US overrides the GPU slack
after the line-up (probes/measure.py; a test sets 0 to see every sample overrun).
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import socket
import struct
import sys
import threading
import time

if __package__ in (None, ""):  # run as a script: make `probes` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from probes.backends import Ineligible, make_backend
from probes.devices import local_rank_and_world, rank_layout
from probes.measure import Timer, rank_spread, slowest_rank, summarize
from probes.ops import COLLECTIVES, count_wrong
from probes.spec import BACKENDS, MODES, build_items, parse_sizes


class RankState:
    """What this rank is doing, readable from outside: a status file per phase and
    a counter of collectives entered, updated in place (mmap) before every op, so
    a supervisor can tell which rank never arrived at a hung collective."""

    def __init__(self, status_dir: str | None, rank: int):
        self.rank = rank
        self.item: dict | None = None
        self.phase = "init"
        self.since = time.monotonic()
        self.entered = 0
        self.status_path = self._mm = None
        if status_dir:
            from tpcomm.rundir import safefs  # a shared run directory: nothing written through a planted link

            os.makedirs(status_dir, exist_ok=True)
            self.status_dir, self.status_path = status_dir, os.path.join(status_dir, f"rank{rank}.json")
            with safefs.open_new(status_dir, f"rank{rank}.count", "w+b") as f:
                f.write(b"\0" * 8)
                f.flush()
                self._mm = mmap.mmap(f.fileno(), 8)

    def set(self, phase: str, item: dict | None = None) -> None:
        if item is not None:
            self.item = item
            self.since = time.monotonic()
        self.phase = phase
        if self.status_path:
            from tpcomm.rundir import safefs

            doc = {"rank": self.rank, "pid": os.getpid(), "phase": phase, "item": self.item, "entered": self.entered}
            safefs.write_atomic(self.status_dir, f"rank{self.rank}.json", json.dumps(doc).encode())

    def tick(self, n: int = 1) -> None:
        self.entered += n
        if self._mm is not None:
            struct.pack_into("q", self._mm, 0, self.entered)


def _fault(rank: int, item: dict) -> tuple[str, str] | None:
    """(kind, argument) of TPCOMM_PROBE_FAULT when it targets this rank and measurement."""
    spec = os.environ.get("TPCOMM_PROBE_FAULT")
    if not spec:
        return None
    kind, r, op, nbytes, arg = (spec.split(":") + ["*"] * 5)[:5]
    if int(r) != rank or op not in ("*", item["op"]) or nbytes not in ("*", str(item["bytes"])):
        return None
    return kind, arg


def _maybe_fault(rank: int, item: dict) -> None:
    kind, _ = _fault(rank, item) or ("", "")
    if kind == "die":
        os._exit(17)
    while kind == "hang":
        time.sleep(3600)


def _watchdog(state: RankState, timeout: float) -> None:
    # Under torchrun nobody else watches: a rank that waits too long names what it waits on and exits.
    while True:
        time.sleep(min(1.0, timeout / 4))
        if state.item and time.monotonic() - state.since > timeout:
            it = state.item
            print(
                f"tpcomm probe: rank {state.rank} timed out after {timeout:.0f} s in {it['op']} of {it['bytes']} B "
                f"(backend {it['backend']}, {it['mode']}, phase {state.phase})",
                file=sys.stderr,
                flush=True,
            )
            os._exit(124)


def _hardware(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _graph(backend, op, b, reps):
    """Capture `reps` back-to-back ops in one CUDA graph (vLLM's decode path).

    Warm-up and capture on one side stream, both inside the backend's capture() context, as vLLM's
    graph_capture does and as probes/replay.py _capture: FlashInfer's PCIe IPC workspace is single-stream
    (PcieIpcAllReduceWorkspace._check_stream raises on another stream); the eager items before bound it to
    the default stream, capture() rebinds it and its first launch after that binds it to that launch's
    stream. A warm-up on a side stream before capture() raised there and took the rank down (issue 27)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with backend.capture():
        with torch.cuda.stream(s):
            for _ in range(2):
                backend.run(op, b)
        s.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                res = backend.run(op, b)
    torch.cuda.current_stream().wait_stream(s)
    return g, res


def _late(rank: int, item: dict, device):
    """The test-only delay after the line-up on this rank (TPCOMM_PROBE_FAULT=late:...), or a no-op."""
    from probes.replay_kernels import Skew

    kind, arg = _fault(rank, item) or ("", "0")
    return Skew(float(arg) if kind == "late" else 0.0, device)


def measure_item(backend, item, iters, warmup, ctrl, state, timer) -> dict:
    op, n, rank = item["op"], backend.world, backend.rank
    coll = COLLECTIVES[op]
    b = coll.buffers(item["bytes"], item["dtype"], rank, n, backend.device)
    graph = item["mode"] == "graph"
    state.set("check", item)
    _maybe_fault(rank, item)
    if graph:
        g1, res1 = _graph(backend, op, b, 1)
        nchunk = max(1, min(10, iters))
        per = max(1, iters // nchunk)
        gn, _ = _graph(backend, op, b, per)
        b.inp.copy_(coll.buffers(item["bytes"], item["dtype"], rank, n, backend.device).inp)
        state.tick()
        g1.replay()
        run1 = g1.replay
        result = res1
    else:
        state.tick()
        result = backend.run(op, b)
        run1 = lambda: backend.run(op, b)  # noqa: E731
    backend.sync()
    wrong = torch.tensor([count_wrong(result, b)], dtype=torch.int64)
    dist.all_reduce(wrong, group=ctrl)
    if coll.in_place:
        b.inp.zero_()  # keep repeated sums finite while timing
    state.set("warmup")
    lone = op in backend.no_back_to_back
    for _ in range(warmup):
        if lone:
            dist.barrier(group=ctrl)
        state.tick()
        run1()
    backend.sync()
    state.set("isolated")
    late = _late(rank, item, backend.device)

    def lineup():
        backend.lineup(ctrl)

    iso, overran, preempted = [], [], []
    for _ in range(iters):
        backend.sync()
        if lone:  # outside the timed interval, before the lineup (see Backend.no_back_to_back)
            dist.barrier(group=ctrl)
        state.tick()
        iso.append(timer.time_us(run1, lineup, late))
        overran.append(timer.overran)
        preempted.append(timer.preempted)
    state.set("pipelined")
    nchunk = 0 if lone else max(1, min(10, iters))
    per = max(1, iters // max(1, nchunk))
    backend.sync()
    dist.barrier(group=ctrl)
    pipe = []
    for _ in range(nchunk):
        state.tick(per)
        if graph:
            pipe.append(timer.time_us(gn.replay) / per)
        else:

            def chunk():
                for _ in range(per):
                    backend.run(op, b)

            pipe.append(timer.time_us(chunk) / per)
        backend.sync()
    iso, skew = rank_spread(iso, ctrl)
    overruns = sum(x > 0 for x in slowest_rank([float(f) for f in overran], ctrl))  # samples overrun on any rank
    preempts = sum(x > 0 for x in slowest_rank([float(f) for f in preempted], ctrl))  # samples any rank lost its CPU
    pipe = slowest_rank(pipe, ctrl) if pipe else []
    esize = b.inp.element_size()
    nbytes = b.count * esize
    size, factor = coll.nccl_size_and_factor(nbytes, n)
    rows = {}
    for timing, samples, count in (("isolated", iso, iters), ("pipelined", pipe, nchunk * per)):
        if not samples:
            continue
        st = summarize(samples)
        algbw = size / (st["p50_us"] * 1e-6) / 1e9 if st["p50_us"] > 0 else None
        rows[timing] = {
            **st,
            "timing": timing,
            "ops_timed": count,
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * factor if algbw is not None else None,
        }
    sk = summarize(skew)
    rows["isolated"] |= {
        "lineup": backend.lineup_name,
        "skew_p50_us": sk["p50_us"],
        "skew_p99_us": sk["p99_us"],
        # GPU: samples (any rank) whose start event had fired before the op was queued (None: CPU, no slack)
        "slack_us": timer.slack_us,
        "slack_overruns": overruns if timer.cuda else None,
        # CPU: samples in which the scheduler preempted some rank (None on a GPU: the device times the op there)
        "preempted_samples": None if timer.cuda else preempts,
    }
    base = {
        "backend": item["backend"],
        "op": op,
        "mode": item["mode"],
        "bytes": nbytes,
        "requested_bytes": item["bytes"],
        "count": b.count,
        "dtype": item["dtype"],
        "nccl_size_bytes": size,
        "world_size": n,
        "iters": iters,
        "warmup": warmup,
        "wrong": int(wrong.item()),
        "timer": timer.name,
    }
    return [{"kind": "result", **base, **rows[t]} for t in ("isolated", "pipelined") if t in rows]


def _layout() -> dict:
    """Every rank's host and visible GPU count, once a GPU backend has mapped devices (for the conditions)."""
    lay = rank_layout()
    return {"visible_gpus_by_rank": [x["visible_gpus"] for x in lay]} if lay else {}


def start_rank(spec: dict, sink=None, n_items: int = 0):
    """What every rank-side run does first (probe and replay alike): rank and node from the launcher's
    environment, the watchdog, the gloo process groups, and the record sink (rank 0 only; default: append to
    spec['out_jsonl']). Emits the "start" record. Returns (local_rank, state, ctrl, emit, common)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = local_rank_and_world(os.environ, rank, world)
    timeout = float(spec.get("timeout", 60))
    state = RankState(spec.get("status_dir"), rank)
    if not os.environ.get("TPCOMM_PROBE_SUPERVISED"):
        threading.Thread(target=_watchdog, args=(state, timeout), daemon=True).start()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout + 30))
    ctrl = dist.new_group(backend="gloo")
    if sink is None and rank == 0 and spec.get("out_jsonl"):
        path = spec["out_jsonl"]
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        from tpcomm.rundir import safefs  # a new file, never appended through a link planted at its name

        fh = safefs.open_new(os.path.dirname(os.path.abspath(path)), os.path.basename(path), "w", buffering=1)
        sink = lambda rec: fh.write(json.dumps(rec) + "\n")  # noqa: E731
    emit = sink if rank == 0 and sink else (lambda rec: None)
    nodes = max(1, world // max(1, local_world))
    common = {
        "world_size": world,
        "nodes": nodes,
        "host": socket.gethostname(),
        "torch": torch.__version__,
    }
    if nodes > 1:  # what carries the collectives between nodes, as far as the settings name it
        common["inter_node"] = inter_node_path(os.environ)
    emit({"kind": "start", "items": n_items, **common})
    return local_rank, state, ctrl, emit, common


def inter_node_path(env) -> dict:
    """The settings that choose the path between nodes: gloo's TCP interface, NCCL's network (IB/RoCE HCAs
    when it finds them, else TCP sockets; NCCL_DEBUG=INFO prints the one it took)."""
    keys = ("GLOO_SOCKET_IFNAME", "NCCL_NET", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "MASTER_ADDR")
    rdma = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    return {"env": {k: env[k] for k in keys if env.get(k)}, "rdma_devices": rdma}


def run(spec: dict, sink=None) -> int:
    """Run every measurement of `spec` on this rank. Rank 0 hands each record to
    `sink` (default: append to spec['out_jsonl']). Returns the exit code."""
    items = spec["items"]
    local_rank, state, ctrl, emit, common = start_rank(spec, sink, len(items))
    by_backend: dict[str, list[dict]] = {}
    for it in items:
        by_backend.setdefault(it["backend"], []).append(it)
    for name, its in by_backend.items():
        state.set("setup", None)
        try:
            backend = make_backend(name, ctrl, local_rank)
        except Ineligible as e:
            for it in its:
                emit({"kind": "skipped", **it, "reason": str(e), **common, **_layout()})
            continue
        try:
            _measure_backend(backend, name, its, spec, ctrl, state, emit, common)
        finally:  # its communicators and groups, before the next backend builds its own
            backend.close()
    return end_rank(state, ctrl, emit, common)


def _measure_backend(backend, name: str, its: list[dict], spec: dict, ctrl, state: RankState, emit, common: dict):
    timer = Timer(backend)
    hw = _hardware(backend.device)
    for it in its:
        reason = backend.unsupported(it["op"])
        if it["mode"] == "graph" and not backend.graph_capable:
            reason = f"{name} runs on the CPU: no CUDA graph mode"
        if reason is None:
            try:
                rows = measure_item(backend, it, spec["iters"], spec["warmup"], ctrl, state, timer)
            except (Ineligible, NotImplementedError) as e:
                reason = str(e)
            except RuntimeError as e:
                if "not supported" not in str(e).lower():
                    raise
                reason = f"{name}: {str(e).splitlines()[0][:200]}"
        if reason is not None:
            emit({"kind": "skipped", **it, "reason": reason, **common})
            continue
        for r in rows:
            emit({**r, **common, "hardware": hw, "device": str(backend.device), **_layout()})


def end_rank(state: RankState, ctrl, emit, common: dict) -> int:
    """What every rank-side run does last (probe and replay alike): wait for every rank to finish, then
    the 'done' record and the process groups' end (leaving with gloo's threads up can abort the process).
    Returns the exit code."""
    state.set("done", None)
    dist.barrier(group=ctrl)
    emit({"kind": "done", **common})
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Time collectives on one rank (run one process per rank).")
    p.add_argument(
        "--spec", help="JSON spec written by `tpcomm probe` (items, iters, warmup, timeout, out_jsonl, status_dir)"
    )
    p.add_argument("--backend", default="gloo", help=f"comma list of {','.join(BACKENDS)}")
    p.add_argument("--ops", default="all_reduce", help="comma list of ops")
    p.add_argument("--sizes", default="14336", help="bytes per rank: 14336,1K:1M:x2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--mode", default="eager", help=f"comma list of {','.join(MODES)}")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds one measurement may take before this rank gives up"
    )
    p.add_argument("--out", default=".", help="folder for results.jsonl (rank 0)")
    a = p.parse_args(argv)
    if a.spec:
        with open(a.spec) as f:
            spec = json.load(f)
    else:
        sizes = [(s, a.dtype) for s in parse_sizes(a.sizes)]
        spec = {
            "items": build_items(a.backend.split(","), a.mode.split(","), {op: sizes for op in a.ops.split(",")}),
            "iters": a.iters,
            "warmup": a.warmup,
            "timeout": a.timeout,
            "out_jsonl": os.path.join(a.out, "results.jsonl"),
        }
    return run(spec)


def leave(code: int) -> None:
    """End this rank's process with `code`, skipping the interpreter's teardown. Everything is on disk by now
    (results are written line-buffered; the process group is destroyed after the final barrier), and teardown
    is where gloo's C++ threads can race Python's finalization and abort the process after a run that
    finished ("terminate called without an active exception", seen once in CI), which the launcher would
    report as a dead rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
