"""The one list of levers: what an operator can set, what it would do to single-stream tok/s, and only where
the hardware at hand allows it.

Sources, without two rows for one lever:
- predict's what-ifs (predict.json `what_if`). When predict was anchored on this run's measured split
  (`tpcomm predict --attribution RUN_DIR`), each what-if already replaces only what it changes in the
  measured terms, so its figure is the lever's effect on this run. A what-if of a model that was NOT
  anchored on the measured run is on another base: with a measured split it stays in the what-if section
  and the lever table names the command that applies it to this run.
- Without predict, the measured split alone sizes what it can: the bounds below (measured_whatifs), the
  same entries that predict --attribution writes for them.
Each what-if name maps to what to set (SETTINGS); one a user cannot set (another link, P2P off, a batch)
is not a lever. A lever is offered only where its change is positive over the whole range of its inputs
and the machine allows it (GPU P2P for a one-shot all-reduce; memory for another TP size; not already
in use). "Collectives cost nothing" is a bound, not a lever: it is listed as kind "bound".

Units: tok/s (one stream), ms per token, percent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpcomm import backends
from tpcomm.rundir.documents import WhatIf
from tpcomm.rundir.results import Lever

# vLLM all-reduce paths that are one-shot kernels (predict's "one-shot-allreduce" what-if; topo's path names).
ONE_SHOT_PATHS = backends.one_shot_paths()  # tpcomm/backends/*.json: "one_shot"
BOUNDS = ("no-interconnect-cost",)
NOT_SETTABLE = ("nvlink", "p2p-disabled")  # another link, a risk: what-ifs, not levers


@dataclass
class Machine:
    """What the levers depend on, from topo.json, predict.json and the run's conditions (None: not known)."""

    platform: str | None = None  # "cpu" | "cuda"
    link: str | None = None  # "pcie" | "nvlink" | "shm" | ...
    p2p: bool | None = None
    tp: int | None = None
    gpus: int | None = None  # GPUs visible on the node
    allreduce_paths: list[dict] = field(default_factory=list)  # topo.json vllm.allreduce_paths
    # The `backend` of the all-reduces this run measured (hook tags or trace families: the headline level's sites)
    measured_allreduce: list[str] = field(default_factory=list)


def measured_whatifs(terms: dict[str, float]) -> list[dict]:
    """What the measured split alone sizes, in predict's what-if shape: collectives free (a bound) and no
    rank skew. `terms`: compute, transfer, wait and the host term (host_gap or host) in ms per token."""
    host = terms.get("host_gap", terms.get("host", 0.0))
    base = terms["compute"] + terms["transfer"] + terms["wait"] + host
    out = []
    for name, desc, kept in (
        (
            "no-interconnect-cost",
            "collectives cost nothing: measured compute + host",
            {"compute": terms["compute"], "host": host},
        ),
        (
            "no-rank-skew",
            "ranks reach each collective together: the measured wait removed",
            {"compute": terms["compute"], "transfer": terms["transfer"], "host": host},
        ),
    ):
        ms = sum(kept.values())
        tok = 1e3 / ms if ms > 0 else None
        delta = 100 * (base / ms - 1) if ms > 0 else None
        out.append(
            {
                "name": name,
                "description": desc,
                "tok_per_s": tok,
                "ms_per_token": ms,
                "delta_pct": delta,
                "breakdown_ms": kept,
                "tok_per_s_range": {"low": tok, "central": tok, "high": tok} if tok else None,
                "delta_pct_range": {"low": delta, "high": delta} if delta is not None else None,
            }
        )
    return out


def _one_shot(m: Machine) -> tuple[str | None, str | None]:
    """(what to set, why not offered) for a one-shot all-reduce on this machine."""
    if m.platform == "cpu" or m.link == "shm":
        return None, "CPU shared memory: no one-shot GPU kernel"
    if m.p2p is False:
        return None, "needs GPU P2P between every pair, which this machine does not have (tpcomm topo)"
    ran = [b for b in map(backends.by_record_backend, m.measured_allreduce) if b is not None and b.one_shot]
    if ran:
        return None, f"already in use: this run's all-reduces ran on {ran[0].name} ({ran[0].label}; measured)"
    in_use = next((p["path"] for p in m.allreduce_paths if p.get("path") in ONE_SHOT_PATHS and p.get("eligible")), None)
    if in_use:
        return None, f"already in use: vLLM picks {in_use} here (tpcomm topo)"
    opt_in = next((p for p in m.allreduce_paths if p.get("path") in ONE_SHOT_PATHS and p.get("lever")), None)
    if opt_in:
        return opt_in["lever"], None
    if m.link == "nvlink":
        return None, "vLLM's custom all-reduce is already its default on NVLink"
    if m.tp in (2, 4, 8):
        return (
            "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1 (vLLM 0.32: FlashInfer's PCIe IPC one-shot all-reduce; "
            "TP 2/4/8 on one PCIe node, bf16/fp16)",
            None,
        )
    return None, f"no one-shot all-reduce in vLLM 0.32 for TP {m.tp}"


