"""The verdict line (which term moved, by how much, and whether it is resolved) and the CI gate.

The verdict speaks of one level: the lowest concurrency both runs measured with intervals (attribute's
headline level), else the lowest both measured. Only resolved differences are called changes, and not those
the host's load could account for (TermDiff.host_load, levels.py); the collectives (transfer + wait) are always named, changed or not, since that is what a TP lever is for.
"""

from __future__ import annotations

from tpcomm.compare.levels import host_what, signed
from tpcomm.compare.results import Gate, LevelDiff
from tpcomm.errors import InputError
from tpcomm.judge.speaks import level_that_speaks


def verdict_level(levels: list[LevelDiff]) -> LevelDiff | None:
    """judge/speaks.py over the compared levels (built from complete levels only, analysis.py): those with
    intervals first; without any, the lowest measured, whose verdict then says why nothing is resolved."""

    def speaks(problem):
        return level_that_speaks(
            levels,
            concurrency=lambda lv: lv.concurrency,
            figure=lambda lv: lv.term("per_token").diff,
            incomplete=problem,
        )

    return speaks(lambda lv: lv.problem) or speaks(lambda lv: None)


def _ms(x: float) -> str:
    return f"{signed(x)[1:] if x >= 0 else signed(x)} ms"


def verdict(lv: LevelDiff | None, only_model: str | None = None) -> str:
    if lv is None:
        return only_model or "No concurrency level was measured with a split in both runs: nothing to compare."
    where = f"At C={lv.concurrency}"
    pt = lv.term("per_token")
    judged = pt.resolved is not None
    coll = lv.term("collective")
    if not judged:
        return (
            f"{where}: B - A = {signed(pt.diff)} ms per token ({pt.diff_pct:+.1f}%), compute {signed(lv.term('compute').diff)} ms, "
            f"collectives {signed(coll.diff)} ms, host gap {signed(lv.term('host_gap').diff)} ms; "
            f"whether any of it is real cannot be said: {lv.problem}."
        )
    moved = [t for t in (lv.term("compute"), lv.term("host_gap")) if t.changed]
    moved.sort(key=lambda t: -abs(t.diff))
    if pt.changed:
        word = "slower" if pt.diff > 0 else "faster"
        head = f"{where}: B is {_ms(abs(pt.diff))} per token {word} than A ({pt.diff_pct:+.1f}%, interval {signed(pt.lo)} to {signed(pt.hi)} ms)"
        same = [t for t in moved if (t.diff > 0) == (pt.diff > 0)]
        against = [t for t in moved if (t.diff > 0) != (pt.diff > 0)]
        parts = [f"{_ms(abs(t.diff))} of it is {_name(t.name)}" for t in same]
        parts += [f"offset by {_name(t.name)} {signed(t.diff)} ms" for t in against]
    else:
        head = (
            f"{where}: no change in the per-token time that this comparison can resolve "
            f"(B - A = {signed(pt.diff)} ms, interval {signed(pt.lo)} to {signed(pt.hi)} ms)"
            if not pt.resolved
            else f"{where}: B - A = {signed(pt.diff)} ms per token (interval {signed(pt.lo)} to {signed(pt.hi)} ms), "
            f"which cannot be told from {host_what(pt.host_load)}: {pt.host_load}"
        )
        parts = [f"{_name(t.name)} changed by {signed(t.diff)} ms" for t in moved]
        if len(parts) > 1:
            parts[-1] += " (in opposite directions, within the same per-token time)"
    parts.append(_collectives(lv))
    loaded = [t for t in lv.terms if t.host_load and t.name not in ("per_token", "tok_per_s")]
    if loaded:
        parts.append(
            f"{', '.join(_name(t.name) for t in loaded)} resolved but possibly "
            f"{host_what(*(t.host_load for t in loaded))} (the level's notes say by how much)"
        )
    d = lv.term("delivery")
    if d is not None and d.resolved:
        parts.append(f"delivery to the client changed by {signed(d.diff)} ms (outside the engine's time)")
    dt, cl = lv.term("delivery_term"), lv.term("client_per_token")
    if dt is not None and dt.diff is not None and cl is not None and cl.diff is not None:
        parts.append(
            f"as the client saw it, {_ms(cl.a)} -> {_ms(cl.b)} per token, of which delivery (the fifth term) "
            f"{_ms(dt.a)} -> {_ms(dt.b)} "
            + (
                f"(interval {signed(dt.lo)} to {signed(dt.hi)} ms)"
                if dt.lo is not None and dt.hi is not None
                else "(pooled, no interval)"
            )
        )
    return head + "; " + ", ".join(parts) + "."


