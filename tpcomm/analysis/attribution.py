"""From a run directory's hook records and client timings to
attribution/steps.parquet, attribution/steps_by_rank.parquet and
attribution/summary.json (`tpcomm.rundir.results.Attribution`: one typed LevelSplit per level, the measured
Verdict at the headline level). Reads only the run directory (plus the model config for the
cross-check), so an attribution can be redone later on a laptop: `analyse_run_dir("runs/r1")`, or
`tpcomm attribute --reanalyse runs/r1`. Definitions: split.py (the terms), pairing.py and closure.py
(the client side and the closure).

Units: *_us microseconds, *_ms milliseconds, t_*_ns wall clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.analysis import clocks, coverage, delivery, levers, pairing, profile_levels, serverclock, specdecode
from tpcomm.analysis.align import align, alignment_quality
from tpcomm.analysis.closure import client_figures, closure, closure_text, find_stalls
from tpcomm.analysis.crosscheck import (
    SERVER,
    compare,
    observed_per_step,
    plan_config,
    planned_per_step,
    pp_from_records,
    tp_from_records,
)
from tpcomm.analysis.levelsplit import level_split
from tpcomm.analysis.split import assign_levels, decode_steps, engine_split, rank_steps, top_sites
from tpcomm.analysis.timeline import one_step_timeline
from tpcomm.judge import bottleneck, complete, definitions
from tpcomm.judge.speaks import level_that_speaks
from tpcomm.rundir import contract as C
from tpcomm.rundir.contract import SchemaError
from tpcomm.rundir.documents import LoadLevel
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution, CpuWait, DeliveryTerm, HostLoad, LevelSplit, ServerClock, Site

METHOD = (
    "One clock, one window, one statistic per level. Window: the level's steady window (from the moment all C "
    "clients are busy to the moment the first runs out of work; the whole round at C=1). Hook records (one per "
    "collective call per rank) are aligned across the ranks of a group: one collective instance = same step and "
    "call_idx; transfer = the instance's minimum duration over ranks, wait = each rank's duration minus that "
    "minimum; compute = the rank's step time minus its collective time. The engine's per-token time = the mean "
    "period of the decode steps (each = the host gap after the step before it + the step: from the end of the step "
    "that made the previous token to the end of its own), "
    "so the four means add up to it exactly, per rank and averaged over ranks; prefill and mixed steps and the "
    "idle time around them are counted apart. Where streams run one at a time (C=1) the decode steps are those of "
    "the requests the closure compares. Closure, per request: each request's engine time per token for its own "
    "decode steps against its client TPOT, p50 over the same requests on both sides (paired by prefill segments at "
    "C=1, by the client's token times above); a stall's window (the tokens it held back and released at once) is "
    "left out of both sides of its request; streams the API server held back whole, or whose stall windows hold "
    "most of their tokens, are named and compared on neither side. Delivery = p50 of the paired differences with its order-statistic "
    "interval. Sampled CUDA-graph timing: transfer and wait are means over the steps that carry records."
)


def steady_window(r: pd.DataFrame, concurrency: int) -> tuple[int, int]:
    """From the moment all C clients are busy (the C-th start) to the moment the first one has no more work
    (the (N - C + 1)-th end: each client's last request is one of the final C); the whole round at C=1."""
    starts, ends = np.sort(r["t_start_ns"].to_numpy()), np.sort(r["t_end_ns"].to_numpy())
    if concurrency > 1 and len(starts) > concurrency:
        lo, hi = int(starts[concurrency - 1]), int(ends[len(ends) - concurrency])
        if hi > lo:
            return lo, hi
    return int(starts[0]), int(ends[-1])


def windows_from_requests(req: pd.DataFrame) -> list[dict]:
    r = req[req["in_stats"].astype(bool)] if "in_stats" in req.columns else req
    r = r[r["ok"].astype(bool)] if "ok" in r.columns and r["ok"].any() else r
    out = []
    for (c, rep), g in r.groupby(["concurrency", "repeat"], sort=False):
        lo, hi = steady_window(g, int(c))
        out.append({"concurrency": int(c), "repeat": int(rep), "t_start_ns": lo, "t_end_ns": hi})
    return out


def _placed(windows: list[dict], levels: list[LoadLevel], same_machine: bool) -> dict:
    """(concurrency, repeat) -> (the level's window on the server's clock, ServerClock): serverclock.place with
    the bound the client measured at the level's recording start (load/levels.json `server_clock`)."""
    bounds = {(lv.concurrency, lv.repeat): lv.server_clock for lv in levels}
    for i, lv in enumerate(levels):  # a hand-edited bound: one line naming it, not a traceback
        for k in ("lo_ms", "hi_ms"):
            v = (lv.server_clock or {}).get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v)):
                raise SchemaError(C.LOAD_LEVELS, f"holds {v!r}, not a number of ms", f"{i}.server_clock.{k}")
    return {
        (w["concurrency"], w["repeat"]): serverclock.place(
            w, bounds.get((w["concurrency"], w["repeat"])), same_machine, outer=w["concurrency"] == 1
        )
        for w in windows
    }


