"""`tpcomm probe` as a library: what to measure (from the plan and/or a sweep),
on which backends, then launch or join the ranks and save as results arrive.

    from tpcomm.probe.runner import ProbeConfig, run_probe
    res = run_probe(ProbeConfig(gpus=2, sizes="1K:1M:x4", out="runs/r1"))
    res.frame()          # DataFrame, columns in tpcomm/probe/results.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from probes.spec import BACKENDS, CPU_BACKENDS, GPU_BACKENDS, MODES, OPS, build_items, parse_sizes
from tpcomm.errors import InputError
from tpcomm.probe.launcher import ProbeFailed, run_local
from tpcomm.probe.limits import check_local_ranks, usable_cpus, visible_gpus
from tpcomm.probe.results import ProbeResults
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir

DEFAULT_MODEL = "deepseek-v3"


@dataclass
class ProbeConfig:
    gpus: int | None = None  # local ranks to start (ignored when joining torchrun/srun)
    backends: list[str] = field(default_factory=lambda: ["auto"])
    model: str | None = None  # plan source; None and no sizes: DEFAULT_MODEL
    tp: int | None = None  # plan's TP (default: the number of ranks)
    batches: list[int] = field(default_factory=lambda: [1])
    sizes: str | None = None  # extra sweep, e.g. "1K:64M:x2"
    ops: list[str] | None = None  # default: the plan's ops (all_reduce for a bare sweep)
    dtype: str | None = None  # sweep dtype (default bfloat16; plan sizes keep theirs)
    mode: str = "auto"  # eager | graph | both | auto (both on CUDA, eager on CPU)
    iters: int = 100
    warmup: int = 10
    timeout: float = 60.0
    out: str | None = None
    oversubscribe: bool = False  # allow more CPU ranks than cores


def joined_launch() -> bool:
    """True when started by torchrun/srun (one `tpcomm probe` per rank). Under srun,
    SLURM's task variables stand in for RANK/WORLD_SIZE/LOCAL_RANK; MASTER_ADDR and
    MASTER_PORT must be exported by the job script (e.g. the first host of the job)."""
    if os.environ.get("TPCOMM_PROBE_SUPERVISED"):
        return False
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and "MASTER_ADDR" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
        os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        if per_node.isdigit():
            os.environ.setdefault("LOCAL_WORLD_SIZE", per_node)
        os.environ.setdefault("MASTER_PORT", "29500")
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _cuda() -> bool:
    # Importing torch costs seconds; without an NVIDIA device node there is no CUDA to find.
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def resolve_backends(names: list[str], cuda: bool) -> list[str]:
    out: list[str] = []
    for n in names:
        if n == "auto":
            out += list(GPU_BACKENDS if cuda else CPU_BACKENDS)
        elif n == "all":
            out += list(BACKENDS)
        elif n in BACKENDS:
            out.append(n)
        else:
            raise InputError("--backend", f"unknown backend {n!r}", f"auto, all or one of {', '.join(BACKENDS)}")
    return list(dict.fromkeys(out))


def plan_sizes(model: str, tp: int, batches: list[int], world: int) -> tuple[dict, dict]:
    """{op: [(bytes, dtype)]} for the plan's collectives whose group spans `world` ranks, and a summary."""
    from tpcomm.plan import build_plan

    doc = build_plan(model, tp=tp, batches=batches).to_dict()
    sizes: dict[str, set] = {}
    other = set()
    for c in doc["collectives"]:
        if c.get("group_size", world) != world:
            other.add((c["op"], c["group"], c.get("group_size")))
            continue
        sizes.setdefault(c["op"], set()).add((int(c["bytes"]), c["dtype"]))
    info = {
        "model": doc["model"]["name"],
        "tp": tp,
        "batches": batches,
        "not_probed": [f"{op} on group {g} of {n} ranks (probe runs {world})" for op, g, n in sorted(other)],
    }
    return {op: sorted(v) for op, v in sizes.items()}, info


def build_spec(cfg: ProbeConfig, world: int, cuda: bool) -> tuple[dict, dict]:
    op_sizes: dict[str, list] = {}
    plan_info = None
    if cfg.model or not cfg.sizes:
        model = cfg.model or DEFAULT_MODEL
        op_sizes, plan_info = plan_sizes(model, cfg.tp or world, cfg.batches, world)
    if plan_info and not op_sizes and plan_info["not_probed"] and not cfg.sizes:
        raise InputError(
            "--gpus",
            f"the plan's collectives run on other group sizes than the {world} ranks started: "
            + "; ".join(plan_info["not_probed"][:3]),
            "--gpus equal to the plan's group size (e.g. --tp)",
        )
    ops = cfg.ops or (sorted(op_sizes, key=OPS.index) if op_sizes else ["all_reduce"])
    for op in ops:
        if op not in OPS:
            raise InputError("--ops", f"unknown op {op!r}", f"any of {', '.join(OPS)}")
    if cfg.sizes:
        try:
            sweep = parse_sizes(cfg.sizes)
        except ValueError as e:
            raise InputError("--sizes", str(e), "sizes like 14336,1K:64M:x2") from None
        for op in ops:
            op_sizes.setdefault(op, [])
            op_sizes[op] = sorted(set(op_sizes[op]) | {(s, cfg.dtype or "bfloat16") for s in sweep})
    op_sizes = {op: v for op, v in op_sizes.items() if op in ops and v}
    if not op_sizes:
        raise InputError("--ops", f"none of {ops} has a size to probe", "ops that the plan issues, or --sizes")
    modes = {"auto": ["eager", "graph"] if cuda else ["eager"], "both": list(MODES)}.get(cfg.mode, [cfg.mode])
    backends = resolve_backends(cfg.backends, cuda)
    items = build_items(backends, modes, op_sizes)
    spec = {"items": items, "iters": cfg.iters, "warmup": cfg.warmup, "timeout": cfg.timeout}
    return spec, {"plan": plan_info, "backends": backends, "modes": modes}


