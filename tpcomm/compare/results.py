"""The typed result of `tpcomm compare RUN_A RUN_B`, in the style of tpcomm/rundir/results.py: one name per value,
`to_json()` with numbers as numbers (what `--json` prints), `Comparison.from_json` checks every field.

What each value means:
- `TermDiff`: one statistic of one level in A and B, B - A, and its interval (intervals.py: block bootstrap
  of each run, one simultaneous band per level); `in_sum` marks the four engine terms whose differences add
  up to the per-token time's (means over decode pairs add: exact, `LevelDiff.sum_residual_ms` is the float
  rounding left). `host_load`: a resolved difference that the change in the host's contention between the
  runs (`LevelDiff.cpu_wait_ms_per_step`) or in its speed (`LevelDiff.reference_ms`, the client's reference
  work on the server's machine) or in the CPU time others took there (`LevelDiff.others_cpu_pct`) could account
  for; `changed` = resolved and not that.
  "collective" = transfer + wait (a sub-total, not a fifth term); "delivery" is the client's
  p50 over requests of (client - engine time per token), attribute's statistic, outside the engine's sum.
- `SiteDiff`: one collective site (group, op, bytes, backend) as attribute lists it per level (top sites by
  time per step): calls per decode step, transfer and wait per call, in A and in B.
- `ConditionDiff`: one condition of the runs (model, plan, layout, backends, settings, versions, hardware,
  load), its value in A and B, and where it was read.
- `ModelDiff`: predict.json of both runs (model-based): B - A per term at the central inputs and over the
  input corners both runs share (the range a model-based difference holds over).

Units: *_ms and "ms" milliseconds per token, *_us microseconds, tok/s, *_pct percent of A's value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpcomm.rundir.contract import COMPARE_JSON, SchemaError
from tpcomm.rundir.results import from_json, to_json

KINDS = (None, "appears", "disappears")  # TermDiff.kind


@dataclass
class TermDiff:
    name: str  # per_token | compute | transfer | wait | host_gap | collective | delivery | tok_per_s
    unit: str  # "ms" | "tok/s"
    a: float | None
    b: float | None
    diff: float | None  # B - A
    diff_pct: float | None  # of A's value
    lo: float | None  # the interval of B - A (None: no interval)
    hi: float | None
    resolved: bool | None  # the interval excludes 0, or a change of kind (`kind`); None without an interval
    in_sum: bool  # one of the four engine terms that add up to the per-token time
    statement: str  # "changed by ..." | "no change that this comparison can resolve ..." | why not compared
    # Resolved, yet the host's contention (the ranks' CPU wait per step) changed by at least the smallest
    # difference the interval admits: why it cannot be told from the host's load (levels.host_load). None else.
    host_load: str | None = None
    # "appears" | "disappears": a collective term exactly 0 in one run (no collective call there) and above 0 in
    # every repeat of the other: resolved by kind, its sign certain (levels.of_kind); None for every other term.
    kind: str | None = None

    @property
    def changed(self) -> bool:
        """Resolved, and not possibly the host's load: what the verdict and the gate call a change."""
        return bool(self.resolved) and self.host_load is None


@dataclass
class SiteDiff:
    group: str
    op: str
    bytes_a: int | None
    bytes_b: int | None
    backend_a: str | None
    backend_b: str | None
    calls_per_step_a: float | None
    calls_per_step_b: float | None
    transfer_us_per_call_a: float | None
    transfer_us_per_call_b: float | None
    wait_us_per_call_a: float | None
    wait_us_per_call_b: float | None
    match: str  # "same site" | "bytes differ" | "backend differs" | "A only" | "B only"


@dataclass
class LevelDiff:
    concurrency: int
    repeats_a: list[int]  # the level's attributed repeats in each run (each side's values: their mean)
    repeats_b: list[int]
    terms: list[TermDiff]
    sum_residual_ms: float | None  # diff(per_token) - sum of the four terms' diffs (float rounding only)
    resampled: str  # what the interval resampled in each run, or why there is none
    critical_value: float | None  # the simultaneous band's c (intervals = diff +- c * se, but a statistic named
    # in `resampled` as having its own tails: its own draws' interval)
    between_repeats: bool | None  # the intervals hold the spread between repeats (several repeats on a side)
    problem: str | None  # why this level has no intervals
    clock: str  # the clock of both runs' terms ("host", "gpu", or "host vs gpu")
    sites: list[SiteDiff]
    notes: list[str] = field(default_factory=list)
    # [A, B]: the TP workers' CPU wait per engine step, ms (summed over ranks, mean over repeats; None: not
    # measured): the host's contention during each run (tpcomm.rundir.results.CpuWait)
    cpu_wait_ms_per_step: list[float | None] = field(default_factory=lambda: [None, None])
    # the host's speed: its reference work's trimmed mean ms in A and B (analysis/hostload.py); None: not measured
    reference_ms: list[float | None] = field(default_factory=lambda: [None, None])
    # others' CPU on the server's machine during the level, percent of its CPU time, A and B (None: not measured)
    others_cpu_pct: list[float | None] = field(default_factory=lambda: [None, None])
    # A again less A per term (`compare --again`: a run of A's configuration made after B); None: no such run
    drift: dict[str, float] | None = None

    def term(self, name: str) -> TermDiff | None:
        return next((t for t in self.terms if t.name == name), None)


@dataclass
class ConditionDiff:
    section: str  # model | plan | layout | backends | settings | versions | hardware | load
    name: str
    a: Any
    b: Any
    same: bool
    source: str  # the file (or files) it was read from


@dataclass
class ModelTerm:
    name: str
    a_ms: float | None  # central inputs
    b_ms: float | None
    diff_ms: float | None
    diff_low_ms: float | None  # B - A over the input corners both runs share: lowest and highest
    diff_high_ms: float | None
    a_range_ms: list[float] | None  # [low, high] of A's own range
    b_range_ms: list[float] | None


@dataclass
class ModelDiff:
    source: str  # "model-based"
    label: str  # what the predictions are (e.g. "central inputs, range over 8 corners"; "anchored on ...")
    corners: int  # input corners compared (same inputs in A and B)
    terms: list[ModelTerm]  # "ms_per_token" first, then each breakdown term
    tok_per_s: list[float | None]  # [A, B] at the central inputs
    statement: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Gate:
    pct: float
    tripped: bool
    statement: str


@dataclass
class Comparison:
    run_a: str
    run_b: str
    kind: str  # "measured" | "model-based" | "measured and model-based"
    levels: list[LevelDiff]
    only_in_a: list[str]  # levels measured in one run only, or without a split in the other (named, not compared)
    only_in_b: list[str]
    conditions: list[ConditionDiff]
    model: ModelDiff | None
    verdict: str
    verdict_level: int | None  # the concurrency the verdict speaks of
    caveat: str | None  # what the verdict's intervals do not hold (one repeat per run), printed with it
    method: str
    notes: list[str] = field(default_factory=list)
    gate: Gate | None = None
    run_again: str | None = None  # `--again`: a run of A's configuration made after B (the drift between runs)

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, doc: Any) -> Comparison:
        cmp = from_json(cls, doc, COMPARE_JSON)
        for i, lv in enumerate(cmp.levels):
            for j, t in enumerate(lv.terms):
                if t.kind not in KINDS:
                    raise SchemaError(
                        COMPARE_JSON,
                        f"holds {t.kind!r} where one of {KINDS} was expected",
                        f"levels[{i}].terms[{j}].kind",
                    )
        return cmp