def on_one_clock(coll: pd.DataFrame, steps: pd.DataFrame, hook_status: dict | None, align_clocks: bool = True):
    """(aligned collectives, steps, nodes, offsets): ranks on other clocks (another machine, or a per-process
    clock) put onto rank 0's, from the collectives' exit times (clocks.py); the durations, and so the split, do
    not depend on it."""
    aligned = align(coll)
    nodes = clocks.ranks_nodes(hook_status)
    offsets = clocks.decide(clocks.estimate(aligned), nodes)
    if not align_clocks:  # each rank on its own clock (a check that the split does not depend on them)
        offsets = {r: {**o, "applied": False, "why": "clock alignment switched off"} for r, o in offsets.items()}
    if any(o["applied"] for o in offsets.values()):
        times = ("t_start_ns", "t_end_ns", "gpu_start_ns", "gpu_end_ns")
        coll, steps = clocks.apply(coll, offsets, times), clocks.apply(steps, offsets, times)
        aligned = align(coll)
    return aligned, steps, nodes, offsets


def analyse_run_dir(
    path: str | RunDir,
    model_source: str | dict | None = None,
    hook_status: dict | None = None,
    notes: list[str] | None = None,
    conditions: dict | None = None,
    align_clocks: bool = True,
) -> Attribution:
    rd = path if isinstance(path, RunDir) else RunDir(path, create=False)
    req = rd.read_table(C.LOAD_REQUESTS)
    tokens = rd.read_table(C.LOAD_TOKENS)
    levels: list[LoadLevel] = rd.read(C.LOAD_LEVELS) or []
    coll, steps = rd.read_table(C.HOOK_COLLECTIVES), rd.read_table(C.HOOK_STEPS)
    step_reqs = rd.read_table(C.HOOK_STEP_REQUESTS) if rd.exists(C.HOOK_STEP_REQUESTS) else None
    source = "hook"
    if (steps is None or steps.empty) and (tr := profile_levels.trace_records(rd)) is not None:
        coll, steps, source = *tr, "trace"  # no plugin: the profiled level's torch-profiler traces
    hook_status = hook_status if hook_status is not None else rd.read_json(C.HOOK_STATUS)
    if req is not None and "in_stats" in req.columns:
        # astype(bool): a level stopped before its first request ends leaves an empty object column, which
        # pandas would take for a list of column names
        req = req[req["in_stats"].astype(bool)]
        tokens = tokens[tokens["request_id"].isin(req["request_id"])]
    windows = windows_from_requests(req) if req is not None else []
    # The plan is made from --model-config when given, else from the config the server's hook reported.
    plan_src, plan_prov = plan_config(model_source, hook_status)
    plan_label = (
        f"the {SERVER} model config" if plan_prov["source"] == SERVER else plan_prov.get("path") or "the config given"
    )
    plugin_on = bool(hook_status and hook_status.get("enabled", True))
    # Step records are what the split needs; TP 1 issues no collectives (transfer and wait are then 0).
    has_records = coll is not None and steps is not None and not steps.empty
    cond = dict(conditions or (levels[0].conditions or {} if levels else {}))
    att = Attribution(
        source=source,
        plugin=(has_records and source == "hook") or plugin_on,
        plugin_note=None,
        method=METHOD,
        conditions=cond,
        plan_config=plan_prov,
        windows=windows,
        notes=list(notes or []),
        levels=[],
    )
    att.not_timed = coverage.not_timed(hook_status)
    # A timing path the split needs that the hook switched off (failsafe.py): no level's split stands.
    lost = coverage.lost_terms(hook_status)
    if source == "trace":
        att.plugin_note = definitions.enable_hint(cond.get("model_root") or "MODEL")
        att.notes.append(profile_levels.source_note(levels))
    if not has_records:
        if not plugin_on:
            att.plugin_note = definitions.enable_hint(cond.get("model_root") or "MODEL")
        for lv in levels:
            problem = lv.hook_problem or lv.worker_problem
            why = ("not attributed: " if problem else "not measured: ") + _no_records_reason(lv, plugin_on)
            why = lost if lost and not problem else why
            att.levels.append(_unattributed(lv, why, None, {}))
            att.levels[-1].incomplete = complete.level_incomplete(lv, None)
        write_attribution(rd, att)
        return att

    aligned, steps, nodes, offsets = on_one_clock(coll, steps, hook_status, align_clocks)
    # Each level's window onto the server's clock, where the client bounded it (serverclock.py)
    placed = _placed(windows, levels, serverclock.client_beside(nodes, att.conditions))
    windows = att.windows = [w for w, _ in placed.values()]
    att.nodes = {str(r): n for r, n in sorted(nodes.items())}
    att.clocks = {str(r): o for r, o in sorted(offsets.items())}
    # Analysis once: the aligned records and the one-step timeline the report draws are written here.
    rd.write_table(C.ATTR_COLLECTIVES, aligned)
    timeline = one_step_timeline(aligned, steps)
    if timeline is not None:
        timeline["clock_uncertainty_us"] = clocks.entry_skew_separable(offsets)
        rd.write_json(C.ATTR_TIMELINE, timeline)
    every_step = rank_steps(aligned, steps)
    by_rank = assign_levels(every_step, windows)
    dsteps = decode_steps(by_rank)
    rd.write_table(C.ATTR_STEPS_BY_RANK, by_rank)
    rd.write_table(C.ATTR_STEPS, dsteps)
    tp, pp = tp_from_records(coll, hook_status), pp_from_records(coll)
    att.conditions.update(
        tp=tp,
        ranks=sorted(int(r) for r in coll["rank"].unique()),
        backends=sorted(coll["backend"].unique().tolist()),
        timing=sorted(coll["timing"].unique().tolist()),
    )
    out_rank = pairing.output_rank(att.conditions["ranks"], tp)
    att.alignment = alignment_quality(aligned)
    aligned_lv = assign_levels(aligned, windows)
    plans: dict = {}
    for lv in levels:
        c, rep = lv.concurrency, lv.repeat
        st = dsteps[(dsteps["concurrency"] == c) & (dsteps["repeat"] == rep)]
        al = aligned_lv[(aligned_lv["concurrency"] == c) & (aligned_lv["repeat"] == rep)]
        rows = by_rank[(by_rank["concurrency"] == c) & (by_rank["repeat"] == rep)]
        obs = observed_per_step(al, st)
        if obs["batch"] not in plans:
            plans[obs["batch"]] = planned_per_step(plan_src, tp, obs["batch"], plan_label, pp=pp)
        planned, plan_note, sites = plans[obs["batch"]]
        unprofiled = source == "trace" and not lv.profiled
        if skip := (profile_levels.NOT_PROFILED if unprofiled else _no_crosscheck_reason(lv, obs)):
            # No verdict from records that do not cover the level: "observed 0/step" is not a MISMATCH.
            cc = compare(obs, None, skip)
        else:
            cc = compare(obs, planned, plan_note)
        cc["plan_config"] = plan_prov["source"]
        win = next((w for w in windows if (w["concurrency"], w["repeat"]) == (c, rep)), None)
        if lost and not (lv.hook_problem or lv.worker_problem):
            att.levels.append(_unattributed(lv, lost, win, cc, source))
            att.levels[-1].incomplete = complete.level_incomplete(lv, None)
            continue
        if lv.hook_problem or lv.worker_problem or not obs["steps"]:
            # Another client started or stopped recording mid-level, a TP worker died or stopped, or the run
            # ended before the level's records were pulled: the records do not cover the window, and nothing
            # of a split stays.
            why = f"not measured: {profile_levels.NOT_PROFILED}" if unprofiled else None
            why = why or f"not attributed: {_no_records_reason(lv, True)}"
            att.levels.append(_unattributed(lv, why, win, cc, source))
            att.levels[-1].incomplete = complete.level_incomplete(lv, None)
            continue
        lreq = req[(req["concurrency"] == c) & (req["repeat"] == rep)] if req is not None else pd.DataFrame()
        tok = tokens[(tokens["concurrency"] == c) & (tokens["repeat"] == rep)]
        sclock = placed[(c, rep)][1] if (c, rep) in placed else None
        # the delays need one clock: a bound that excludes 0 says the two are not one, boot ids or not
        same = delivery.one_clock(nodes, att.conditions) and not (sclock and sclock.resolved)
        mine = level_step_requests(step_reqs, lreq)
        doc, window = _level(
            lv, win, rows, al, st, lreq, tok, cc, sites, same, source, mine, every_step, out_rank, sclock
        )
        # Other traffic is judged over the whole window's decode steps: at C=1 the split rests on the requests
        # whose steps paired cleanly, and another client's prefill is what breaks a pairing, so the split's own
        # steps showed 1.00 sequences per step beside 90 steps of 2 in the window (2026-12-06); and step by step,
        # not by the mean alone (complete.py: 184 steps of 3 at C=2 averaged 1.98, 2026-12-07)
        seqs = [x for x in (doc.seqs_per_step, window.get("seqs_per_step")) if x is not None]
        doc.incomplete = complete.level_incomplete(lv, max(seqs) if seqs else None, window.get("seqs_counts"))
        doc.server_clock = sclock
        if sclock is not None and sclock.placed:
            att.notes.append(f"C={c} repeat {rep}: {sclock.text()}")
        att.levels.append(doc)
        if text := closure_text(c, rep, doc.closure, doc.stalls, doc.delivery_term):
            att.notes.append(text)
        if doc.spec_decode is not None:  # the headline's figures are per engine step: said where they are read
            att.notes.append(f"C={c}: {specdecode.flag(doc.spec_decode)}")
        if cc["match"] is False:
            att.notes.append(f"C={c}: collectives per decode step differ from the plan: {cc['detail']}")
    head = _headline(att.levels)
    if head is not None:
        att.headline = {"concurrency": head.concurrency, "repeat": head.repeat}
        att.verdict = bottleneck.measured(head.per_token_ms)
    write_attribution(rd, att)
    return att


