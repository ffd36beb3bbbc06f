"""The comparison's tables (column specs of tpcomm/columns.py: one layer for the PDF, the Markdown twin and the
terminal) and its content as report blocks (the block kinds of tpcomm/report/tables.py), so every output
says the same thing. Only formatting happens here; the numbers come from analysis.py.
"""

from __future__ import annotations

from tpcomm.columns import Col, fmt, table
from tpcomm.compare.levels import LABELS, host_what, signed
from tpcomm.compare.results import Comparison, LevelDiff


def _iv(t) -> str:
    if t.lo is None:
        return "no interval"
    return f"{signed(t.lo)} to {signed(t.hi)}"


def _said(t) -> str:
    if t.diff is None:
        return "not compared"
    if t.resolved is None:
        return "not judged (no interval)"
    if t.resolved and t.host_load:
        return (
            f"{signed(t.diff)} {t.unit}, resolved, but possibly {host_what(t.host_load)} (the level's notes say by "
            "how much)"
        )
    if t.kind is not None:
        return f"changed by {signed(t.diff)} {t.unit} ({t.kind}: " + (
            "none in A)" if t.kind == "appears" else "none in B)"
        )
    return f"changed by {signed(t.diff)} {t.unit}" if t.resolved else "no change this comparison can resolve"


TERMS = [
    Col("term", lambda t: LABELS[t.name] + (" *" if t.in_sum else ""), 1.7),
    Col("A", lambda t: t.a, 0.6),
    Col("B", lambda t: t.b, 0.6),
    Col("B - A", lambda t: signed(t.diff), 0.6),
    Col("B - A %", lambda t: "n/a" if t.diff_pct is None else f"{t.diff_pct:+.1f}%", 0.6),
    Col("B - A interval (95%, one band per level)", _iv, 1.2),
    Col("unit", lambda t: t.unit, 0.45),
    Col("what it says", _said, 1.4),
]
TERMS_KEY = "* the four engine terms: their B - A add up to the per-token time's B - A."


def _pair(a, b, f=fmt) -> str:
    if a == b:
        return f(a) if a is not None else "n/a"
    return f"{f(a) if a is not None else '-'} -> {f(b) if b is not None else '-'}"


SITES = [
    Col("group", lambda s: s.group, 0.5),
    Col("op", lambda s: s.op, 0.8),
    Col("bytes A -> B", lambda s: _pair(s.bytes_a, s.bytes_b, lambda v: str(v)), 0.9),
    Col("backend", lambda s: _pair(s.backend_a, s.backend_b, str), 0.7),
    Col("calls/step A", lambda s: s.calls_per_step_a, 0.6),
    Col("calls/step B", lambda s: s.calls_per_step_b, 0.6),
    Col("transfer us/call A", lambda s: s.transfer_us_per_call_a, 0.7),
    Col("transfer us/call B", lambda s: s.transfer_us_per_call_b, 0.7),
    Col("wait us/call A", lambda s: s.wait_us_per_call_a, 0.7),
    Col("wait us/call B", lambda s: s.wait_us_per_call_b, 0.7),
    Col("match", lambda s: s.match, 0.7),
]


def _val(v) -> str:
    if v is None:
        return "not recorded"
    if isinstance(v, float):
        return fmt(v)
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return str(v)


CONDITIONS = [
    Col("section", lambda c: c.section, 0.6),
    Col("condition", lambda c: c.name, 1.3),
    Col("A", lambda c: _val(c.a), 1.8),
    Col("B", lambda c: _val(c.b), 1.8),
    Col("read from", lambda c: c.source, 1.1),
]


def _rng(r) -> str:
    return f" ({fmt(r[0])}-{fmt(r[1])})" if r else ""


MODEL = [
    Col("term", lambda t: t.name.replace("_", " "), 1.2),
    Col("A ms (range)", lambda t: fmt(t.a_ms) + _rng(t.a_range_ms), 1.0),
    Col("B ms (range)", lambda t: fmt(t.b_ms) + _rng(t.b_range_ms), 1.0),
    Col("B - A ms (central)", lambda t: signed(t.diff_ms), 0.8),
    Col(
        "B - A ms over the shared corners",
        lambda t: "n/a" if t.diff_low_ms is None else f"{signed(t.diff_low_ms)} to {signed(t.diff_high_ms)}",
        1.2,
    ),
]


SUMMARY = (  # (section, name, how it reads) of the conditions every run states in one line
    ("model", "served name", "model {}"),
    ("model", "architecture", "{}"),
    ("model", "dtype", "{}"),
    ("layout", "tp", "TP {}"),
    ("backends", "backends seen by the hook", "backends {}"),
    ("backends", "timing", "timing {}"),
    ("versions", "server vllm", "vLLM {}"),
    ("hardware", "summary", "{}"),
    ("hardware", "predict profile", "predicted for {}"),
)