def _default_out() -> Path:
    return Path("runs") / time.strftime("probe-%Y%m%d-%H%M%S")


class _Progress:
    """A rich progress bar on stderr when it is a terminal; one line per measurement otherwise."""

    def __init__(self, results: ProbeResults, total: int, enabled: bool = True):
        self.results, self.total, self.enabled = results, total, enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("probe"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
                transient=True,
            )
            self.task = self.bar.add_task("starting ranks", total=total)
            self.bar.start()

    def __call__(self, rec: dict) -> None:
        self.results.add(rec)
        if rec.get("kind") == "start":
            self.total = rec.get("items", self.total)
        if rec.get("kind") not in ("result", "skipped") or rec.get("timing") == "pipelined":
            return
        desc = f"{rec['backend']} {rec['op']} {rec['bytes']} B {rec['mode']}"
        if self.bar is not None:
            self.bar.update(self.task, completed=self.results.done_items, total=self.total, description=desc)
        elif self.enabled:
            what = "skipped" if rec["kind"] == "skipped" else f"{rec.get('p50_us', 0):.1f} us p50 ({rec.get('timing')})"
            print(f"probe [{self.results.done_items}/{self.total}] {desc}: {what}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_probe(cfg: ProbeConfig, progress: bool = True, argv: list[str] | None = None) -> ProbeResults:
    """Measure, save into the run directory as results arrive, fit. Raises ProbeFailed
    (results so far are on disk) when a rank dies or hangs."""
    from tpcomm.probe.fit import fit_document
    from tpcomm.topo.collect import collect_topology
    from tpcomm.versions import stack_versions

    joined = joined_launch()
    world = int(os.environ["WORLD_SIZE"]) if joined else (cfg.gpus or _default_ranks())
    if world < 1:
        raise InputError("--gpus", f"{world} ranks", "at least 1")
    cuda = _cuda()
    # What the machine can run comes first: `--gpus 999` is about the machine, not about the plan at TP 999.
    if not joined:
        backends = resolve_backends(cfg.backends, cuda)
        check_local_ranks(world, backends, visible_gpus(cuda), usable_cpus(), cfg.oversubscribe)
    spec, info = build_spec(cfg, world, cuda)
    rank0 = not joined or os.environ.get("RANK") == "0"
    run = RunDir(cfg.out or _default_out()) if rank0 else None
    conditions = {
        **stack_versions(),
        "world_size": world,
        "launch": "joined" if joined else "local",
        "iters": cfg.iters,
        "warmup": cfg.warmup,
        "modes": info["modes"],
        "backends": info["backends"],
        "plan": info["plan"],
        "vllm_installed": importlib.util.find_spec("vllm") is not None,
    }
    results = ProbeResults(run, conditions)
    if run is not None:
        topo = collect_topology(tp=world)
        run.record_command("probe", argv)  # takes the run-directory lock first
        run.write_json(C.TOPO, topo)
        conditions["hardware"] = topo.get("summary")
        conditions["topology"] = topo
        run.mark("probe", "running")
        results.write()
    bar = _Progress(results, len(spec["items"]), enabled=progress and rank0)
    try:
        if joined:
            from probes.collectives import run as run_rank

            run_rank(spec, sink=bar if rank0 else None)
        else:
            spec["out_jsonl"] = str(run.path / "probe" / "results.jsonl")
            run_local(spec, world, run.path / "probe", cfg.timeout, bar)
        results.state = "complete"
        if results.nothing_measured:
            results.state = "failed"
            results.error = "nothing measured: " + str(results.skipped[0].get("reason"))
    except ProbeFailed as e:
        results.state, results.error = "failed", str(e)
        e.run_dir = str(run.path) if run is not None else None
        raise
    except KeyboardInterrupt:
        results.state, results.error = "incomplete", "interrupted"
        raise
    finally:
        bar.close()
        if run is not None:
            results.write()
            if results.rows:
                run.write_json(C.PROBE_FIT, fit_document(results.rows, conditions))
            run.mark(
                "probe",
                results.state,
                measurements=len(results.rows),
                skipped=len(results.skipped),
                error=results.error,
            )
    return results


def _default_ranks() -> int:
    if _cuda():
        import torch

        return max(1, torch.cuda.device_count())
    return min(2, usable_cpus())