def client_side(
    rows: pd.DataFrame,
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    concurrency: int,
    same_clock: bool = False,
    step_reqs: pd.DataFrame | None = None,
    every_step: pd.DataFrame | None = None,
    out_rank: int | None = None,
    server_clock: ServerClock | None = None,
) -> dict:
    """One level's client side beside its engine rows (rank_steps rows of the level, all kinds): the engine's
    split over the whole window, stalls, each request paired with its own steps (pairing.py), the closure and
    delivery over the compared requests (closure.py), the delivery term over every request paired with its
    steps (delivery.py), and the split again over the requests the level's figures rest on: at C=1 those of
    the delivery term (the five terms then add up to the client's time over the same requests), else those
    the closure compared when it is judged. `same_clock`: client and server on one machine. `step_reqs`: which
    of the level's requests each step served (hook/step_requests.parquet): above C=1 the pairing then rests on
    them, not on the client's clock, and on the rows of their own steps (from `every_step`, rank_steps rows of
    the whole run, where given: a level's window leaves out its closed loop's tail, where fewer than C streams
    ran, yet the requests of the tail made tokens there too). `out_rank`: the rank whose step end makes a token
    (pairing.output_rank; None: the mean over ranks). `server_clock`: how the level's window was placed on
    the server's clock (serverclock.py): where its bound excludes 0 the two clocks are apart, and the
    client-times pairing is refused; its upper bound lets the early-token check run off one clock."""
    clock_apart = server_clock.text() if server_clock is not None and server_clock.resolved else None
    whole = engine_split(rows)
    stalls = find_stalls(tokens, whole["engine_ms_per_token"])
    ok = requests[requests["ok"]] if "ok" in requests.columns else requests
    spans = pairing.client_spans(ok, tokens, whole["engine_ms_per_token"])
    by_ids = concurrency != 1 and step_reqs is not None and not step_reqs.empty
    if concurrency == 1:
        pairs, problem = pairing.by_prefill(rows, spans, ok, out_rank)
        how = "prefill segments"
    elif by_ids:
        if every_step is not None:
            rows_ids = every_step[every_step["step"].isin(step_reqs["step"].unique())]
        else:
            rows_ids = rows
        pairs, problem = pairing.by_request_steps(rows_ids, step_reqs, spans, ok, out_rank), None
        how = "request ids"
    else:
        pairs, problem = pairing.by_client_times(rows, spans, out_rank), None
        how = "client times"
        if clock_apart:  # the client's times against the engine's step ends: not on two clocks apart
            pairs = pairs.assign(engine_ms_per_token=np.nan, paired=False, why="not paired")
            problem = f"pairing by the client's token times needs one clock: {clock_apart}"
    cz, dl, compared = closure(pairs, concurrency, how, problem)
    held = sorted(int(r) for r in spans.loc[~spans["observed"], "request_id"])
    split, split_requests = whole, None
    delivery_rows: dict = {}
    if cz.judged and compared and concurrency == 1:
        own = {s for ids in pairs.loc[pairs["request_id"].isin(compared), "steps"] for s in ids}
        split, split_requests = engine_split(rows[rows["step"].isin(own)]), sorted(compared)
    if concurrency != 1 and not by_ids:
        dt = DeliveryTerm.not_measured(
            "which engine step made each token is known one stream at a time (C=1), or from the request ids the "
            "hook records (a hook that records them)"
        )
    elif problem:
        dt = DeliveryTerm.not_measured(f"requests could not be paired with the engine's steps: {problem}")
    else:
        src = rows_ids if by_ids else rows
        first: dict = {}
        per_req, _ = delivery.token_delays(
            pairs, src, tokens, ok, token_steps=by_ids, earliest=first, out_rank=out_rank
        )
        mine = {int(r) for r, _, _ in per_req}
        own = {s for ids in pairs.loc[pairs["request_id"].isin(mine), "steps"] for s in ids}
        five = engine_split(src[src["step"].isin(own)]) if own else whole
        dt = delivery.delivery_term(
            per_req,
            five["engine_ms_per_token"],
            concurrency,
            same_clock,
            pairing=how,
            earliest=first,
            split_terms=five["per_token_ms"],
            offset_hi_ms=server_clock.hi_ms if server_clock is not None else None,
        )
        if dt.measured:
            delivery_rows = dict(zip((int(r) for r, _, _ in per_req), delivery.request_sums(per_req)))
        if dt.measured and five["per_token_ms"] and concurrency == 1:
            split, split_requests = five, (sorted(mine) if own else None)
    return {
        "delivery_term": dt,
        # request id -> (client ms, delivery ms, tokens - 1) of the delivery term's requests (compare resamples)
        "delivery_rows": delivery_rows,
        "whole": whole,
        "split": split,
        # the requests whose own steps the split rests on (None: the whole window); compare resamples these
        "split_requests": split_requests,
        "stalls": stalls,
        "pairs": pairs,
        "closure": cz,
        "delivery": dl,
        "compared": compared,
        "client": client_figures(requests, tokens, held, stalls),
    }


