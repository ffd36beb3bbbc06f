"""From a run directory's hook records and client timings to
attribution/steps.parquet, attribution/steps_by_rank.parquet and
attribution/summary.json. Reads only the run directory (plus the model config
for the cross-check), so an attribution can be redone later on a laptop:
`analyse_run_dir("runs/r1")`.

summary.json, per level (split_format 2): window (the steady window, wall clock), engine_ms_per_token and
per_token_ms {compute, transfer, wait, host_gap} (sum = engine_ms_per_token), shares_pct, by_rank (the same
per rank), decode_pairs, sampled_pairs_share, steps_in_window {kind: count}, seqs_per_step, ceilings,
client {tpot_ms_p50, tpot_ms_mean, tpot_held_ms_p50, tpot_judged_ms_p50, stalled_requests, itl_ms_p50, itl_ms_mean}, delivery_ms, delivery {ms, lo_ms, hi_ms, coverage, requests, engine_tpot_ms, resolved}, stalls, closure, top_sites,
collectives_per_step. See split.py and closure.py for the definitions.

Units: *_us microseconds, *_ms milliseconds, t_*_ns wall clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm import contract as C
from tpcomm.attribute.align import align, alignment_quality
from tpcomm.attribute.closure import client_side, closure_text
from tpcomm.attribute.crosscheck import (
    SERVER,
    compare,
    observed_per_step,
    plan_config,
    planned_per_step,
    tp_from_records,
)
from tpcomm.attribute.server import ENABLE_HINT
from tpcomm.attribute.split import (
    SPLIT_DERIVED,
    assign_levels,
    decode_steps,
    engine_split,
    first_interval_ms,
    rank_steps,
    top_sites,
)
from tpcomm.attribute.timeline import one_step_timeline
from tpcomm.rundir import RunDir

SPLIT_FORMAT = 2
METHOD = (
    "One clock, one window, one statistic per level. Window: the level's steady window (from the moment all C "
    "clients are busy to the moment the first runs out of work; the whole round at C=1). Hook records (one per "
    "collective call per rank, wall-clock entry/exit) are aligned across the ranks of a group: one collective "
    "instance = same step and call_idx; transfer = the instance's minimum duration over ranks (the time all ranks "
    "spend in it together), wait = each rank's duration minus that minimum (rank skew, not link speed); "
    "collective time = transfer + wait; compute = the rank's engine step time minus its collective time. The "
    "engine's per-token time = the mean start-to-start period of consecutive decode steps in the window (every "
    "running stream gets one token per step); each period = the step (compute + transfer + wait) + the host gap "
    "to the next step's start, so the four means add up to the per-token time exactly, per rank and averaged over "
    "ranks. Prefill and mixed steps and the idle time around them are not decode periods and are counted apart. "
    "With sampled collective timing (CUDA graphs) transfer and wait are means over the steps that carry records. "
    "Client side, beside it: TPOT p50/mean, held TPOT p50 (TPOT, except that a stream the API server held back "
    "whole, >= 90% of its token gaps under a tenth of the engine period, counts as (E2E - the unheld streams' "
    "fastest TTFT) / (tokens - 1)) and ITL p50/mean; delivery = held TPOT p50 over the requests without a stall - "
    "engine per-token time on TPOT's footing (API server, network, client), with the p50's distribution-free 95% "
    "interval (order statistics), called not separable from zero when the interval holds 0; stalls = token gaps longer than 20 engine periods (at least 100 ms), reported "
    "apart and in no term. Closure, compared at every level and judged at C=1: the engine per-token time on "
    "TPOT's footing (plus the prefill-to-first-decode interval once per request: (first interval + (n - 2) x "
    "per-token time) / (n - 1)) must be within 10% of the client's held TPOT p50 over the requests without a "
    "stall (client.tpot_judged_ms_p50). "
    "Ceilings: sequences per decode step / transfer time (comm_only), / compute time (compute_only). On CPU "
    "collectives are timed host-synchronously (timing column); on CUDA by events in the graph or sampled eager replays."
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
    r = req[req["in_stats"]] if "in_stats" in req.columns else req
    r = r[r["ok"]] if "ok" in r.columns and r["ok"].any() else r
    out = []
    for (c, rep), g in r.groupby(["concurrency", "repeat"], sort=False):
        lo, hi = steady_window(g, int(c))
        out.append({"concurrency": int(c), "repeat": int(rep), "t_start_ns": lo, "t_end_ns": hi})
    return out


def analyse_run_dir(
    path: str | RunDir,
    model_source: str | dict | None = None,
    hook_status: dict | None = None,
    notes: list[str] | None = None,
    conditions: dict | None = None,
) -> dict:
    rd = path if isinstance(path, RunDir) else RunDir(path, create=False)
    req = rd.read_table(C.LOAD_REQUESTS)
    tokens = rd.read_table(C.LOAD_TOKENS)
    levels = rd.read_json(C.LOAD_LEVELS, [])
    coll, steps = rd.read_table(C.HOOK_COLLECTIVES), rd.read_table(C.HOOK_STEPS)
    hook_status = hook_status if hook_status is not None else rd.read_json(C.HOOK_STATUS)
    if req is not None and "in_stats" in req.columns:
        req = req[req["in_stats"]]
        tokens = tokens[tokens["request_id"].isin(req["request_id"])]
    windows = windows_from_requests(req) if req is not None else []
    # The plan is made from --model-config when given, else from the config the server's hook reported.
    plan_src, plan_prov = plan_config(model_source, hook_status)
    plan_label = (
        f"the {SERVER} model config" if plan_prov["source"] == SERVER else plan_prov.get("path") or "the config given"
    )
    plugin_on = bool(hook_status and hook_status.get("enabled", True))
    has_records = coll is not None and steps is not None and not coll.empty and not steps.empty
    summary = {
        "levels": [],
        "plugin": has_records or plugin_on,
        "plan_config": plan_prov,
        "method": METHOD,
        "split_format": SPLIT_FORMAT,
        "windows": windows,
        "conditions": dict(conditions or (levels[0].get("conditions", {}) if levels else {})),
        "notes": list(notes or []),
    }
    if not has_records:
        if not plugin_on:
            summary["plugin_note"] = ENABLE_HINT.format(
                model=summary["conditions"].get("model_root") or "MODEL", tp="N"
            )
        for lv in levels:
            summary["levels"].append(
                {
                    "concurrency": lv["concurrency"],
                    "repeat": lv["repeat"],
                    "itl_ms_p50": lv.get("itl_ms_p50"),
                    "per_token_ms": None,
                    "engine_ms_per_token": None,
                    "note": ("not attributed: " if lv.get("hook_problem") else "not measured: ")
                    + _no_records_reason(lv, plugin_on),
                }
            )
        rd.write_json(C.ATTR_SUMMARY, summary)
        return summary

    aligned = align(coll)
    # Analysis once: the aligned records and the one-step timeline the report draws are written here.
    rd.write_table(C.ATTR_COLLECTIVES, aligned)
    timeline = one_step_timeline(aligned, steps)
    if timeline is not None:
        rd.write_json(C.ATTR_TIMELINE, timeline)
    by_rank = assign_levels(rank_steps(aligned, steps), windows)
    dsteps = decode_steps(by_rank)
    rd.write_table(C.ATTR_STEPS_BY_RANK, by_rank)
    rd.write_table(C.ATTR_STEPS, dsteps)
    tp = tp_from_records(coll, hook_status)
    summary["conditions"].update(
        tp=tp,
        ranks=sorted(int(r) for r in coll["rank"].unique()),
        backends=sorted(coll["backend"].unique().tolist()),
        timing=sorted(coll["timing"].unique().tolist()),
    )
    summary["alignment"] = alignment_quality(aligned)
    aligned_lv = assign_levels(aligned, windows)
    plans: dict = {}
    for lv in levels:
        c, rep = lv["concurrency"], lv["repeat"]
        st = dsteps[(dsteps["concurrency"] == c) & (dsteps["repeat"] == rep)]
        al = aligned_lv[(aligned_lv["concurrency"] == c) & (aligned_lv["repeat"] == rep)]
        rows = by_rank[(by_rank["concurrency"] == c) & (by_rank["repeat"] == rep)]
        sp = engine_split(rows)
        sp["top_sites"] = top_sites(al, st)
        lreq = req[(req["concurrency"] == c) & (req["repeat"] == rep)] if req is not None else pd.DataFrame()
        tok = tokens[(tokens["concurrency"] == c) & (tokens["repeat"] == rep)]
        cs = client_side(lreq, tok, sp["engine_ms_per_token"], c, first_interval_ms(rows))
        obs = observed_per_step(al, st)
        if obs["batch"] not in plans:
            plans[obs["batch"]] = planned_per_step(plan_src, tp, obs["batch"], plan_label)
        planned, plan_note, sites = plans[obs["batch"]]
        if skip := _no_crosscheck_reason(lv, obs):
            # No verdict from records that do not cover the level: "observed 0/step" is not a MISMATCH.
            cc = compare(obs, None, skip)
        else:
            cc = compare(obs, planned, plan_note)
        cc["plan_config"] = plan_prov["source"]
        for site in sp.get("top_sites") or []:
            site["plan_sites"] = sites.get((site["group"], site["op"], int(site["bytes"])), [])
        win = next((w for w in windows if (w["concurrency"], w["repeat"]) == (c, rep)), None)
        doc = {
            "concurrency": c,
            "repeat": rep,
            "window": win,
            "decode_steps": int(len(st)),
            "itl_ms_p50": lv.get("itl_ms_p50"),
            "itl_ms_mean": lv.get("itl_ms_mean"),
            "itl_burst_pct": lv.get("itl_burst_pct"),
            **sp,
            **cs,
            "collectives_per_step": cc,
        }
        if (lv.get("itl_burst_pct") or 0) > 10:
            doc["note"] = (
                f"the client received {lv['itl_burst_pct']:.0f}% of tokens in bursts: its ITL p50 is not a "
                "per-token time at this level"
            )
        if lv.get("hook_problem") or not obs["steps"]:
            # Another client started or stopped recording mid-level, a TP worker died, or the run ended before
            # the level's records were pulled: the records do not cover the window.
            # Nothing of the split stays: neither its terms nor what engine_split derives from them.
            for k in (*SPLIT_DERIVED, "top_sites"):
                doc.pop(k, None)
            doc.update(
                per_token_ms=None,
                engine_ms_per_token=None,
                by_rank=[],
                delivery_ms=None,
                delivery=None,
                closure={**doc.get("closure", {}), "judged": False, "ok": None},
                note=f"not attributed: {_no_records_reason(lv, True)}",
            )
        summary["levels"].append(doc)
        if text := closure_text(doc):
            summary["notes"].append(text)
        if cc["match"] is False:
            summary["notes"].append(f"C={c}: collectives per decode step differ from the plan: {cc['detail']}")
    rd.write_json(C.ATTR_SUMMARY, summary)
    return summary


def _no_records_reason(lv: dict, plugin_on: bool) -> str:
    if lv.get("hook_problem"):
        return lv["hook_problem"]
    if lv.get("records_problem"):
        return lv["records_problem"]
    if plugin_on:
        return "no hook records for this level (the run ended before they were pulled)"
    return "no hook records (plugin off)"


def _no_crosscheck_reason(lv: dict, obs: dict) -> str | None:
    """Why this level's collectives are not compared with the plan, or None to compare them."""
    if lv.get("rank_died"):
        return f"{lv.get('hook_problem') or 'a TP rank died during this level'}: this level's records are incomplete"
    if lv.get("hook_problem"):  # another client restarted or stopped the recording mid-level
        return f"{lv['hook_problem']}: this level's records do not cover it"
    if not obs["steps"]:
        return (
            "no hook records of decode steps for this level ("
            + (lv.get("records_problem") or "the run ended before they were pulled")
            + ")"
        )
    return None
