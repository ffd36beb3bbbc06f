"""Everything the report says, as plain data read from one run directory.

`analyze(run_dir)` returns a `Report`: one `Section` per part of the PDF, each
with `available`, the "not measured" notes (what is missing and the command
that measures it), the numbers and tables it shows, and the conditions they
were measured under. The renderers (pdf.py, markdown.py, figures.py) only
draw what is here; tests check these numbers directly.

Any file of the run directory may be missing: a section without data says so
and names the command that fills it. Nothing here is invented or defaulted.

Units: *_ms milliseconds, *_us microseconds, bytes, tok/s tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpcomm import redact
from tpcomm.analysis.closure import closure_text
from tpcomm.analysis.specdecode import flag
from tpcomm.judge import definitions
from tpcomm.report import readers
from tpcomm.report import sections as S
from tpcomm.report.first_page import page_one
from tpcomm.report.sections import PageOne
from tpcomm.rundir.documents import SingleStream
from tpcomm.rundir.layout import RunDir

# key -> title, in the order of the PDF.
SECTION_TITLES = {
    "verdict": "Verdict",
    "system": "The system",
    "plan": "Collective plan of the model",
    "probe": "Probe: collective latency vs message size",
    "breakdown": "Per-token breakdown per concurrency level",
    "replay": "The decode step replayed",
    "timeline": "One decode step, per rank",
    "ladder": "Throughput and latency vs concurrency",
    "what_if": "What-ifs (model-based)",
    "methods": "Methods",
}


@dataclass
class Section:
    key: str
    title: str
    available: bool
    data: Any = None  # report/sections.py's dataclass of this section (analysis.EMPTY)
    not_measured: list[dict[str, str]] = field(default_factory=list)  # {"what", "command"}
    conditions: str = ""

    unreadable: list[str] = field(default_factory=list)  # one-line contract errors of the files it needs

    def missing(self, what: str, command: str) -> None:
        self.not_measured.append({"what": what, "command": command})


# The files each section draws on: a file that breaks the run-directory contract marks these sections.
SECTION_FILES = {
    "verdict": ("load/levels.json", "attribution/summary.json", "predict.json", "load/requests.parquet"),
    "system": ("meta.json", "topo.json", "status.json"),
    "plan": ("plan.json",),
    "probe": ("probe/results.parquet", "probe/results.json", "probe/fit.json"),
    "breakdown": ("attribution/summary.json", "attribution/steps.parquet", "trace/compare.json"),
    "timeline": ("attribution/timeline.json",),
    "replay": ("probe/replay.json",),
    "ladder": ("load/levels.json", "load/requests.parquet"),
    "what_if": ("predict.json",),
    "methods": ("meta.json",),
}


@dataclass
class Report:
    run_dir: str
    sections: dict[str, Section]
    commands: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)  # file -> one-line contract error (report exits 2)

    def __getitem__(self, key: str) -> Section:
        return self.sections[key]

    @property
    def verdict(self) -> PageOne:
        return self.sections["verdict"].data


def analyze(run_dir: str | Path) -> Report:
    rd = RunDir(run_dir, create=False)
    inp = readers.load_inputs(rd)
    cmds = readers.commands_for(inp)
    shape: dict[str, str] = {}
    sections = {
        key: _guarded(key, inp, shape, build, inp, cmds)
        for key, build in (
            ("system", _system),
            ("plan", _plan),
            ("probe", _probe),
            ("breakdown", _breakdown),
            ("timeline", _timeline),
            ("ladder", _ladder),
            ("what_if", _what_if),
        )
    }
    sections["replay"] = _guarded("replay", inp, shape, _replay, inp, sections["breakdown"], cmds)
    sections["verdict"] = _guarded("verdict", inp, shape, page_one, inp, cmds, _new("verdict"))
    sections["methods"] = _guarded("methods", inp, shape, _methods, inp, sections)
    for key, sec in sections.items():
        sec.unreadable = [inp.errors[f] for f in SECTION_FILES.get(key, ()) if f in inp.errors]
        sec.unreadable += [shape[key]] if key in shape else []
    inp.errors.update({f"section {k}": v for k, v in shape.items()})
    return Report(str(rd.path), {k: sections[k] for k in SECTION_TITLES}, cmds, dict(inp.errors))


def _guarded(key: str, inp: readers.Inputs, shape: dict[str, str], build, *args) -> Section:
    """A section, or an empty one that names its files when a value in them has a shape no check foresaw
    (the contract types the values readers rely on; this keeps the rest of the report, and its exit 2)."""
    try:
        return build(*args)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError, ZeroDivisionError) as e:
        files = [f for f in SECTION_FILES.get(key, ()) if inp.rd.exists(f) and f not in inp.errors]
        shape[key] = (
            f"{', '.join(files) or 'the run directory'}: the {SECTION_TITLES[key].lower()} section cannot be drawn "
            f"from it (a value of an unexpected type or shape: {type(e).__name__}: {str(e)[:120]})"
        )
        return _new(key)


# Each section's data, empty (report/sections.py); the timeline's is the Timeline document itself.
EMPTY = {
    "verdict": PageOne,
    "system": S.SystemSection,
    "plan": S.PlanSection,
    "probe": S.ProbeSection,
    "breakdown": S.BreakdownSection,
    "replay": S.ReplaySection,
    "timeline": lambda: None,
    "ladder": S.LadderSection,
    "what_if": S.WhatIfSection,
    "methods": S.MethodsSection,
}


def _new(key: str) -> Section:
    return Section(key, SECTION_TITLES[key], False, EMPTY[key]())


def _system(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("system")
    d: S.SystemSection = s.data
    rows: list[tuple[str, str]] = []
    versions = inp.meta.versions if inp.meta else {}
    for k in ("tpcomm", "vllm", "vllm_build", "torch", "cuda", "nccl", "python", "os", "machine", "cpu_count"):
        if versions.get(k) is not None:
            rows.append((k, str(versions[k])))
    d.versions = rows
    d.topo = readers.topo_summary(inp.topo)
    if inp.topo is None:
        s.missing("GPUs, links, P2P, NUMA and NCCL settings", cmds["topo"])
    att = inp.attribution
    if att is not None and att.nodes:
        d.nodes = [(int(r), n, att.clocks.get(r) if r != "0" else None) for r, n in att.nodes.items()]
    d.serving = readers.serving_config(inp)
    if not d.serving:
        s.missing("serving configuration (from a load run)", cmds["attribute"])
    # The demo renders the report before it marks itself done: its own state would always read "running".
    d.stages = {k: v.state for k, v in (inp.status.stages if inp.status else {}).items() if k != "demo"}
    s.available = bool(rows or inp.topo or d.serving)
    s.conditions = "read from meta.json, topo.json, load/levels.json and attribution/summary.json"
    return s


def _plan(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("plan")
    plan = inp.plan
    if not plan:
        s.missing("the model's collective plan", cmds["plan"])
        return s
    s.available = True
    model = plan.model
    s.data = S.PlanSection(
        model=model,
        served_name=readers.served_model_name(inp),
        layout=plan.layout,
        collectives=list(plan.collectives),
        totals=plan.totals or {},
        per_token=readers.plan_per_step(plan, batch=1) or {},
        weights=readers.plan_weights(plan, batch=1) or {},
    )
    s.conditions = (
        f"model {s.data.served_name or model.name} ({model.architecture or '?'}), layout "
        + readers.layout_text(plan.layout)
        + f"; followed vLLM {plan.vllm_version_followed or '?'}; derived from config.json, not measured"
    )
    return s


def _probe(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("probe")
    table = readers.probe_table(inp.probe)
    if table is None:
        s.missing("collective latency vs size on vLLM's backends", cmds["probe"])
        return s
    s.available = True
    s.data = S.ProbeSection(
        curves=table["curves"],
        rows=table["rows"],  # compact table at the plan's sizes (or all sizes)
        model_sizes=readers.plan_sizes(inp.plan) or [],
        fit=readers.fit_rows(inp.probe_fit) or [],
        fit_formula=readers.fit_formula(inp.probe_fit),
    )
    s.conditions = table["conditions"]
    return s


def _breakdown(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("breakdown")
    att = inp.attribution
    if att is None or not att.levels:
        s.missing("per-token split (compute / transfer / wait / host gap)", cmds["attribute"])
        return s
    s.available = True
    levels = sorted(att.levels, key=lambda x: (x.concurrency, x.repeat))
    d: S.BreakdownSection = s.data
    d.levels = levels
    # closure_text names delivery as the cause where the five terms add up to the client's time; else none
    d.closure_failed = [
        t + ("" if lv.delivery_term is not None and lv.delivery_term.ok else "; cause not determined")
        for lv in levels
        if (t := closure_text(lv.concurrency, lv.repeat, lv.closure, lv.stalls, lv.delivery_term))
    ]
    d.notes = (
        [f"C={lv.concurrency} repeat {lv.repeat}: {lv.note}" for lv in levels if lv.note]
        + [f"C={lv.concurrency} repeat {lv.repeat}: {flag(lv.spec_decode)}" for lv in levels if lv.spec_decode]
        + [
            f"C={lv.concurrency} repeat {lv.repeat}: {lv.server_clock.text()}"
            for lv in levels
            if lv.server_clock is not None and lv.server_clock.placed
        ]
        + [
            f"C={lv.concurrency}: {lv.collectives_per_step.get('detail')}"
            for lv in levels
            if lv.collectives_per_step.get("detail")
        ]
        + [
            f"C={lv.concurrency} repeat {lv.repeat}: the TP workers' step threads waited for a CPU "
            f"{lv.cpu_wait.ms_per_step:.3g} ms per engine step, summed over ranks (Linux schedstat run_delay over "
            "the level's recording: the host's contention as the ranks met it, also while spinning for a peer)"
            for lv in levels
            if lv.cpu_wait
        ]
    )
    d.excluded = [
        f"C={lv.concurrency}: {why}: request(s) {', '.join(map(str, ids[:12]))}"
        for lv in levels
        if lv.closure
        for why, ids in lv.closure.excluded.items()
    ]
    d.definitions = [
        definitions.TERM[k]
        for k in ("per_token", "compute", "transfer", "wait", "host_gap", "closure", "delivery", "held", "stall")
    ] + [definitions.DELIVERY_CELLS]
    d.plugin, d.method = att.plugin, att.method
    d.instruments = inp.trace_compare  # attribute --profile: the hook's split and the traces', one window
    if not att.plugin:
        s.missing("transfer vs wait split (the server ran without the tpcomm plugin)", cmds["attribute_plugin"])
    s.conditions = (
        readers.conditions_text(att.conditions) + "; " + definitions.clock(levels[0].clock if levels else None)
    )
    d.plan_config = readers.plan_config_text(att)
    if d.plan_config:
        s.conditions += "; plan cross-check: " + d.plan_config
    return s


def _timeline(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("timeline")
    tl = inp.timeline
    if tl is None:
        s.missing(
            "one decode step per rank (attribution/timeline.json, which `tpcomm attribute` writes from the "
            "records it aligned)",
            cmds["attribute_plugin"],
        )
        return s
    s.available, s.data = True, tl
    s.conditions = tl.conditions or "conditions not recorded"
    return s


def _ladder(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("ladder")
    levels = inp.levels
    if not levels:
        s.missing("throughput and latency vs concurrency", cmds["attribute"])
        return s
    s.available = True
    rows = sorted(levels, key=lambda x: (x.concurrency, x.repeat))
    s.data = S.LadderSection(rows, [r for r in rows if r.flags or r.steady is False])
    s.conditions = readers.conditions_text(readers.levels_conditions(inp.levels))
    return s


def _what_if(inp: readers.Inputs, cmds: dict[str, str]) -> Section:
    s = _new("what_if")
    pred = inp.predict
    if not pred or not pred.what_if:
        s.missing("model-based what-ifs", cmds["predict"])
        return s
    s.available = True
    ss = pred.single_stream or SingleStream()
    rows = [
        S.WhatIfRow(
            w.name,
            w.description,
            w.tok_per_s,
            w.ms_per_token,
            w.delta_pct if w.delta_pct is not None else readers.pct_change(w.tok_per_s, ss.tok_per_s),
            w.tok_per_s_range,
            w.delta_pct_range,
        )
        for w in pred.what_if
    ]
    # Each model-based number's range over the stated inputs, and what was fitted (predict's range, fitted, calibration).
    s.data = S.WhatIfSection(
        model_name=pred.model.name,
        tp=pred.layout.tp,
        baseline_tok_per_s=ss.tok_per_s,
        baseline_ms_per_token=ss.ms_per_token,
        rows=rows,
        range=pred.range or {},
        fitted=[f.text for f in pred.fitted],
        calibration=pred.calibration,
        batches=pred.batches,
        breakdown_ms=dict(ss.breakdown_ms or {}),
        ceilings=pred.ceilings,
        compare=pred.compare,
    )
    s.conditions = readers.predict_conditions(pred)
    return s


def _replay(inp: readers.Inputs, breakdown: Section, cmds: dict[str, str]) -> Section:
    from tpcomm.report.replay import replay_data

    s = _new("replay")
    d = replay_data(inp.replay, breakdown.data if breakdown.available else None)
    if d is None:
        s.missing(
            "the decode step's collectives replayed between layer-sized work",
            cmds["probe"].replace("tpcomm probe", "tpcomm probe --replay", 1) + " --work-scale S",
        )
        return s
    s.available, s.data, s.conditions = True, d, d.conditions
    return s


def _methods(inp: readers.Inputs, sections: dict[str, Section]) -> Section:
    s = _new("methods")
    items: list[S.MethodItem] = []
    if inp.plan:
        items.append(
            S.MethodItem(
                "collective plan",
                "derived from the model's config.json and vLLM "
                f"{inp.plan.vllm_version_followed or '?'}'s layer code by `tpcomm plan`; counts and bytes per rank per call",
            )
        )
    if sections["probe"].available:
        items.append(
            S.MethodItem(
                "collective latency",
                "`tpcomm probe`: one process per rank runs the plan's collectives on each backend; "
                "percentiles over repeated calls, correctness checked; " + sections["probe"].conditions,
            )
        )
    if sections["replay"].available:
        items.append(
            S.MethodItem(
                "decode step replayed",
                "`tpcomm probe --replay`: the plan's collectives in vLLM's order between "
                "memory-streaming work of each site's bytes, on real ranks; step split with attribute's alignment code; "
                + sections["replay"].conditions,
            )
        )
    if inp.attribution:
        items.append(S.MethodItem("per-token split", inp.attribution.method))
    if inp.levels:
        items.append(
            S.MethodItem(
                "client latency (TTFT, ITL, TPOT, E2E)",
                "timed by `tpcomm attribute`'s load generator "
                "on the client clock, one streamed token per chunk; steadiness and repeat spread flagged per level",
            )
        )
    if sections["timeline"].available:
        items.append(S.MethodItem("per-rank timeline", sections["timeline"].conditions))
    if inp.predict:
        items.append(
            S.MethodItem(
                "predicted tok/s and what-ifs",
                "`tpcomm predict`: weights / memory bandwidth + collectives x latency "
                "+ overhead; collective latency from: " + (inp.predict.collective_latency_source or "?"),
            )
        )
        for a in inp.predict.assumptions:
            items.append(S.MethodItem("assumption", str(a)))
    s.data = S.MethodsSection(
        items,
        list(inp.files_present),
        [
            S.CommandLine(c.utc or "", c.command, " ".join(redact.argv(c.argv)))
            for c in (inp.meta.commands if inp.meta else [])
        ],
    )
    s.available = bool(items)
    s.conditions = "every figure in this report is traceable to the files listed here"
    return s
