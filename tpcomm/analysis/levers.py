"""The levers of one run directory, computed where their inputs are written and stored as levers.json; the
report only lays them out (issue 30 item 3).

Inputs, all from the run directory: attribution/summary.json (the measured split at the level that speaks and
its delivery term), predict.json (what-ifs; anchored on this run when predict ran with --attribution), topo.json
and meta.json (the machine: platform, link, P2P, GPUs, vLLM's all-reduce paths), plan.json (TP). The rule of
which what-if is a lever on which machine is judge/levers.py; this module only gathers the inputs and applies it.

Writers: the analysis of `tpcomm attribute` (and of `tpcomm trace`) and `tpcomm predict --out RUN_DIR` each call
store() after writing their own file, so levers.json follows the last of them. It records the SHA-256 of each
input it read: a reader whose inputs changed since (topo.json written after them, a file edited, a run directory
of an older tpcomm) finds it stale, and current() computes the levers again by the same function, saying so.
(`tpcomm topo` does not write it: topo is the data model the analysis reads, and imports none of it.)

Units: tok/s (one stream), percent.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import tpcomm
from tpcomm.judge import delivery as deliver
from tpcomm.judge import levers as L
from tpcomm.rundir import contract as C
from tpcomm.rundir import safefs
from tpcomm.rundir.contract import SchemaError
from tpcomm.rundir.documents import Meta, Plan, Prediction, Topo, what_if
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution, LevelSplit, RunLevers

log = logging.getLogger(__name__)

INPUTS = (C.ATTR_SUMMARY, C.PREDICT, C.TOPO, C.META, C.PLAN)


@dataclass
class RunInputs:
    """What the levers are computed from (None: absent, or refused by the contract)."""

    attribution: Attribution | None = None
    predict: Prediction | None = None
    topo: Topo | None = None
    meta: Meta | None = None
    plan: Plan | None = None


def read_inputs(rd: RunDir) -> RunInputs:
    inp = RunInputs()
    for spec, attr in zip(INPUTS, ("attribution", "predict", "topo", "meta", "plan")):
        try:
            setattr(inp, attr, rd.read(spec))
        except SchemaError:
            pass  # the report names the file's error; the levers go without it
    return inp


def digests(rd: RunDir) -> dict[str, str | None]:
    """SHA-256 per input. meta.json by the one value the levers read (its vLLM build): every command that writes
    into the run directory appends itself to meta.json, which changes nothing the levers depend on."""
    out = {s.path: _sha(rd / s) for s in INPUTS if s is not C.META}
    try:
        meta = rd.read(C.META)
    except SchemaError:
        out[C.META.path] = "unreadable"
    else:
        build = meta.versions.get("vllm_build") if meta else None
        out[C.META.path] = hashlib.sha256(repr(build).encode()).hexdigest()  # absent: no build, as without one
    return out


def _sha(p) -> str | None:
    """SHA-256 of a regular file read within the JSON bound (safefs: a FIFO, a device or a link to /dev/zero
    is never read); None where it is absent, "unreadable" where it is not a file tpcomm would read."""
    try:
        return hashlib.sha256(safefs.read_bounded(p, safefs.MAX_JSON_BYTES)).hexdigest()
    except FileNotFoundError:
        return None
    except (safefs.UnsafePath, OSError):
        return "unreadable"


def machine(inp: RunInputs, head: LevelSplit | None) -> L.Machine:
    """What the levers depend on: the measured machine (topo.json, meta.json) when this run measured one,
    else the hardware predict.json modelled (a model-based run says nothing of the machine it ran on)."""
    link = (inp.predict.hardware.link if inp.predict else None) or {}
    doc = inp.plan or inp.predict
    tp = doc.layout.tp if doc else None
    if head is None:
        kind = link.get("type")
        return L.Machine(platform="cpu" if kind == "shm" else "cuda", link=kind, p2p=link.get("p2p"), tp=tp)
    gpu = (inp.topo.gpu if inp.topo else None) or {}
    vllm = (inp.topo.vllm if inp.topo else None) or {}
    p2p = gpu.get("p2p_read")
    cpu = vllm.get("platform") == "cpu" or (inp.meta is not None and inp.meta.vllm_build == "cpu")
    return L.Machine(
        platform="cpu" if cpu else "cuda",
        link="shm" if cpu else link.get("type"),
        p2p=all(all(r) for r in p2p) if p2p else link.get("p2p"),
        tp=(inp.attribution.conditions.get("tp") if inp.attribution else None) or tp,
        gpus=len(gpu.get("gpus") or []) or None,
        allreduce_paths=list(vllm.get("allreduce_paths") or []),
        measured_allreduce=sorted({s.backend for s in head.top_sites if s.op == "all_reduce"}),
    )


def compute(inp: RunInputs) -> RunLevers:
    """The levers for these inputs: predict's what-ifs where predict was anchored on this run's split (or where
    nothing was measured), else what the measured split alone sizes; the delivery lever first where the API
    server's delivery caps what the client gets."""
    head = inp.attribution.headline_level() if inp.attribution else None
    pred = inp.predict if inp.predict and inp.predict.tok_per_s else None
    m = machine(inp, head)
    more = False
    if head is not None and pred and pred.calibration:
        whatifs, basis = pred.what_if, "predict anchored on this run's measured split"
    elif head is not None and (per_token := head.token_view()[1]) is not None:
        measured = L.measured_whatifs(per_token.as_dict())
        whatifs, basis = [what_if(w) for w in measured], "the measured split (one term removed)"
        more = head.spec_decode is None  # predict does not anchor on a run with speculative decoding
    elif pred:
        whatifs, basis = pred.what_if, "model-based (tpcomm predict), range over its stated inputs"
    else:
        return RunLevers(basis=None)
    got, skipped = L.levers(whatifs, m, basis)
    if head is not None and (dl := deliver.lever(head.delivery_term, head.host_load, m.platform)):
        got = [dl] + got  # delivery caps what the client gets: the engine's levers come after it
    return RunLevers(
        basis=basis,
        levers=[x for x in got if x.kind == "lever"],
        # A model's bounds are stated by its verdict (over the whole range); a measured split's as a line.
        bounds=[x for x in got if x.kind == "bound"] if head is not None else [],
        not_offered=skipped,
        more_with_predict=more,
    )


