"""One table layer: each table is a list of column specs (header, how to get the value, how to print it,
relative width), rendered by the PDF, the Markdown twin and the terminal (`attribute`'s summary) alike, so a
column is added in one place.

`table(columns, rows)` gives (header, cells, widths): what pdf.py, markdown.py and attribute/show.py draw.
Cells are text; numbers go through `fmt` (about 3 significant digits, no exponent). Units are in headers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpcomm.rundir.results import Delivery
from tpcomm.terms import ENGINE


def fmt(x: float | None, digits: int = 3) -> str:
    """Numbers as every output prints them: ~3 significant digits, no exponent; None as n/a."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and 10 <= abs(x) < 1e6):
        return f"{int(x)}"
    ax = abs(x)
    if ax >= 100 or ax == 0:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.{digits}f}"


def signed_pct(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:+.{digits}f}%"


@dataclass(frozen=True)
class Col:
    header: str
    value: Callable[[Any], Any]
    width: float = 1.0
    show: Callable[[Any], str] = lambda v: v if isinstance(v, str) else fmt(v)


def table(columns: list[Col], rows: list[Any]) -> tuple[list[str], list[list[str]], list[float]]:
    return (
        [c.header for c in columns],
        [[c.show(c.value(r)) for c in columns] for r in rows],
        [c.width for c in columns],
    )


# ---- the per-level split (report breakdown section, attribute's terminal summary) -------------------------
def _term(name: str) -> Callable:
    return lambda lv: getattr(lv.per_token_ms, name) if lv.per_token_ms else None


def _closure_cell(lv) -> str:
    c = lv.closure
    if c is None or c.diff_pct is None:
        return "n/a" if c is None else f"not compared ({c.why_not_judged})" if c.why_not_judged else "n/a"
    verdict = {True: "ok", False: "FAILED"}.get(c.ok, "not judged")
    return f"{fmt(c.engine_ms)} vs {fmt(c.client_ms)} ms ({c.requests} req): {c.diff_pct:+.1f}% {verdict}"


def _five_cell(lv) -> str:
    """The delivery term and the five terms' sum against the client's own per-token time (analysis/delivery.py)."""
    dt = lv.delivery_term
    if dt is None or not dt.measured:
        return "not measured" if dt is None else f"not measured ({dt.why_not_measured})"
    verdict = {True: "ok", False: "FAILED"}.get(dt.ok, "not judged")
    check = f"{dt.diff_pct:+.1f}%{dt.of} {verdict}" if dt.diff_pct is not None else verdict
    early = f"; {dt.early_tokens} tokens before their step ended" if dt.early_tokens else ""
    return (
        f"{fmt(dt.ms)}; five terms {fmt(dt.sum_ms)} vs client {fmt(dt.client_ms)} ms ({dt.requests} req, by "
        f"{dt.pairing}): {check}{early}"
    )


def _plan_cell(lv) -> str:
    cc = lv.collectives_per_step or {}
    seen, planned = cc.get("observed_total"), cc.get("planned_total")
    mark = {True: "", False: " MISMATCH"}.get(cc.get("match"), " (not compared)")
    return f"{fmt(seen)} / {fmt(planned)}{mark}"


def _engine_cell(lv) -> Any:
    """The engine's time per token: the decode step's period, which under speculative decoding is per step, said
    so with the per-token figure beside it (LevelSplit.token_view); the term columns stay per step then."""
    sd = lv.spec_decode
    if sd is None or lv.engine_ms_per_token is None:
        return lv.engine_ms_per_token
    if sd.tokens_per_step and sd.engine_ms_per_token:
        return (
            f"{fmt(lv.engine_ms_per_token)} per step (speculative: {fmt(sd.engine_ms_per_token)} per token emitted, "
            f"{sd.tokens_per_step:.2f}/step)"
        )
    return f"{fmt(lv.engine_ms_per_token)} per step (speculative: per token not measured)"


SPLIT = [
    Col("C", lambda lv: lv.concurrency, 0.35),
    Col("rep", lambda lv: lv.repeat, 0.35),
    Col("engine ms/token", _engine_cell, 0.7),
    *(Col(f"{t.label} {t.unit}", _term(t.name), 0.7) for t in ENGINE),
    Col("clock", lambda lv: lv.clock, 0.5),
    Col("client TPOT p50 ms", lambda lv: lv.client.tpot_ms_p50 if lv.client else None, 0.75),
    Col("closure per request: engine vs client p50", _closure_cell, 1.5),
    Col("delivery ms", lambda lv: lv.delivery, 0.9, lambda d: delivery_cell(d, fmt)),
    Col("delivery term ms; five terms vs client per token", _five_cell, 1.5),
    Col("stalls", lambda lv: f"{lv.stalls.count} ({fmt(lv.stalls.total_ms)} ms)" if lv.stalls else "n/a", 0.7),
    Col("collectives/step seen / planned", _plan_cell, 1.0),
]