def caveat(lv: LevelDiff | None, again: bool = False) -> str | None:
    """What the verdict's intervals do not hold, when it matters: one repeat per run; the drift between runs
    where the per-token time changed and no run of A again measured it."""
    if lv is None or lv.problem is not None:
        return None
    if not lv.between_repeats:
        return (
            "Intervals from the runs' own spread only (one repeat each): a restart or the host's load can move a "
            "whole run by more; `tpcomm attribute --repeat 3` on both sides puts that spread in."
        )
    pt = lv.term("per_token")
    if lv.drift is None and pt is not None and pt.changed:
        return (
            "The intervals hold each run's spread between its repeats, not the drift between runs minutes apart "
            "or across a restart, which can be larger (docs/compare.md); "
            + (
                f"the run given as --again has no complete level C={lv.concurrency} to measure it."
                if again
                else "a run of A again after B, given as `--again`, measures it."
            )
        )
    return None


def _name(term: str) -> str:
    return term.replace("_", " ")


def _collectives(lv: LevelDiff) -> str:
    c, tr, wa = lv.term("collective"), lv.term("transfer"), lv.term("wait")
    if c.kind is not None:
        bits = ", ".join(f"{n} {signed(t.diff)} ms" for n, t in (("transfer", tr), ("wait", wa)))
        only, none = ("B", "A") if c.kind == "appears" else ("A", "B")
        return f"collectives {signed(c.diff)} ms ({bits}; in {only} only: {none} made no collective call, so the sign is certain)"
    if not (c.changed or tr.changed or wa.changed):
        return f"collectives unchanged ({signed(c.diff)} ms, not resolved{_loaded(c, tr, wa)})"
    bits = [
        f"{n} {signed(t.diff)} ms{'' if t.changed else ' not resolved'}" for n, t in (("transfer", tr), ("wait", wa))
    ]
    return f"collectives {signed(c.diff)} ms{'' if c.changed else ' (sum not resolved)'} ({', '.join(bits)})"


def _loaded(*terms) -> str:
    marks = [t.host_load for t in terms if t.host_load]
    return f" beyond {host_what(*marks)}" if marks else ""


def gate(levels: list[LevelDiff], pct: float) -> Gate:
    """Tripped when, at any level both runs measured with intervals, B is slower per token than A by more than
    `pct` percent and the interval of the difference excludes 0. A gate with no such level to judge is an
    input error (exit 2), never a silent pass."""
    judged = [lv for lv in levels if lv.term("per_token").resolved is not None]
    if not judged:
        raise InputError(
            f"--fail-if-slower {pct:g}",
            "cannot be judged: no concurrency level of the two runs has per-step data for an interval",
            "two run directories written by `tpcomm attribute` with attribution/steps_by_rank.parquet",
        )
    slower = [
        lv
        for lv in judged
        if lv.term("per_token").resolved and lv.term("per_token").diff > 0 and lv.term("per_token").diff_pct > pct
    ]
    hits = [lv for lv in slower if lv.term("per_token").changed]
    if slower and not hits:  # slower by more than allowed, but the host's load could be all of it
        t = slower[0].term("per_token")
        raise InputError(
            f"--fail-if-slower {pct:g}",
            f"cannot be judged: B is {t.diff_pct:.1f}% slower per token at C={slower[0].concurrency} (resolved), but "
            f"{t.host_load}",
            "two runs on a host under the same load, or more runs of A and B alternated",
        )
    if hits:
        t = hits[0].term("per_token")
        return Gate(
            pct,
            True,
            f"B is {t.diff_pct:.1f}% slower per token than A at C={hits[0].concurrency} (resolved: interval "
            f"{signed(t.lo)} to {signed(t.hi)} ms), more than the {pct:g}% allowed",
        )
    worst = max(judged, key=lambda lv: lv.term("per_token").diff_pct or 0)
    t = worst.term("per_token")
    return Gate(
        pct,
        False,
        f"no level is resolved slower by more than {pct:g}% (largest: {t.diff_pct:+.1f}% at C={worst.concurrency}, "
        + ("resolved" if t.resolved else "not resolved")
        + ")",
    )