def store(rd: RunDir) -> RunLevers | None:
    """Compute the levers from what `rd` holds now and write levers.json. Called by each writer of an input
    after its own file is safe on disk: a failure here is logged and leaves the measured files as they are."""
    try:
        before = digests(rd)
        got = compute(read_inputs(rd))
        got.inputs = before
        rd.write_json(C.LEVERS, got.to_json())
        return got
    except Exception as e:  # noqa: BLE001 - the command's own result is written; the report recomputes
        log.warning("levers.json not written (%s: %s); `tpcomm report` computes the levers itself", type(e).__name__, e)
        return None


def current(rd: RunDir) -> tuple[RunLevers, str | None]:
    """(the levers, why they were computed now rather than read): levers.json when its inputs are unchanged."""
    why = "levers.json absent (written by an older tpcomm, or its writer failed)"
    try:
        stored = rd.read(C.LEVERS)
    except SchemaError as e:
        stored, why = None, f"levers.json refused ({e})"
    if stored is not None:
        now = digests(rd)
        changed = sorted(k for k in now if now.get(k) != stored.inputs.get(k))
        if not changed and stored.tpcomm == tpcomm.__version__:
            return stored, None
        why = (
            f"levers.json is older than {', '.join(changed)}"
            if changed
            else f"levers.json was computed by tpcomm {stored.tpcomm}, this is {tpcomm.__version__}"
        )
    got = compute(read_inputs(rd))
    got.inputs = digests(rd)
    return got, why
