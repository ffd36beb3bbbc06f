"""`compare_runs(A, B)`: what a change did to each token, term by term, and whether it is real.

Reads two run directories (runs.py), pairs their concurrency levels, and per level present in both gives
every statistic of A and B, B - A, and an interval from the runs' own spread (levels.py, intervals.py); the
collective sites side by side; what differs in their conditions (conditions.py); their predictions when both
have one (model.py, model-based); and one verdict line (verdict.py). Levels measured in one run only, or
without a split in one, are named and not compared.
"""

from __future__ import annotations

from pathlib import Path

from tpcomm.compare import conditions
from tpcomm.compare.intervals import LEVEL, REPLICATES
from tpcomm.compare.levels import level_diff
from tpcomm.compare.model import model_diff
from tpcomm.compare.results import Comparison
from tpcomm.compare.runs import check_pair, load_run
from tpcomm.compare.verdict import caveat, gate, verdict, verdict_level
from tpcomm.errors import InputError

METHOD = (
    "Per concurrency level present in both runs: the per-token time (the mean period of the decode "
    "steps, each from the end of the step before it to its own end, attribute's headline statistic, over the decode steps its headline uses) and its "
    "four terms (compute, collective transfer, collective wait, host gap) of A and B, and B - A; with several "
    "repeats of a level in a run, their mean. The terms add up to the per-token time in each run (means over the "
    "same decode pairs add), so their differences add up to the difference of the per-token times. Delivery (the "
    "client's p50 over requests of client - engine time per token) is compared beside them, outside that sum. "
    f"Intervals: each repeat is resampled on its own (block bootstrap, {REPLICATES} draws): where the split rests "
    "on whole requests (one stream at a time) each request's decode steps are one block, otherwise runs of "
    "consecutive decode steps as long as one request's decode (decode steps are autocorrelated: a slow patch lasts "
    "many steps); each draw recomputes the statistics exactly as attribute does; the spread is scaled by K/(K-1) "
    "for K blocks and given t-like tails (Welch's df). With several repeats on a side, the spread between repeats "
    "beyond their own (pooled over both runs) is added as a multivariate t with repeats - 2 df. B - A per draw "
    f"gives the spread of the difference; the intervals of one level form one simultaneous {LEVEL:.0%} band "
    "(max-|t| over the level's differences), so all of a level's statements hold together. A difference whose "
    "interval excludes 0 is resolved ('changed by'); otherwise 'no change that this comparison can resolve'. "
    "Spread between runs that no run shows within itself (with one repeat per run: a restart, a neighbour "
    "arriving) is not in the intervals. The host's load is measured instead: each level carries the ranks' CPU "
    "wait per engine step (the hook: schedstat run_delay of each worker's step thread, summed over ranks); a "
    "resolved difference whose interval reaches within the change of that figure of 0, in a direction the "
    "load could move it, is marked as possibly the host's load and is not called a change. So is one within "
    "the drift between runs where a run of A again after B was given (--again: A again less A, per term)."
)


