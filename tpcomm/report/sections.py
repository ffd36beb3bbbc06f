"""The data of the report's sections, typed: what analysis.py and first_page.py build and what tables.py,
figures.py and the renderers lay out. One dataclass per section whose fields the layout reads by name.

Units: *_ms milliseconds per token, tok/s per stream, *_pct percent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpcomm.rundir.documents import Layout, LoadLevel, PlanCollective, PlanModel
from tpcomm.rundir.results import LevelSplit, Lever, Verdict


@dataclass
class TokenSplit:
    """The bar of page one: where each token goes, summing to `total_ms` (the headline's per-token time)."""

    terms: dict[str, float]  # term name (tpcomm/terms.py) -> ms per token
    total_ms: float
    source: str  # "measured" or "model-based"
    shares_pct: dict[str, float] | None = None  # measured only: each term's share of total_ms
    per: str = "token"  # what total_ms is per: "token", or "engine step" where tokens per step were not measured


@dataclass
class PageOne:
    """Page one (first_page.py builds it): the headline, its conditions, where each token goes, the verdict in at
    most three sentences, the levers and the definitions of the terms used.

    `numbers` are the headline's figures by name for `tpcomm report --json` (tok_per_s, ms_per_token,
    concurrency, each term's *_ms and *_pct, the client's, the delivery term's; only those measured or derived)."""

    source: str | None = None  # "measured", "model-based", None: nothing to conclude
    headline: str | None = None
    conditions: str = ""
    warning: str | None = None  # an incomplete run, collectives the hook did not time
    sentences: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    level: LevelSplit | None = None  # the level that speaks (measured split)
    verdict: Verdict | None = None
    split: TokenSplit | None = None
    client_ms: float | None = None  # the client's time per token beside the bar (the closure's p50)
    five: tuple | None = None  # (header, rows, widths): the token as the client saw it (five_terms_table)
    levers: list[Lever] = field(default_factory=list)
    bounds: list[Lever] = field(default_factory=list)
    levers_note: str | None = None
    definitions: list[str] = field(default_factory=list)


@dataclass
class SystemSection:
    versions: list[tuple[str, str]] = field(default_factory=list)  # meta.json's software versions
    topo: dict[str, Any] = field(default_factory=dict)  # readers.topo_summary: topo.json's inventory, as read
    nodes: list[tuple[int, Any, Any]] = field(default_factory=list)  # (rank, the hook's node, clock offset)
    serving: list[tuple[str, str]] = field(default_factory=list)  # the load's and the attribution's settings
    stages: dict[str, str] = field(default_factory=dict)  # status.json: stage -> state


@dataclass
class PlanSection:
    model: PlanModel | None = None
    served_name: str | None = None
    layout: Layout | None = None
    collectives: list[PlanCollective] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    per_token: dict[str, Any] = field(default_factory=dict)  # readers.plan_per_step at batch 1: count, bytes
    weights: dict[str, Any] = field(default_factory=dict)  # readers.plan_weights at batch 1


@dataclass
class ProbeSection:
    curves: list[dict] = field(default_factory=list)  # [{backend, op, mode, timing, points: [(bytes, us, GB/s)]}]
    rows: list[dict] = field(default_factory=list)  # one per measured size (readers.probe_table)
    model_sizes: list[dict] = field(default_factory=list)  # the plan's message sizes
    fit: list[dict] = field(default_factory=list)  # probe/fit.json's rows
    fit_formula: str | None = None


@dataclass
class BreakdownSection:
    levels: list[LevelSplit] = field(default_factory=list)  # by concurrency, then repeat
    closure_failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)  # requests compared on neither side of the closure
    definitions: list[str] = field(default_factory=list)
    plugin: bool | None = None
    method: str | None = None
    instruments: dict[str, Any] | None = None  # attribute --profile: the hook's split beside the traces'
    plan_config: str | None = None


@dataclass
class LadderSection:
    levels: list[LoadLevel] = field(default_factory=list)  # load/levels.json, by concurrency, then repeat
    flagged: list[LoadLevel] = field(default_factory=list)  # unsteady or flagged


@dataclass
class WhatIfRow:
    name: str
    description: str
    tok_per_s: float | None
    ms_per_token: float | None
    change_pct: float | None
    tok_per_s_range: dict[str, float] | None = None
    change_pct_range: dict[str, float] | None = None


@dataclass
class WhatIfSection:
    model_name: str | None = None
    tp: int | None = None
    baseline_tok_per_s: float | None = None
    baseline_ms_per_token: float | None = None
    rows: list[WhatIfRow] = field(default_factory=list)
    # predict.json's parts as read (its range over the stated inputs, calibration, batches, checkpoint comparison)
    range: dict[str, Any] = field(default_factory=dict)
    fitted: list[str] = field(default_factory=list)
    calibration: dict[str, Any] | None = None
    batches: list[dict] = field(default_factory=list)
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    ceilings: dict[str, Any] | None = None
    compare: dict[str, Any] | None = None


@dataclass
class MethodItem:
    what: str
    how: str


@dataclass
class CommandLine:
    utc: str
    command: str
    argv: str  # redacted


@dataclass
class MethodsSection:
    items: list[MethodItem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    commands: list[CommandLine] = field(default_factory=list)


@dataclass
class ReplayRow:
    """One (backend, mode) of probe/replay.json: the replayed decode step's timings (us) and its split."""

    backend: str
    mode: str
    conditions: str
    full_p50_us: float | None = None
    full_p99_us: float | None = None
    compute_p50_us: float | None = None
    comm_p50_us: float | None = None
    cost_us_per_token: float | None = None
    cost_us_per_token_mean: float | None = None
    in_step_comm_us_per_token: float | None = None
    split_us: dict[str, float] = field(default_factory=dict)  # step, compute, transfer, wait
    tok_per_s: dict[str, float] = field(default_factory=dict)  # compute_only, comm_only ceilings
    allreduce: dict[str, Any] = field(default_factory=dict)  # the smallest all-reduce site's timings


@dataclass
class ReplayVsServing:
    """A replayed figure beside the hook's at C=1 (same quantity, same unit)."""

    what: str
    replay: float
    serving: float
    unit: str
    ratio: float


@dataclass
class ReplaySection:
    rows: list[ReplayRow] = field(default_factory=list)
    serving: dict[str, Any] | None = None  # replay.serving_c1: the hook's C=1 figures
    compare: list[ReplayVsServing] = field(default_factory=list)
    schedule: dict[str, Any] = field(default_factory=dict)  # probe/replay.json's schedule, as read
    skipped: list[dict] = field(default_factory=list)
    wrong: int = 0
    state: str | None = None
    conditions: str = ""
