"""`tpcomm probe --replay` as a library: replay one decode step of the plan (its
collectives in vLLM's order between memory-streaming work of each layer's size)
on real ranks, three ways, and save what it measured.

    from tpcomm.probe.replay import ReplayConfig, run_replay
    res = run_replay(ReplayConfig(gpus=2, model="kimi-k2.5", tp=2, work_scale=1e-3, out="runs/r1"))
    res.doc["results"][0]["interconnect_cost_us_per_token"]

Files in the run directory:
    probe/replay.json                 conditions, the schedule's counts and bytes, and per (backend, mode):
                                      step p50/p99 of each timing (full | compute | comm), interconnect cost
                                      per token, the full step's compute/transfer/wait split, per-op
                                      in-step latencies, tok/s ceilings; skipped backends with the reason
    probe/replay_steps.parquet        one row per step and timing (columns in replay_results.py)
    probe/replay_collectives.parquet  one row per collective per rank per step (aligned as `attribute` does)
    probe/replay/                     spec, rank status, rank logs, rank 0's raw records (records.jsonl)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tpcomm.errors import InputError
from tpcomm.probe.launcher import ProbeFailed, run_local
from tpcomm.probe.replay_results import COLL_COLUMNS, STEP_COLUMNS, record_frames, step_table, summarize
from tpcomm.probe.schedule import build_schedule
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir

REPLAY_CPU = ("gloo", "shm")
REPLAY_GPU = ("nccl", "pynccl", "custom-ar", "flashinfer-ipc")
# A CPU rank streams at most this much per step: more would page, not measure.
CPU_WORK_CAP_BYTES = 2 * 1024**3


@dataclass
class ReplayConfig:
    gpus: int | None = None
    backends: list[str] = field(default_factory=lambda: ["auto"])
    model: str = "deepseek-v3"
    tp: int | None = None  # the plan's TP; must equal the ranks started
    batch: int = 1
    context: int = 1024  # KV tokens per sequence read by every attention layer
    work_scale: float = 1.0
    skew_us: float = 0.0
    skew_rank: int | None = None  # default: the last rank
    mode: str = "auto"  # eager | graph | both | auto (both on CUDA, eager on CPU)
    steps: int = 30
    warmup: int = 5
    timeout: float = 60.0
    out: str | None = None
    oversubscribe: bool = False  # allow more CPU ranks than cores


class ReplayResults:
    def __init__(self, run: RunDir | None, conditions: dict, schedule: dict):
        self.run, self.conditions, self.schedule = run, conditions, schedule
        self.records: list[dict] = []
        self.skipped: list[dict] = []
        self.state, self.error = "running", None
        self.doc: dict = {}
        self.steps = pd.DataFrame()
        self.collectives = pd.DataFrame()

    def add(self, rec: dict) -> None:
        if rec.get("visible_gpus_by_rank"):  # every rank's visible GPU count, once a GPU backend mapped devices
            self.conditions["visible_gpus_by_rank"] = rec["visible_gpus_by_rank"]
        if rec.get("kind") == "replay":
            self.records.append(rec)
            for k in ("hardware", "device", "timer", "host", "torch"):
                self.conditions.setdefault(f"{k}_by_backend", {})[rec["backend"]] = rec.get(k)
            if self.run is not None:
                self.write()  # a failure later keeps every timing finished so far
        elif rec.get("kind") == "skipped":
            self.skipped.append({k: rec.get(k) for k in ("backend", "mode", "reason")})

    def _stamp(self, e: dict) -> dict:
        """The timer and device each result was measured with (they differ between eager and graph)."""
        rec = next((r for r in self.records if (r["backend"], r["mode"]) == (e["backend"], e["mode"])), {})
        return {
            **e,
            **{
                k: rec.get(k)
                for k in ("timer", "hardware", "device", "backends_used", "world_size", "host_syncs_per_step")
            },
        }

    def write(self) -> None:
        slots = self.schedule["slots"]
        frames = [record_frames(r, slots) for r in self.records]
        coll = (
            pd.concat([c for c, _ in frames if len(c)], ignore_index=True)
            if any(len(c) for c, _ in frames)
            else pd.DataFrame()
        )
        rs = pd.concat([s for _, s in frames], ignore_index=True) if frames else pd.DataFrame()
        self.collectives = coll
        self.steps = step_table(coll, rs) if len(rs) else pd.DataFrame()
        wrong = sum(r.get("wrong", 0) for r in self.records if r["timing"] == "full")
        self.doc = {
            "version": 1,
            "state": self.state,
            "error": self.error,
            "conditions": self.conditions,
            "schedule": {k: v for k, v in self.schedule.items() if k != "slots"},
            "results": [self._stamp(e) for e in summarize(self.steps, coll, self.schedule["batch"])]
            if len(self.steps)
            else [],
            "wrong": wrong,
            "skipped": self.skipped,
        }
        if self.run is None:
            return
        # Empty tables keep their columns: a reader checks them against the contract.
        self.run.write_table(C.REPLAY_COLLECTIVES, coll if len(coll) else pd.DataFrame(columns=COLL_COLUMNS))
        self.run.write_table(C.REPLAY_STEPS, self.steps if len(self.steps) else pd.DataFrame(columns=STEP_COLUMNS))
        self.run.write_json(C.REPLAY, self.doc)


def resolve_replay_backends(names: list[str], cuda: bool) -> list[str]:
    out: list[str] = []
    for n in names:
        if n == "auto":
            out += list(REPLAY_GPU if cuda else REPLAY_CPU)
        elif n == "all":
            out += list(REPLAY_CPU + REPLAY_GPU)
        elif n in REPLAY_CPU + REPLAY_GPU:
            out.append(n)
        else:
            raise InputError(
                "--backend",
                f"unknown backend {n!r} for --replay",
                f"auto, all or one of {', '.join(REPLAY_CPU + REPLAY_GPU)}",
            )
    return list(dict.fromkeys(out))


def build_replay_spec(cfg: ReplayConfig, world: int, cuda: bool) -> tuple[dict, dict]:
    tp = cfg.tp or world
    if tp != world:
        raise InputError(
            f"--tp {tp}",
            f"differs from the {world} ranks started",
            "--tp equal to --gpus (the replay runs one TP group)",
        )
    for name, v, lo in (("--steps", cfg.steps, 1), ("--warmup", cfg.warmup, 0)):
        if v < lo:
            raise InputError(f"{name} {v}", "is too small", f"an integer >= {lo}")
    if cfg.skew_us < 0:
        raise InputError(f"--skew-us {cfg.skew_us}", "is negative", "a delay in microseconds >= 0")
    skew_rank = world - 1 if cfg.skew_rank is None else cfg.skew_rank
    if not 0 <= skew_rank < world:
        raise InputError(f"--skew-rank {skew_rank}", f"is not a rank of the {world} started", f"0..{world - 1}")
    sched = build_schedule(cfg.model, tp, cfg.batch, cfg.context, cfg.work_scale)
    if not cuda and sched["work_footprint_bytes_per_rank"] > CPU_WORK_CAP_BYTES:
        gb = sched["work_footprint_bytes_per_rank"] / 1e9
        raise InputError(
            f"--work-scale {cfg.work_scale:g}",
            f"makes each CPU rank stream {gb:.2f} GB per step for {sched['model']} at TP {tp}",
            f"a scale whose step is at most {CPU_WORK_CAP_BYTES / 1e9:.1f} GB, e.g. --work-scale "
            f"{cfg.work_scale * CPU_WORK_CAP_BYTES / sched['work_footprint_bytes_per_rank'] / 4:.2g}",
        )
    modes = {"auto": ["eager", "graph"] if cuda else ["eager"], "both": ["eager", "graph"]}.get(cfg.mode, [cfg.mode])
    backends = resolve_replay_backends(cfg.backends, cuda)
    items = [{"backend": b, "mode": m} for b in backends for m in modes]
    spec = {
        "schedule": sched,
        "items": items,
        "steps": cfg.steps,
        "warmup": cfg.warmup,
        "timeout": cfg.timeout,
        "skew_us": cfg.skew_us,
        "skew_rank": skew_rank,
    }
    return spec, {"backends": backends, "modes": modes, "skew_rank": skew_rank}


def run_replay(cfg: ReplayConfig, argv: list[str] | None = None, progress=None) -> ReplayResults:
    """Replay, save as timings finish. Raises ProbeFailed (finished timings are on disk)."""
    from tpcomm.probe.limits import check_local_ranks, usable_cpus, visible_gpus
    from tpcomm.probe.runner import _cuda, _default_ranks, joined_launch
    from tpcomm.versions import stack_versions

    joined = joined_launch()
    world = int(os.environ["WORLD_SIZE"]) if joined else (cfg.gpus or _default_ranks())
    cuda = _cuda()
    if not joined:  # the machine's limit first (tpcomm/probe/limits.py), then the plan's
        backends = resolve_replay_backends(cfg.backends, cuda)
        check_local_ranks(world, backends, visible_gpus(cuda), usable_cpus(), cfg.oversubscribe)
    spec, info = build_replay_spec(cfg, world, cuda)
    rank0 = not joined or os.environ.get("RANK") == "0"
    run = RunDir(cfg.out or Path("runs") / time.strftime("replay-%Y%m%d-%H%M%S")) if rank0 else None
    sched = spec["schedule"]
    conditions = {
        **stack_versions(),
        "world_size": world,
        "launch": "joined" if joined else "local",
        "model": sched["model"],
        "tp": sched["tp"],
        "batch": sched["batch"],
        "context_tokens": sched["context"],
        "work_scale": sched["work_scale"],
        "skew_us": cfg.skew_us,
        "skew_rank": info["skew_rank"],
        "steps": cfg.steps,
        "warmup": cfg.warmup,
        "modes": info["modes"],
        "backends": info["backends"],
        "cpu_count": os.cpu_count(),
        "threads_per_rank": max(1, (os.cpu_count() or 1) // world),
    }
    res = ReplayResults(run, conditions, sched)
    if run is not None:
        run.record_command("probe --replay", argv)
        run.mark("replay", "running")

    def on_record(rec):
        res.add(rec)
        if progress is not None:
            progress(rec)

    try:
        if joined:
            from probes.replay import run as run_rank

            run_rank(spec, sink=on_record if rank0 else None)
        else:
            work = run.path / "probe" / "replay"
            spec["out_jsonl"] = str(work / "records.jsonl")
            run_local(spec, world, work, cfg.timeout, on_record, module="probes.replay", spec_name="replay_spec.json")
        res.state = "complete"
    except ProbeFailed as e:
        res.state, res.error = "failed", str(e)
        e.run_dir = str(run.path) if run is not None else None
        raise
    except KeyboardInterrupt:
        res.state, res.error = "incomplete", "interrupted"
        raise
    finally:
        if run is not None:
            res.write()
            run.mark("replay", res.state, timings=len(res.records), skipped=len(res.skipped), error=res.error)
    return res