def _conditions(cmp: Comparison, side: str) -> str:
    got = {(c.section, c.name): (c.a if side == "A" else c.b) for c in cmp.conditions}
    parts = [f.format(_val(got[(s, n)])) for s, n, f in SUMMARY if got.get((s, n)) not in (None, [], "")]
    return ", ".join(parts) or "not recorded"


def level_title(lv: LevelDiff) -> str:
    reps = lambda r: f"{len(r)} repeats" if len(r) > 1 else f"repeat {r[0]}"  # noqa: E731
    return f"C={lv.concurrency} (A {reps(lv.repeats_a)}, B {reps(lv.repeats_b)}; clock: {lv.clock})"


def sections(cmp: Comparison) -> list[tuple[str, list]]:
    """(title, blocks) in the order the PDF and the Markdown print them."""
    out: list[tuple[str, list]] = []
    head: list = [("headline", cmp.verdict)]
    if cmp.caveat:
        head.append(("text", cmp.caveat))
    if cmp.gate is not None:
        kind = "warning" if cmp.gate.tripped else "text"
        head.append(
            (
                kind,
                f"--fail-if-slower {cmp.gate.pct:g}: " + ("TRIPPED: " if cmp.gate.tripped else "") + cmp.gate.statement,
            )
        )
    again = f"; A again (the drift between runs) = {cmp.run_again}" if cmp.run_again else ""
    head.append(("small", f"A = {cmp.run_a}; B = {cmp.run_b}{again}; {cmp.kind} comparison."))
    for lv in cmp.levels:
        pt = (lv.drift or {}).get("per_token")
        if pt is not None and lv.term("per_token") and lv.term("per_token").a:
            head.append(
                (
                    "small",
                    f"C={lv.concurrency}: A again differed from A by {signed(pt)} ms per token "
                    f"({100 * pt / lv.term('per_token').a:+.1f}%): the drift between two runs of A's configuration",
                )
            )
    head.append(("small", "Conditions: " + "; ".join(f"{side}: {_conditions(cmp, side)}" for side in ("A", "B"))))
    # Recorded in both runs first; then what one run recorded and the other did not.
    differ = sorted((c for c in cmp.conditions if not c.same), key=lambda c: c.a is None or c.b is None)
    # The first few that differ, the windows and CPU waits left out (every two runs' differ): the table has them all.
    shown = [
        c
        for c in differ
        if (c.section != "load" or not c.name.endswith((" window", " CPU wait")))
        and c.a is not None
        and c.b is not None
    ]
    if shown:
        text = "; ".join(f"{c.name}: {_val(c.a)} -> {_val(c.b)}" for c in shown[:5])
        head.append(("small", f"What differs: {text}" + (" (more in the conditions table)" if len(shown) > 5 else "")))
    if cmp.levels:
        head.append(
            (
                "figure",
                "compare_terms",
                "B - A per term with its interval (solid: resolved and not possibly the host's load or the drift "
                "between runs; pale: not)",
            )
        )
    out.append(("Verdict", head))
    for lv in cmp.levels:
        blocks: list = [("table", table(TERMS, lv.terms)), ("small", TERMS_KEY)]
        if lv.sum_residual_ms is not None:
            blocks.append(
                (
                    "small",
                    f"Sum check: B - A of the per-token time minus the four terms' B - A = {lv.sum_residual_ms:.1e} ms.",
                )
            )
        blocks.append(("small", "Intervals: " + lv.resampled))
        blocks += [("small", n) for n in lv.notes]
        if lv.sites:
            which = "the first repeat of each run; " if len(lv.repeats_a) > 1 or len(lv.repeats_b) > 1 else ""
            blocks.append(("text", f"Collective sites ({which}attribute's top sites by time per decode step):"))
            blocks.append(("table", table(SITES, lv.sites)))
        out.append((f"Per token, term by term: {level_title(lv)}", blocks))
    not_compared = [("text", f"Only in A: {x}") for x in cmp.only_in_a] + [
        ("text", f"Only in B: {x}") for x in cmp.only_in_b
    ]
    if not_compared:
        out.append(("Levels not compared", not_compared))
    if cmp.model is not None:
        m = cmp.model
        blocks = [("text", m.statement), ("small", m.label), ("table", table(MODEL, m.terms))]
        blocks += [("small", n) for n in m.notes]
        out.append(("Model-based: the two predictions", blocks))
    same = len(cmp.conditions) - len(differ)
    cond_blocks: list = (
        [("table", table(CONDITIONS, differ))] if differ else [("text", "No recorded condition differs.")]
    )
    cond_blocks.append(
        ("small", f"{same} other recorded conditions are the same in both runs (compare.json lists all).")
    )
    out.append(("Conditions that differ", cond_blocks))
    out.append(("Method", [("small", cmp.method)] + [("small", n) for n in cmp.notes]))
    return out