def compare_runs(
    run_a: str | Path,
    run_b: str | Path,
    allow_different_models: bool = False,
    fail_if_slower: float | None = None,
    run_again: str | Path | None = None,
) -> Comparison:
    """`run_again`: a run of A's configuration made after B (A, B, A again): what it differs from A by is the
    drift between runs, allowed for in every resolved difference (compare/levels.py _host_load)."""
    a, b = load_run(run_a, "RUN_A"), load_run(run_b, "RUN_B")
    kind = check_pair(a, b, allow_different_models)
    cond = conditions.diff(a, b)
    again = _again(a, b, cond, run_again) if run_again is not None else None
    ga = _by_concurrency(again.attribution.levels) if again is not None else {}
    levels, only_a, only_b, notes = [], [], [], []
    if a.attribution is not None and b.attribution is not None:
        sa, why_a = a.samples()
        sb, why_b = b.samples()
        why = f"A: {why_a}" if why_a else f"B: {why_b}" if why_b else None
        ca, cb = _by_concurrency(a.attribution.levels), _by_concurrency(b.attribution.levels)
        for c in sorted(set(ca) | set(cb)):
            x, y = ca.get(c, []), cb.get(c, [])
            if not x or not y:
                (only_a if not y else only_b).append(f"C={c} (measured in {'A' if not y else 'B'} only)")
                continue
            xs = [lv for lv in x if lv.attributed and not lv.incomplete]
            ys = [lv for lv in y if lv.attributed and not lv.incomplete]
            for side, all_, split, lst in (("A", x, xs, only_a), ("B", y, ys, only_b)):
                for lv in all_:
                    if not lv.attributed:
                        lst.append(f"C={c} repeat {lv.repeat} (no split in {side}: {lv.note or 'not attributed'})")
                    elif lv.incomplete:  # judge/complete.py: its figures describe something other than C streams
                        lst.append(f"C={c} repeat {lv.repeat} (incomplete in {side}: {lv.incomplete})")
            if not xs or not ys:
                continue
            key = lambda lv: (lv.concurrency, lv.repeat)  # noqa: E731
            gs = [lv for lv in ga.get(c, []) if lv.attributed and not lv.incomplete]
            if again is not None and not gs:
                notes.append(f"C={c}: the run given as --again has no complete level C={c}: no drift measured there")
            lvd = level_diff(xs, ys, [sa.get(key(lv)) for lv in xs], [sb.get(key(lv)) for lv in ys], why, gs or None)
            levels.append(lvd)
    elif a.attribution is not None or b.attribution is not None:
        one = "A" if a.attribution is not None else "B"
        notes.append(f"only {one} has an attribution: the measured levels are not compared, the predictions are")
    model = model_diff(a.predict, b.predict) if a.predict is not None and b.predict is not None else None
    head = verdict_level(levels)
    text = verdict(head, model.statement if model and not levels else None)
    cmp = Comparison(
        run_a=str(run_a),
        run_b=str(run_b),
        kind=kind,
        levels=levels,
        only_in_a=only_a,
        only_in_b=only_b,
        conditions=cond,
        model=model,
        verdict=text,
        caveat=caveat(head, again is not None),
        verdict_level=head.concurrency if head else None,
        method=METHOD,
        notes=notes,
        run_again=str(run_again) if run_again is not None else None,
    )
    if fail_if_slower is not None:
        cmp.gate = gate(levels, fail_if_slower)
    return cmp


def _again(a, b, cond_ab: list, path: str | Path):
    """The `--again` run: measured, another directory than A's and B's, of A's model and A's configuration,
    else an InputError naming what differs (`cond_ab`: conditions.diff of A and B). Its configuration: every condition compare reads that both it and A
    hold (a support file such as plan.json or topo.json in one only is no difference), but the versions, the
    hardware and what each level measured (C=...); and on every condition where A and B differ (the change),
    A's value."""
    g = load_run(path, "--again")
    if g.attribution is None:
        raise InputError(
            f"--again {path}", "has no attribution (attribution/summary.json)", "a run by `tpcomm attribute`"
        )
    for other in (a, b):
        if Path(g.path).resolve() == Path(other.path).resolve():
            raise InputError(
                f"--again {path}",
                f"is {other.label} itself",
                "another run of RUN_A's configuration, made after RUN_B (A, B, A again)",
            )
    check_pair(a, g, allow_different_models=False)
    ab = {(d.section, d.name) for d in cond_ab if not d.same and d.a is not None and d.b is not None}
    differ = [
        f"{d.name} {d.a} vs {d.b}"
        for d in conditions.diff(a, g)
        if not d.same
        and d.a is not None
        and d.b is not None
        and not d.name.startswith("C=")
        and (d.section not in ("versions", "hardware") or (d.section, d.name) in ab)
    ]
    if differ:
        raise InputError(
            f"--again {path}",
            "is not a run of A's configuration (" + "; ".join(differ[:4]) + ")",
            "a run of RUN_A's configuration made after RUN_B (A, B, A again)",
        )
    return g


def _by_concurrency(levels) -> dict[int, list]:
    out: dict[int, list] = {}
    for lv in sorted(levels, key=lambda lv: (lv.concurrency, lv.repeat)):
        out.setdefault(lv.concurrency, []).append(lv)
    return out