def _level(
    lv,
    win,
    rows,
    al,
    st,
    lreq,
    tok,
    cc,
    sites,
    same_clock=False,
    source="hook",
    step_reqs=None,
    every_step=None,
    out_rank=None,
    server_clock=None,
) -> tuple[LevelSplit, float | None]:
    """One level's split, client side and closure (see the module docstring and closure.py), and the mean
    sequences per decode step over the level's whole window."""
    c, rep = lv.concurrency, lv.repeat
    cs = client_side(rows, lreq, tok, c, same_clock, step_reqs, every_step, out_rank, server_clock)
    whole, sp = cs["whole"], cs["split"]
    flags = []
    if (lv.itl_burst_pct or 0) > 10:
        flags.append(
            f"the client received {lv.itl_burst_pct:.0f}% of tokens in bursts: its ITL p50 is not a per-token time"
        )
    sd = specdecode.spec_decode(rows, cs["pairs"], lreq, c, sp, step_reqs)
    if sd is not None:
        flags.append(specdecode.flag(sd))
    top = top_sites(al, st)
    for s in top:
        s["plan_sites"] = sites.get((s["group"], s["op"], int(s["bytes"])), [])
    doc = level_split(
        c,
        rep,
        source,
        win,
        sp,
        sp.get("note"),
        steps_in_window=whole["steps_in_window"],
        client=cs["client"],
        stalls=cs["stalls"],
        closure=cs["closure"],
        delivery=cs["delivery"],
        top_sites=[Site(**s) for s in top],
        collectives_per_step=cc,
        flags=flags,
        cpu_wait=CpuWait(**lv.cpu_wait) if lv.cpu_wait else None,
        delivery_term=cs["delivery_term"],
        host_load=HostLoad(**lv.host_load) if lv.host_load else None,
        spec_decode=sd,
    )
    return doc, whole


