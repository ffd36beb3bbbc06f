"""From a run directory's hook records and client timings to
attribution/steps.parquet, attribution/steps_by_rank.parquet and
attribution/summary.json. Reads only the run directory (plus the model config
for the cross-check), so an attribution can be redone later on a laptop:
`analyse_run_dir("runs/r1")`.

Units: *_us microseconds, *_ms milliseconds, t_*_ns wall clock.
"""

from __future__ import annotations

import pandas as pd

from tpcomm.attribute.align import align, alignment_quality
from tpcomm.attribute.crosscheck import compare, observed_per_step, planned_per_step, tp_from_records
from tpcomm.attribute.server import ENABLE_HINT
from tpcomm.attribute.split import assign_levels, decode_steps, level_split, rank_steps, stream_closure
from tpcomm.rundir import RunDir

METHOD = (
    "Hook records (one per collective call per rank, wall-clock entry/exit) are aligned across the ranks of a "
    "group: one collective instance = same step and call_idx. transfer = the instance's minimum duration over "
    "ranks (the time all ranks spend in it together); wait = each rank's duration minus that minimum (rank skew); "
    "compute = the rank's engine step time minus its collective time. Per token: trimmed means (p5..p95 of step "
    "time) over the level's decode steps, averaged over ranks. host_overhead = mean over tokens of (client "
    "inter-token latency - duration of the engine step that emitted the token, found by wall clock; a mean because "
    "bursty token delivery moves time between gaps but keeps their sum). closure_pct = (compute + transfer + wait "
    "+ host_overhead - client median ITL) / client median ITL; closure_mean_pct the same against the mean ITL; closure_stream_pct = (mean start-to-start period of engine steps - C / "
    "client output tok/s) / the latter, which bursty token delivery cannot distort. Ceilings: sequences "
    "per decode step / transfer time (comm_only), / compute time (compute_only). On CPU collectives are timed "
    "host-synchronously (timing column); on CUDA by events in the graph or sampled eager replays."
)


def windows_from_requests(req: pd.DataFrame) -> list[dict]:
    r = req[req["in_stats"]] if "in_stats" in req.columns else req
    out = []
    for (c, rep), g in r.groupby(["concurrency", "repeat"], sort=False):
        out.append({"concurrency": int(c), "repeat": int(rep), "t_start_ns": int(g["t_start_ns"].min()),
                    "t_end_ns": int(g["t_end_ns"].max())})
    return out


def analyse_run_dir(path: str | RunDir, model_source: str | None = None, hook_status: dict | None = None,
                    notes: list[str] | None = None, conditions: dict | None = None) -> dict:
    rd = path if isinstance(path, RunDir) else RunDir(path, create=False)
    req = rd.read_table("load/requests.parquet")
    tokens = rd.read_table("load/tokens.parquet")
    levels = rd.read_json("load/levels.json", [])
    coll, steps = rd.read_table("hook/collectives.parquet"), rd.read_table("hook/steps.parquet")
    hook_status = hook_status if hook_status is not None else rd.read_json("hook/status.json")
    if req is not None and "in_stats" in req.columns:
        tokens = tokens[tokens["request_id"].isin(req.loc[req["in_stats"], "request_id"])]
    windows = windows_from_requests(req) if req is not None else []
    summary = {"levels": [], "plugin": coll is not None and steps is not None, "method": METHOD,
               "conditions": dict(conditions or (levels[0].get("conditions", {}) if levels else {})),
               "notes": list(notes or [])}
    if coll is None or steps is None or coll.empty or steps.empty:
        summary["plugin_note"] = ENABLE_HINT.format(model=summary["conditions"].get("model_root") or "MODEL", tp="N")
        for lv in levels:
            summary["levels"].append({"concurrency": lv["concurrency"], "repeat": lv["repeat"],
                                      "itl_ms_p50": lv.get("itl_ms_p50"), "per_token_ms": None,
                                      "note": "not measured: no hook records (plugin off)"})
        rd.write_json("attribution/summary.json", summary)
        return summary

    aligned = align(coll)
    by_rank = assign_levels(rank_steps(aligned, steps), windows)
    dsteps = decode_steps(by_rank)
    rd.write_table("attribution/steps_by_rank.parquet", by_rank)
    rd.write_table("attribution/steps.parquet", dsteps)
    tp = tp_from_records(coll, hook_status)
    summary["conditions"].update(tp=tp, ranks=sorted(int(r) for r in coll["rank"].unique()),
                                 backends=sorted(coll["backend"].unique().tolist()),
                                 timing=sorted(coll["timing"].unique().tolist()))
    summary["alignment"] = alignment_quality(aligned)
    aligned_lv = assign_levels(aligned, windows)
    ref_rank = int(by_rank["rank"].min()) if not by_rank.empty else 0
    plans: dict = {}
    for lv in levels:
        c, rep = lv["concurrency"], lv["repeat"]
        st = dsteps[(dsteps["concurrency"] == c) & (dsteps["repeat"] == rep)]
        al = aligned_lv[(aligned_lv["concurrency"] == c) & (aligned_lv["repeat"] == rep)]
        tok = tokens[(tokens["concurrency"] == c) & (tokens["repeat"] == rep)]
        ref = by_rank[(by_rank["concurrency"] == c) & (by_rank["repeat"] == rep) & (by_rank["rank"] == ref_rank)]
        sp = level_split(st, al, tok, ref, lv.get("itl_ms_p50"), lv.get("itl_ms_mean"))
        sp.update(stream_closure(ref, c, lv.get("output_tok_per_s")))
        obs = observed_per_step(al, st)
        if obs["batch"] not in plans:
            plans[obs["batch"]] = planned_per_step(model_source, tp, obs["batch"])
        planned, plan_note, sites = plans[obs["batch"]]
        cc = compare(obs, planned, plan_note)
        for site in sp.get("top_sites") or []:
            site["plan_sites"] = sites.get((site["group"], site["op"], int(site["bytes"])), [])
        summary["levels"].append({"concurrency": c, "repeat": rep, "itl_ms_p50": lv.get("itl_ms_p50"),
                                  "itl_ms_mean": lv.get("itl_ms_mean"), "itl_burst_pct": lv.get("itl_burst_pct"), **sp,
                                  "collectives_per_step": cc})
        if (lv.get("itl_burst_pct") or 0) > 10:
            summary["levels"][-1]["note"] = (
                f"the client received {lv['itl_burst_pct']:.0f}% of tokens in bursts (the server's output loop was "
                "starved): host_overhead and closure are not meaningful at this level; compute/transfer/wait are")
        if cc["match"] is False:
            summary["notes"].append(f"C={c}: collectives per decode step differ from the plan: {cc['detail']}")
    rd.write_json("attribution/summary.json", summary)
    return summary
