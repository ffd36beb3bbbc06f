"""One dataclass per JSON document of a run directory, and the one loader that reads each (issue 30 item 2).

`RunDir.read(spec)` returns the document as its dataclass (None where the file is absent); `RunDir.read_json`
and `write_json` check every document against the same dataclass, so a writer that drifts fails where it
writes and a hand-edited file is one `SchemaError` naming the field (`results.from_json`). Readers use
attributes: a value has one name, here.

The dataclasses name what readers use. A document may hold more (predict.json's range and corners, topo's
inventories, a stage's counts in status.json): those parts are typed as `dict[str, Any]` and kept as they are,
and a key no dataclass names is left in the file, not checked. attribution/summary.json and levers.json are
`results.Attribution` and `results.RunLevers`.

Units are in the names: *_ms milliseconds, *_GBps 1e9 B/s, tok_per_s one stream's tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpcomm.rundir import contract as C
from tpcomm.rundir.contract import FileSpec, SchemaError
from tpcomm.rundir.results import Attribution, RunLevers, from_json


# ---- meta.json ---------------------------------------------------------------
@dataclass
class Command:
    command: str
    argv: list[str]
    utc: str | None = None


@dataclass
class Meta:
    """meta.json: the stack that wrote the run directory and every command that wrote into it."""

    created_utc: str
    versions: dict[str, Any]  # tpcomm, python, torch, vllm, vllm_build ("cpu" | "cuda" | ...), nccl, ...
    commands: list[Command]

    @property
    def vllm_build(self) -> str | None:
        v = self.versions.get("vllm_build")
        return v if isinstance(v, str) else None


# ---- status.json ---------------------------------------------------------------
@dataclass
class Rerun:
    """A re-run over a finished stage, still writing or stopped half-way (RunDir.mark)."""

    state: str
    utc: str | None = None
    pid: int | None = None


@dataclass
class StageStatus:
    state: str  # running | complete | incomplete | failed
    utc: str | None = None
    reason: str | None = None
    rerun: Rerun | None = None


@dataclass
class Status:
    """status.json: one entry per stage (attribute, probe, replay, demo, ...); the stage's counts stay in the
    file (`tpcomm.rundir.layout.RunDir.mark` writes them)."""

    stages: dict[str, StageStatus] = field(default_factory=dict)

    def state(self, stage: str) -> str | None:
        st = self.stages.get(stage)
        return st.state if st else None


# ---- plan.json -------------------------------------------------------------------
@dataclass
class Layout:
    tp: int
    ep: bool = False
    dp: int = 1
    pp: int = 1
    dcp: int = 1
    ep_size: int = 1
    world_size: int | None = None


@dataclass
class PlanModel:
    name: str
    source: str | None = None
    architecture: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    vocab_size: int | None = None
    n_routed_experts: int | None = None
    num_experts_per_tok: int | None = None
    attention: str | None = None
    dtype: str | None = None
    quantization: dict[str, Any] | None = None  # method, description, weight_bits, activations, notes


@dataclass
class PlanCollective:
    op: str
    bytes: int  # per rank per call
    count: int  # calls per decode step
    batch: int = 1
    group: str | None = None
    group_size: int | None = None
    dtype: str | None = None
    site: str | None = None
    note: str | None = None
    path: str | None = None  # "group_coordinator" or a fused kernel that bypasses it
    fused: bool = False


@dataclass
class Plan:
    """plan.json (`tpcomm plan --json`): the collectives vLLM issues per decode step, per rank."""

    model: PlanModel
    layout: Layout
    collectives: list[PlanCollective] = field(default_factory=list)
    vllm_version_followed: str | None = None
    batches: list[int] = field(default_factory=list)
    weights: dict[str, Any] | None = None
    totals: dict[str, Any] | None = None
    kv_cache: dict[str, Any] | None = None
    conditions: dict[str, Any] | None = None
    served_name: str | None = None


# ---- predict.json ------------------------------------------------------------------
@dataclass
class PredictModel:
    name: str
    source: str | None = None
    architecture: str | None = None
    quantization: str | None = None  # one line (plan.json keeps the parsed quantization)


@dataclass
class Hardware:
    profile: str | None = None
    name: str | None = None
    memory_bandwidth_GBps: float | None = None
    memory_GB: float | None = None
    link: dict[str, Any] | None = None
    sources: dict[str, Any] = field(default_factory=dict)  # input -> where its value comes from


@dataclass
class SingleStream:
    ms_per_token: float | None = None
    tok_per_s: float | None = None
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    bound: str | None = None
    collectives_per_token: float | None = None
    value: str | None = None


@dataclass
class WhatIf:
    name: str
    description: str = ""
    tok_per_s: float | None = None
    ms_per_token: float | None = None
    delta_pct: float | None = None
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    tok_per_s_range: dict[str, float] | None = None
    delta_pct_range: dict[str, float] | None = None
    lever: bool | None = None  # predict's word: True a setting, False not one here (lever_note says why), None unsaid
    lever_note: str | None = None
    fits_memory: bool | None = None  # a TP what-if: whether the weights fit (None: not checked)
    aggregate: bool = False  # a batch figure (all streams), not a single-stream one


def what_if(doc: dict[str, Any]) -> WhatIf:
    """A what-if as predict.json holds it (judge/levers.py's measured_whatifs builds the same shape)."""
    return from_json(WhatIf, doc, C.PREDICT, "what_if")


@dataclass
class Fitted:
    """An extra term of predict's fitted to a measurement (labelled fitted, never called a prediction)."""

    text: str
    term: str | None = None  # moe_kernel_penalty | moe_kernel_bandwidth
    value: float | None = None
    unit: str | None = None


@dataclass
class Prediction:
    """predict.json (`tpcomm predict --json`): the analytic single-stream figure, its range over the stated
    inputs, and the what-ifs."""

    model: PredictModel
    layout: Layout
    hardware: Hardware
    single_stream: SingleStream | None = None
    what_if: list[WhatIf] = field(default_factory=list)
    range: dict[str, Any] | None = None  # inputs (low/central/high, source), single_stream, corners, verdict
    batches: list[dict[str, Any]] = field(default_factory=list)
    ceilings: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    compare: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    conditions: dict[str, Any] | None = None
    assumptions: list[str] = field(default_factory=list)
    fitted: list[Fitted] = field(default_factory=list)
    collective_latency_source: str | None = None
    collective_latency_kind: str | None = None

    @property
    def tok_per_s(self) -> float | None:
        return self.single_stream.tok_per_s if self.single_stream else None


# ---- load/levels.json ------------------------------------------------------------------
@dataclass
class LoadLevel:
    """One element of load/levels.json: one concurrency level and repeat as the client measured it."""

    concurrency: int
    repeat: int
    round: int | None = None
    requests: int | None = None
    failed: int | None = None
    output_tok_per_s: float | None = None
    requests_per_s: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p99: float | None = None
    tpot_ms_mean: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p99: float | None = None
    itl_ms_mean: float | None = None
    itl_burst_pct: float | None = None
    e2e_ms_p50: float | None = None
    duration_s: float | None = None
    steady: bool | None = None
    steady_note: str | None = None
    repeat_spread_pct: float | None = None
    flags: list[str] = field(default_factory=list)
    conditions: dict[str, Any] | None = None
    profiled: bool = False
    host_load: dict[str, Any] | None = None  # results.HostLoad's fields (attribute/hostload.py)
    cpu_wait: dict[str, Any] | None = None  # results.CpuWait's fields
    hook_problem: str | None = None
    records_problem: str | None = None
    worker_problem: str | None = None
    interrupted: str | None = None
    rank_died: dict[str, Any] | None = None  # attribute/ranks.py: the rank, its pid, how it ended
    stopped_rank: dict[str, Any] | None = None
    # the server's clock (rank 0's) against the client's, bounded by the level's recording start: {rank, lo_ms,
    # hi_ms, rtt_ms} (analysis/serverclock.py); None: not measured (no plugin, a run older than this field)
    server_clock: dict[str, Any] | None = None


# ---- the smaller documents --------------------------------------------------------------
@dataclass
class Topo:
    """topo.json: the machine (`tpcomm topo`); its inventories stay as written."""

    gpu: dict[str, Any] | None = None
    gpu_absent_reason: str | None = None
    cpu: dict[str, Any] | None = None
    env: dict[str, Any] | None = None
    vllm: dict[str, Any] | None = None
    network: dict[str, Any] | None = None
    vllm_installed: bool | None = None
    summary: str | None = None


@dataclass
class FitModel:
    backend: str | None = None
    op: str | None = None
    mode: str | None = None
    timing: str | None = None
    segments: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ProbeFit:
    """probe/fit.json: the fitted latency model per backend and op."""

    models: list[FitModel] = field(default_factory=list)
    formula: str | None = None
    preference: list[str] = field(default_factory=list)
    conditions: dict[str, Any] | None = None


@dataclass
class Timeline:
    """attribution/timeline.json: one decode step per rank from the aligned records."""

    step: int
    ranks: list[dict[str, Any]]
    num_seqs: int | None = None
    step_us: float | None = None
    n_collectives: int | None = None
    max_entry_skew_us: float | None = None
    sum_entry_skew_us: float | None = None
    entry_skew_us: list[float | None] = field(default_factory=list)
    clock_uncertainty_us: float | None = None  # ranks put on rank 0's clock to within this (None: one clock)
    conditions: str | None = None


# Every JSON document with a dataclass: the loader below reads these through it.
TYPES: dict[str, type] = {
    C.META.path: Meta,
    C.PLAN.path: Plan,
    C.PREDICT.path: Prediction,
    C.LOAD_LEVELS.path: LoadLevel,
    C.TOPO.path: Topo,
    C.PROBE_FIT.path: ProbeFit,
    C.ATTR_TIMELINE.path: Timeline,
    C.ATTR_SUMMARY.path: Attribution,
    C.LEVERS.path: RunLevers,
}


def parse(spec: FileSpec, doc: Any, writing: bool = False) -> Any:
    """The document as its dataclass (a list of them for a list document; `Status` for status.json), every
    value a reader uses checked against its annotation; a document without a dataclass as it is. `writing`:
    types only. A summary's figures are judged by its readers (Attribution.from_json refuses a negative time
    per token), never by the command that measured them: `attribute` writes what it measured and
    `report` / `compare` say what is wrong with it."""
    if spec is C.STATUS or spec.path == C.STATUS.path:
        if not isinstance(doc, dict):
            raise SchemaError(spec, f"holds a JSON {type(doc).__name__} where an object was expected")
        stages = {k: v for k, v in doc.items() if k != "schema_version"}
        return Status(from_json(dict[str, StageStatus], stages, spec))
    tp = TYPES.get(spec.path)
    if tp is None:
        return doc
    if tp is Attribution and not writing:
        return Attribution.from_json(doc)
    if spec.list_doc:
        return [from_json(tp, item, spec, f"[{i}]") for i, item in enumerate(doc)]
    return from_json(tp, doc, spec)
