"""The typed results that `attribute` and `predict` write and `report` reads unchanged: one name per value.

attribution/summary.json is `Attribution.to_json()`; a reader gets it back with `Attribution.from_json()`,
which checks every field's type and names the first that is wrong (a `SchemaError`, exit 2 at the CLI),
so nothing downstream needs `.get(..) or {}`. The page-one judgements (`Verdict`, `Lever`) are built by
tpcomm/judge/ from these and carried the same way.

What each value means (the definitions the report prints come from tpcomm/judge/definitions.py):
- `Terms`: one token's engine time split; compute + transfer + wait + host_gap = the per-token time it
  explains (means over the same decode periods add up exactly; analysis/split.py).
- `LevelSplit.engine_ms_per_token`: the mean period of the level's decode steps (each from the end of the
  step before it to its own end: a token is made when its step ends) (on `clock`: "gpu" where the hook put step boundaries on the GPU timeline,
  "host" otherwise); the headline at the lowest concurrency.
- `Closure`: per request, the engine's time per token for that request's own decode steps against the
  client's TPOT of the same request; the same statistic (p50 over the same requests) on both sides.
- `Delivery`: p50 over those requests of client - engine, with the p50's distribution-free interval.
- `DeliveryTerm`: the fifth term of a token (analysis/delivery.py): per token, the client's receipt minus
  the end of the engine step that made it, pooled over a level's requests; with the four engine terms over
  the same requests' decode steps it adds up to the client's per-token time (held tokens included). None
  in a summary written before schema 3 (`tpcomm attribute --reanalyse RUN_DIR` measures it).

Units: *_ms milliseconds (per token unless named otherwise), *_pct percent, *_ns wall clock ns, tok/s.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import tpcomm
from tpcomm.rundir.contract import ATTR_SUMMARY, LEVERS, FileSpec, SchemaError
from tpcomm.terms import ENGINE_TERMS

TERMS = ENGINE_TERMS  # tpcomm/terms.py


@dataclass
class Terms:
    compute: float
    transfer: float
    wait: float
    host_gap: float

    @property
    def total(self) -> float:
        return self.compute + self.transfer + self.wait + self.host_gap

    @property
    def collective(self) -> float:
        """Collective time = transfer + wait."""
        return self.transfer + self.wait

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in TERMS}


@dataclass
class RankTerms:
    rank: int
    period_ms: float
    per_token_ms: Terms
    pairs: int
    sampled_pairs: int


@dataclass
class Client:
    """The client's figures over the level's successful requests (load/*.parquet)."""

    requests: int
    tpot_ms_p50: float | None
    tpot_ms_mean: float | None
    itl_ms_p50: float | None
    itl_ms_mean: float | None
    held_requests: list[int] = field(default_factory=list)  # streams the API server held back whole
    stalled_requests: list[int] = field(default_factory=list)


@dataclass
class StallGap:
    """One long gap between two token chunks of a request: the chunk after it (token_idx) and its length."""

    request_id: int
    token_idx: int
    gap_ms: float


@dataclass
class Stalls:
    count: int
    total_ms: float
    threshold_ms: float
    requests: list[int] = field(default_factory=list)
    gaps: list[StallGap] = field(default_factory=list)  # where, the longest MAX_STALL_GAPS (count has them all)


@dataclass
class Delivery:
    """p50 over the compared requests of (client TPOT - engine time per token), with the p50's interval."""

    ms: float
    lo_ms: float
    hi_ms: float
    coverage: float
    requests: int
    resolved: bool


@dataclass
class DeliveryTerm:
    """The fifth term (analysis/delivery.py): client per token = the four engine terms + delivery, over the
    same requests (pooled by token). `diff_pct` = (sum of the five - client) / the engine's per-token time over
    the same tokens (`diff_of`; the client's in summaries before 2026-12-06): what the pairing leaves, judged on
    at least 6 requests within `tolerance_pct` at C=1 and wherever the tokens were paired with their steps by
    request id (`pairing`)."""

    measured: bool
    ms: float | None  # per token: how much later each token reached the client than the one before it
    client_ms: float | None  # the client's per-token time over the same requests ((last - first) / (n - 1))
    engine_ms: float | None  # the engine's, from the ends of the steps that made those tokens
    split_ms: float | None  # the four engine terms over those requests' decode steps (their mean period)
    sum_ms: float | None  # split_ms + ms
    diff_pct: float | None
    tolerance_pct: float
    judged: bool
    ok: bool | None
    requests: int
    tokens: int
    held_tokens: int  # delivered over 100 ms later than the level's median delay (a hold or a stall)
    held_requests: list[int] = field(default_factory=list)
    delay_ms_p50: float | None = None  # receipt - step end per token; None unless client and server share a clock
    delay_ms_p90: float | None = None
    delay_ms_max: float | None = None
    held_delay_ms_max: float | None = None  # the longest delay beyond the median (offset-free)
    why_not_judged: str | None = None
    why_not_measured: str | None = None
    # how tokens were paired with their steps: "prefill segments" (C=1) or "request ids" (the hook's records)
    pairing: str = "prefill segments"
    # on one clock: tokens the client received over EARLY_MS before the end of the step they were paired with
    # (impossible: the pairing is wrong, and the check fails); 0 where the clocks differ
    early_tokens: int = 0
    # the four engine terms of split_ms, over the same requests' decode steps: the rows that add up to it (at
    # C=1 the level's own split; above it the level's split is its whole window's, these the requests' steps')
    split_terms: Terms | None = None
    diff_of: str = "client"  # diff_pct's denominator: "engine" (since 2026-12-06), "client" before

    @property
    def of(self) -> str:
        """What diff_pct is a percentage of, as printed after it ("" for the older summaries' client's)."""
        return " of the engine's" if self.diff_of == "engine" else ""

    @classmethod
    def not_measured(cls, why: str) -> DeliveryTerm:
        return cls(False, None, None, None, None, None, None, 0.0, False, None, 0, 0, 0, why_not_measured=why)


@dataclass
class Closure:
    statistic: str  # what is compared on both sides, e.g. "p50 over 14 requests, paired by prefill"
    pairing: str  # "prefill segments" | "request ids" | "client times" | "none"
    requests: int  # compared (paired, not stalled, not held)
    excluded: dict[str, list[int]]  # why -> request ids left out of both sides
    engine_ms: float | None
    client_ms: float | None
    diff_pct: float | None
    tolerance_pct: float
    judged: bool
    ok: bool | None
    why_not_judged: str | None = None


@dataclass
class CpuWait:
    """How long the TP workers' step threads waited for a CPU during the level's recording (Linux schedstat
    run_delay: runnable, not running), from the hook: the host's contention as the threads that run the steps
    met it (also while one spins for a peer). Threads computing beside them (vLLM-CPU's other OpenMP threads),
    the engine core and the API server are not in it."""

    ms_per_step: float  # summed over ranks, per engine step (of any kind)
    per_rank: dict[str, dict[str, float]]  # rank -> {"ms": over the recording, "steps": engine steps}


@dataclass
class HostLoad:
    """The machine's load over a level, read by the client where it runs on the server's machine (Linux
    /proc/pressure/cpu and /proc/loadavg), and the API server's CPU wait (schedstat run_delay of its threads)
    per token delivered. Others' processes on a shared machine are in it: it is the host's, not tpcomm's."""

    cpus: int
    loadavg_1m: float | None  # at the level's end
    cpu_pressure_pct: float | None  # share of the level's time some runnable task waited for a CPU
    api_server_wait_ms_per_token: float | None  # the API server's threads' CPU wait over the level / tokens
    high: bool  # pressure at least HIGH_PRESSURE_PCT or load above the CPU count
    client_wait_ms_per_token: float | None = None  # the same for tpcomm's own client process
    # the host's speed as one thread got it: a fixed workload (analysis/hostload.REFERENCE_CODE, in a fresh
    # interpreter) run 9 times before the level's recording and 9 after its records; mean ms without the
    # slowest 2 (waits for a CPU included) and median ms (the speed while it ran); larger is slower. None: not
    # measured (not on the server's machine, or a run older than these fields).
    reference_ms: float | None = None
    reference_median_ms: float | None = None
    # the CPU time others took over the level's last round: the machine's busy time less the server's process
    # tree's and the client's, with the hypervisor's steal, percent of the machine's CPU time; and the steal
    # alone. None: not measured (off Linux, the server's processes not readable, a run older than the fields).
    others_cpu_pct: float | None = None
    steal_pct: float | None = None


@dataclass
class ServerClock:
    """How a level's window was placed on the server's clock (analysis/serverclock.py)."""

    placement: str  # "moved" | "allowed for" | "as measured" | "not measured"
    rank: int | None = None  # the rank whose clock was bounded (rank 0: the ranks are put on it)
    lo_ms: float | None = None  # server clock - client clock, at least
    hi_ms: float | None = None  # at most
    rtt_ms: float | None = None  # the start call's round trip (hi - lo)

    @property
    def placed(self) -> bool:
        """The window was placed by the bound (moved, or allowing for it): the report and terminal say so."""
        return self.placement in ("moved", "allowed for")

    @property
    def resolved(self) -> bool:
        """The bound excludes 0: the clocks differ."""
        return self.lo_ms is not None and self.hi_ms is not None and (self.lo_ms > 0 or self.hi_ms < 0)

    def text(self) -> str:
        if self.lo_ms is None or self.hi_ms is None:
            return "the server's clock against the client's: not measured (no recording start timed)"
        mid = (self.lo_ms + self.hi_ms) / 2
        side = f"{abs(mid):.1f} ms {'ahead of' if mid >= 0 else 'behind'}"
        what = {
            "moved": "the level's window was moved onto the server's clock",
            "allowed for": "the clocks agree within the bound, the client is on another machine: the level's "
            "window was placed allowing for the offset the bound leaves possible",
            "as measured": "one clock: the window as the client read it",
        }.get(self.placement, self.placement)
        return (
            f"the server's clock (rank {self.rank}) is {side} the client's (server - client between {self.lo_ms:+.1f} "
            f"and {self.hi_ms:+.1f} ms, bounded by the recording's start call, {self.hi_ms - self.lo_ms:.1f} ms round trip): {what}"
        )


@dataclass
class Site:
    group: str
    op: str
    bytes: int
    backend: str
    count_per_step: float
    time_us_per_step: float
    transfer_us_per_step: float
    wait_us_per_step: float
    plan_sites: list[str] = field(default_factory=list)


@dataclass
class SpecDecode:
    """Speculative decoding in the level's decode steps (analysis/specdecode.py): the split is per engine step;
    per accepted token it is the figures here (the client's tokens over the decode steps that made them)."""

    drafts_per_seq: float  # draft tokens scheduled per sequence per decode step (the hook's step rows)
    tokens_per_step: float | None  # tokens emitted per sequence per decode step (None: not measured)
    requests: int  # requests it was measured over
    engine_ms_per_token: float | None  # the step period over tokens_per_step
    per_token_ms: Terms | None  # each term over tokens_per_step (they add up to engine_ms_per_token)
    why_not: str | None = None  # why tokens_per_step is not measured
    decode_steps: int | None = None  # the counted requests' decode steps (tokens_per_step's denominator)
    draft_tokens: int | None = None  # draft tokens those steps scheduled (None: not known per request)
    accepted_tokens: int | None = None  # tokens after each request's first beyond one per decode step
    measured_from: str | None = None  # how tokens_per_step was counted (analysis/specdecode.py)


@dataclass
class LevelSplit:
    concurrency: int
    repeat: int
    attributed: bool  # False: no split (see note); the terms below are then None
    note: str | None
    window: dict[str, int] | None
    source: str  # "hook" | "trace"
    clock: str  # "host" | "gpu": the clock every term of this level is on
    engine_ms_per_token: float | None
    per_token_ms: Terms | None
    shares_pct: dict[str, float] | None  # printed shares (0.1 steps, sum exactly 100.0)
    by_rank: list[RankTerms]
    decode_pairs: int
    sampled_pairs_share: float | None
    seqs_per_step: float | None
    steps_in_window: dict[str, int]
    ceilings_tok_per_s: dict[str, float | None]
    client: Client | None
    stalls: Stalls | None
    closure: Closure | None
    delivery: Delivery | None
    top_sites: list[Site]
    collectives_per_step: dict[str, Any]  # the plan cross-check (analysis/crosscheck.py compare())
    flags: list[str] = field(default_factory=list)
    # Why the level did not measure what it claims (judge/complete.py), None when it did: no headline from it
    incomplete: str | None = None
    cpu_wait: CpuWait | None = None  # the host's contention during the level (None: not measured)
    delivery_term: DeliveryTerm | None = None  # the fifth term (None: a summary older than schema 3)
    host_load: HostLoad | None = None  # the machine's load during the level (None: not measured)
    spec_decode: SpecDecode | None = None  # None: no draft token scheduled (or a summary older than this field)
    # how the level's window was placed on the server's clock (None: a summary older than this field)
    server_clock: ServerClock | None = None

    def token_view(self) -> tuple[float | None, Terms | None, str | None]:
        """(ms per token a stream gets, its terms, what they are): the split itself where a decode step makes one
        token per stream (None); under speculative decoding the split over the tokens each decode step emitted,
        said so; (None, None, why) where speculative decoding ran and those were not measured. The headline,
        the measured levers and predict's anchoring read this."""
        sd = self.spec_decode
        if sd is None or self.engine_ms_per_token is None:
            return self.engine_ms_per_token, self.per_token_ms, None
        if sd.tokens_per_step is None or not sd.engine_ms_per_token or sd.per_token_ms is None:
            return None, None, f"speculative decoding, tokens per step not measured: {sd.why_not}"
        return (
            sd.engine_ms_per_token,
            sd.per_token_ms,
            f"the engine step ({self.engine_ms_per_token:.3g} ms) over the {sd.tokens_per_step:.2f} tokens each "
            f"decode step emitted (speculative decoding; {sd.requests} requests)",
        )

    @property
    def tok_per_s(self) -> float | None:
        """One stream's tok/s from the engine's per-token time (x sequences per step at C > 1)."""
        if not self.engine_ms_per_token:
            return None
        return 1e3 / self.engine_ms_per_token * (self.seqs_per_step or 1.0)


@dataclass
class Verdict:
    """The one bottleneck judgement (tpcomm/judge/bottleneck.py) on one split, measured or model-based."""

    source: str  # "measured" | "model-based"
    decided: bool
    interconnect_is_bottleneck: bool | None
    transfer_share: float | None  # fraction of the token (low-high over a model's range: see share_range)
    collective_share: float | None
    main_term: str | None  # the largest term other than the collectives
    wait_exceeds_transfer: bool | None
    statement: str
    decides: str | None = None  # the measurement that would decide it, when not decided
    share_range: dict[str, float] | None = None  # model-based: {low, central, high} of the transfer share


@dataclass
class Lever:
    """Something the operator can set, with its predicted effect on single-stream tok/s (judge/levers.py)."""

    name: str
    setting: str  # what to set: a vLLM flag, an environment variable, or the action
    tok_per_s: float | None
    tok_per_s_range: dict[str, float] | None
    change_pct: float | None
    basis: str  # where the figure comes from
    kind: str = "lever"  # "lever" | "bound"


@dataclass
class Attribution:
    """attribution/summary.json."""

    source: str  # "hook" | "trace"
    plugin: bool
    plugin_note: str | None
    method: str
    conditions: dict[str, Any]
    plan_config: dict[str, Any]
    windows: list[dict[str, int]]
    notes: list[str]
    levels: list[LevelSplit]
    alignment: dict[str, Any] | None = None
    # rank -> {host, boot_id, pid} as the hook reported them; rank -> clock offset estimate (analysis/clocks.py)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    clocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the hook could not time in this server (analysis/coverage.py): one line each, empty when all was timed
    not_timed: list[str] = field(default_factory=list)
    verdict: Verdict | None = None  # the measured verdict at the headline level (lowest C with a split)
    headline: dict[str, int] | None = None  # {concurrency, repeat} of the level the headline comes from

    def incomplete(self) -> list[str]:
        """'C=4 repeat 0: why' for every incomplete level (judge/complete.py)."""
        return [f"C={lv.concurrency} repeat {lv.repeat}: {lv.incomplete}" for lv in self.levels if lv.incomplete]

    def headline_level(self) -> LevelSplit | None:
        if self.headline is None:
            return None
        return next(
            (
                lv
                for lv in self.levels
                if (lv.concurrency, lv.repeat) == (self.headline["concurrency"], self.headline["repeat"])
            ),
            None,
        )

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, doc: Any) -> Attribution:
        att = from_json(cls, doc, ATTR_SUMMARY)
        # A time per token is positive: a summary with -5 ms per token once showed as -199.9% in `compare`.
        for i, lv in enumerate(att.levels):
            for name, v in (
                ("engine_ms_per_token", lv.engine_ms_per_token),
                ("per_token_ms (sum of its terms)", lv.per_token_ms.total if lv.per_token_ms else None),
            ):
                if v is not None and not 0 <= v < 1e9:
                    raise SchemaError(
                        ATTR_SUMMARY, f"holds {v:g} ms, not a time per token (at least 0)", f"levels[{i}].{name}"
                    )
        return att


@dataclass
class RunLevers:
    """levers.json (tpcomm/analysis/levers.py computes it): what to set, ranked by effect on single-stream
    tok/s, with the basis of the figures."""

    basis: str | None  # where the figures come from; None: nothing to size levers on
    levers: list[Lever] = field(default_factory=list)  # kind "lever", best first
    bounds: list[Lever] = field(default_factory=list)  # kind "bound" (a measured split states them as a line)
    not_offered: list[dict[str, str]] = field(default_factory=list)  # {name, why}
    more_with_predict: bool = False  # sized on the measured split alone: predict --attribution sizes more
    inputs: dict[str, str | None] = field(default_factory=dict)  # file -> SHA-256 of what was read (None: absent)
    tpcomm: str = tpcomm.__version__  # the version whose rule (judge/levers.py) computed them: another one recomputes

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> RunLevers:
        """Every field type-checked: a hand-edited file is a SchemaError, not a crash."""
        return from_json(cls, d, LEVERS)


# ---- (de)serialisation with type checks ---------------------------------------
def to_json(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    return obj


def from_json(cls: type, doc: Any, spec: FileSpec | str, where: str = "") -> Any:
    """`doc` as an instance of dataclass `cls`, every field checked against its annotation."""
    return _load(cls, doc, spec, where)


def _load(tp: Any, v: Any, spec, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if v is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _load(a, v, spec, where)
            except SchemaError as e:
                errors.append(e)
        raise errors[0] if errors else _bad(spec, where, v, tp)
    if origin is list:
        (a,) = typing.get_args(tp) or (Any,)
        if not isinstance(v, list):
            raise _bad(spec, where, v, "a list")
        return [_load(a, x, spec, f"{where}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        ka, va = typing.get_args(tp) or (str, Any)
        if not isinstance(v, dict):
            raise _bad(spec, where, v, "an object")
        return {k: _load(va, x, spec, f"{where}.{k}" if where else str(k)) for k, x in v.items()}
    if tp is Any:
        return v
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise _bad(spec, where, v, "an object")
        hints = typing.get_type_hints(tp)
        kw = {}
        for f in dataclasses.fields(tp):
            name = f"{where}.{f.name}" if where else f.name
            if f.name not in v:
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                raise SchemaError(spec, "lacks a required key", name)
            kw[f.name] = _load(hints[f.name], v[f.name], spec, name)
        return tp(**kw)
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(spec, where, v, "a number")
        return float(v)
    if tp is int:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise _bad(spec, where, v, "an integer")
        return int(v)
    if tp is bool:
        if not isinstance(v, bool):
            raise _bad(spec, where, v, "true or false")
        return v
    if tp is str:
        if not isinstance(v, str):
            raise _bad(spec, where, v, "text")
        return v
    raise TypeError(f"results.py cannot load {tp!r}")  # a programming error: an annotation this loader lacks


def _bad(spec, where: str, v: Any, expected: Any) -> SchemaError:
    names = {str: "text", bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "an object"}
    got = "null" if v is None else names.get(type(v), type(v).__name__)
    return SchemaError(spec, f"holds {got} where {expected} was expected", where or None)