def _rank_skew(m: Machine) -> tuple[str | None, str | None]:
    if m.platform == "cpu":
        return (
            "VLLM_CPU_OMP_THREADS_BIND with one core set per rank, and nothing else busy on those cores "
            "(API server and engine core included); the per-rank table shows which rank arrives last",
            None,
        )
    return (
        "keep CUDA graphs on (no --enforce-eager), bind each worker to its GPU's NUMA node, keep other work off "
        "the GPUs and their CPUs; the per-rank table shows which rank arrives last",
        None,
    )


def _tp(name: str, w: WhatIf, m: Machine) -> tuple[str | None, str | None]:
    n = int(name[2:])
    if w.fits_memory is False:
        return None, f"TP {n} does not fit the weights in GPU memory"
    if m.gpus is not None and n > m.gpus:
        return None, f"TP {n} needs {n} GPUs; {m.gpus} visible on this node"
    return f"--tensor-parallel-size {n}", None


ENGINE_SETTINGS = {
    "cuda-graphs": "drop --enforce-eager (vLLM then replays decode steps from CUDA graphs)",
    "async-scheduling": "vLLM >= 0.14 (async scheduling, on by default on CUDA), or --async-scheduling",
    "nvlink": "an NVLink bridge between the two GPUs (this card takes one at TP 2)",
}


def setting(name: str, w: WhatIf, m: Machine) -> tuple[str | None, str | None]:
    """What to set for the what-if `name` on machine `m`, or why it is not a lever here. predict's own
    `lever: false` (with its note: no NVLink on this card, a risk, a bound, no fit) is final."""
    if w.lever is False:
        return None, w.lever_note or "predict marks it as no lever on this hardware"
    if name in ENGINE_SETTINGS and w.lever:
        return ENGINE_SETTINGS[name], None
    if name == "one-shot-allreduce":
        return _one_shot(m)
    if name == "no-rank-skew":
        return _rank_skew(m)
    if name.startswith("tp") and name[2:].isdigit():
        return _tp(name, w, m)
    if name in NOT_SETTABLE and not w.lever:
        return None, "not a setting: another link or a risk (see the what-ifs)"
    return None, "no setting known for this what-if"


def levers(what_ifs: list[WhatIf], m: Machine, basis: str) -> tuple[list[Lever], list[dict]]:
    """(levers and bounds ranked by effect, what-ifs not offered with why). `basis`: where the figures come
    from (e.g. "predict anchored on this run's measured split")."""
    out: list[Lever] = []
    skipped: list[dict] = []
    for w in what_ifs:
        name = w.name
        if w.tok_per_s is None or w.aggregate:
            continue  # not sized, or a batch (all streams): not a single-stream lever
        rng = w.tok_per_s_range
        dr = w.delta_pct_range or {}
        lever = dict(
            name=name,
            tok_per_s=w.tok_per_s,
            tok_per_s_range=dict(rng) if rng else None,
            change_pct=w.delta_pct,
            basis=basis,
        )
        if name in BOUNDS:
            out.append(Lever(setting="a bound: no setting makes collectives free", kind="bound", **lever))
            continue
        what, why = setting(name, w, m)
        if what is None:
            skipped.append({"name": name, "why": why})
            continue
        low = dr.get("low", w.delta_pct)
        if low is None or low <= 0:
            skipped.append({"name": name, "why": "no gain over the whole range of its inputs"})
            continue
        out.append(Lever(setting=what, **lever))
    out.sort(key=lambda lv: (lv.kind != "lever", -(lv.change_pct or 0.0)))
    return out, skipped