BY_RANK = [
    Col("C", lambda x: x[0], 0.4),
    Col("rank", lambda x: x[1].rank, 0.5),
    Col("period ms", lambda x: x[1].period_ms, 0.8),
    *(Col(f"{t.label} {t.unit}", lambda x, k=t.name: getattr(x[1].per_token_ms, k), 0.8) for t in ENGINE),
    Col("decode steps", lambda x: x[1].pairs, 0.8),
]

# ---- two instruments on one window (trace/compare.json rows) -------------------------------------------------
INSTRUMENTS = [
    Col("term", lambda r: r["term"].replace("_", " "), 1.0),
    Col("hook ms", lambda r: r.get("hook_ms"), 1.0),
    Col("trace ms", lambda r: r.get("trace_ms"), 1.0),
    Col("trace - hook ms", lambda r: r.get("diff_ms"), 1.0),
    Col("% of the per-token time", lambda r: signed_pct(r.get("diff_pct_of_per_token"), 1), 1.2),
]


# ---- the ranks' machines and clocks (Attribution.nodes and .clocks, keyed by rank) ----------------------------
def _offset(c: dict | None) -> str:
    if not c:
        return "reference (rank 0)" if c is None else "n/a"
    half = max(c["hi_us"] - c["offset_us"], c["offset_us"] - c["lo_us"])
    what = "applied" if c.get("applied") else "not applied"
    return f"{c['offset_us']:+.1f} us +- {half:.1f} ({c['instances']} collectives; {what}: {c.get('why', '')})"


NODES = [
    Col("rank", lambda r: r[0], 0.4),
    Col("host", lambda r: (r[1] or {}).get("host") or "not reported", 1.0),
    Col("boot id", lambda r: ((r[1] or {}).get("boot_id") or "not reported")[:8], 0.7),
    Col("clock offset from rank 0", lambda r: _offset(r[2]), 3.5),
]

# ---- the load ladder (load/levels.json rows as documents.LoadLevel) --------------------------------------------------------------
LOAD = [
    Col("C", lambda r: r.concurrency, 0.4),
    Col("rep", lambda r: r.repeat, 0.4),
    Col("req/failed", lambda r: f"{r.requests}/{r.failed}", 0.7),
    Col("out tok/s", lambda r: r.output_tok_per_s, 0.7),
    Col("TTFT p50 ms", lambda r: r.ttft_ms_p50, 0.7),
    Col("TPOT p50 ms", lambda r: r.tpot_ms_p50, 0.7),
    Col("ITL p50 ms", lambda r: r.itl_ms_p50, 0.7),
    Col("ITL p99 ms", lambda r: r.itl_ms_p99, 0.7),
    Col("E2E p50 ms", lambda r: r.e2e_ms_p50, 0.7),
    Col("steady", lambda r: {True: "yes", False: "NO"}.get(r.steady, "n/a"), 0.5),
    Col("repeat spread %", lambda r: r.repeat_spread_pct, 0.7),
]


# ---- levers (page one) ---------------------------------------------------------------------------------------
def _range(lv) -> str:
    r = lv.tok_per_s_range
    if not r or r.get("low") is None or fmt(r["low"]) == fmt(r["high"]):
        return ""
    return f" ({fmt(r['low'])}-{fmt(r['high'])})"


LEVERS = [
    Col("lever", lambda lv: lv.name, 1.1),
    Col("what to set", lambda lv: lv.setting, 3.6),
    Col("tok/s (range)", lambda lv: (fmt(lv.tok_per_s) if lv.tok_per_s else "not sized") + _range(lv), 1.0),
    Col("change", lambda lv: signed_pct(lv.change_pct), 0.6),
    Col("basis", lambda lv: lv.basis, 1.8),
]


def delivery_cell(d: Delivery | None, fmt) -> str:
    """Delivery in a table cell (judge/definitions.py DELIVERY_CELLS): the figure when resolved, else why not."""
    if d is None:
        return "n/a"
    if d.resolved:
        return fmt(d.ms)
    iv = f"({fmt(d.lo_ms)} to {fmt(d.hi_ms)})"
    return f"n.r. {iv}" if d.lo_ms > 0 or d.hi_ms < 0 else f"n.s. {iv}"