def level_step_requests(step_reqs: pd.DataFrame | None, requests: pd.DataFrame) -> pd.DataFrame | None:
    """The rows of hook/step_requests.parquet for one level's requests (None where the hook recorded none)."""
    if step_reqs is None or step_reqs.empty or requests.empty:
        return None
    return step_reqs[step_reqs["request"].isin(requests["request_id"])]


def _unattributed(lv: LoadLevel, why: str, win: dict | None, cc: dict, source: str = "hook") -> LevelSplit:
    return level_split(lv.concurrency, lv.repeat, source, win, None, why, collectives_per_step=cc)


def _headline(levels: list[LevelSplit]) -> LevelSplit | None:
    """The level the headline comes from (judge/speaks.py): the lowest concurrency with a split that is
    complete (judge/complete.py: no failed request, no other client or traffic), its median repeat."""
    return level_that_speaks(
        levels,
        concurrency=lambda x: x.concurrency,
        figure=lambda x: x.engine_ms_per_token if x.attributed and x.per_token_ms is not None else None,
        incomplete=lambda x: x.incomplete,
    )


def _no_records_reason(lv: LoadLevel, plugin_on: bool) -> str:
    if problem := lv.worker_problem or lv.hook_problem or lv.records_problem:
        return problem
    if plugin_on:
        return "no hook records for this level (the run ended before they were pulled)"
    return "no hook records (plugin off)"


def _no_crosscheck_reason(lv: LoadLevel, obs: dict) -> str | None:
    """Why this level's collectives are not compared with the plan, or None to compare them."""
    if lv.rank_died or lv.worker_problem:
        why = lv.worker_problem or lv.hook_problem or "a TP rank died during this level"
        return f"{why}: this level's records are incomplete"
    if lv.hook_problem:  # another client restarted or stopped the recording mid-level
        return f"{lv.hook_problem}: this level's records do not cover it"
    if not obs["steps"]:
        return (
            "no hook records of decode steps for this level ("
            + (lv.records_problem or "the run ended before they were pulled")
            + ")"
        )
    return None


def write_attribution(rd: RunDir, att: Attribution) -> None:
    """attribution/summary.json, then levers.json from it and the run directory's other inputs (levers.py)."""
    rd.write_json(C.ATTR_SUMMARY, att.to_json())
    levers.store(rd)
