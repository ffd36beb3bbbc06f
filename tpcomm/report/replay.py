"""The report's "decode step replayed" section: what `tpcomm probe --replay`
measured (probe/replay.json), beside the hook's in-serving figures at C=1 when
the run directory has both. Data here, drawing in tables.py via `blocks()`.

Units: *_us microseconds, tok/s tokens per second.
"""

from __future__ import annotations

from typing import Any

from tpcomm.columns import fmt
from tpcomm.judge.speaks import level_that_speaks
from tpcomm.probe.replay_format import conditions_line
from tpcomm.report.sections import BreakdownSection, ReplayRow, ReplaySection, ReplayVsServing


def _allreduce(e: dict) -> dict | None:
    """The per-token all-reduce inside the full step (the smallest all-reduce)."""
    ars = [o for o in e.get("ops") or [] if o["timing"] == "full" and o["op"] == "all_reduce"]
    return min(ars, key=lambda o: o["bytes"]) if ars else None


def serving_c1(breakdown: BreakdownSection | None) -> dict | None:
    """The hook's C=1 figures from the breakdown section: per-token transfer + wait, and the
    per-call all-reduce time (mean over calls: the attribution keeps per-site sums)."""
    lv = level_that_speaks(
        [lv for lv in (breakdown.levels if breakdown else []) if lv.concurrency == 1],
        concurrency=lambda lv: lv.concurrency,
        figure=lambda lv: (lv.engine_ms_per_token or 0.0) if lv.per_token_ms else None,
        incomplete=lambda lv: lv.incomplete,
    )
    if lv is None:
        return None
    out: dict[str, Any] = {"transfer_ms": lv.per_token_ms.transfer, "wait_ms": lv.per_token_ms.wait}
    ars = [s for s in lv.top_sites if s.op == "all_reduce" and s.count_per_step]
    if ars:
        s = min(ars, key=lambda x: x.bytes)
        out.update(
            allreduce_bytes=s.bytes,
            allreduce_us_per_call=s.time_us_per_step / s.count_per_step,
            allreduce_backend=s.backend,
        )
    return out


def replay_data(doc: dict | None, breakdown: BreakdownSection | None) -> ReplaySection | None:
    if not doc or not doc.get("results"):
        return None
    rows = []
    for e in doc["results"]:
        t, ar = e["timings"], _allreduce(e)
        rows.append(
            ReplayRow(
                backend=e["backend"],
                mode=e["mode"],
                conditions=conditions_line(doc, e["backend"], e["mode"]),
                full_p50_us=(t.get("full") or {}).get("p50_us"),
                full_p99_us=(t.get("full") or {}).get("p99_us"),
                compute_p50_us=(t.get("compute") or {}).get("p50_us"),
                comm_p50_us=(t.get("comm") or {}).get("p50_us"),
                cost_us_per_token=e.get("interconnect_cost_us_per_token"),
                cost_us_per_token_mean=e.get("interconnect_cost_us_per_token_mean"),
                in_step_comm_us_per_token=e.get("in_step_comm_us_per_token"),
                split_us=e.get("full_step_split_us") or {},
                tok_per_s=e.get("tok_per_s") or {},
                allreduce=ar or {},
            )
        )
    serving = serving_c1(breakdown)
    compare: list[ReplayVsServing] = []
    if serving:
        for r in rows:
            ar = r.allreduce
            if ar and serving.get("allreduce_us_per_call"):
                # Means on both sides: the attribution keeps per-site sums, and a mean carries the wait tail.
                mean = ar["transfer_us_mean"] + ar["wait_us_mean"]
                compare.append(
                    ReplayVsServing(
                        f"all-reduce per call, mean incl. wait ({r.backend}, {r.mode})",
                        mean,
                        serving["allreduce_us_per_call"],
                        "us",
                        mean / serving["allreduce_us_per_call"],
                    )
                )
            tw = (serving.get("transfer_ms") or 0) + (serving.get("wait_ms") or 0)
            cost = r.cost_us_per_token_mean
            if cost is not None and tw > 0:  # attribute's per-token terms are means: so is this difference
                compare.append(
                    ReplayVsServing(
                        f"interconnect per token, with minus without, mean ({r.backend}, {r.mode})",
                        cost,
                        tw * 1e3,
                        "us",
                        cost / (tw * 1e3),
                    )
                )
            inner = r.in_step_comm_us_per_token
            if inner is not None and tw > 0:  # the same split as the serving column, taken inside one step
                compare.append(
                    ReplayVsServing(
                        f"transfer + wait per token, in step ({r.backend}, {r.mode})",
                        inner,
                        tw * 1e3,
                        "us",
                        inner / (tw * 1e3),
                    )
                )
    return ReplaySection(
        rows=rows,
        serving=serving,
        compare=compare,
        schedule=doc.get("schedule") or {},
        skipped=doc.get("skipped") or [],
        wrong=doc.get("wrong", 0) or 0,
        state=doc.get("state"),
        conditions=conditions_line(doc),
    )


def blocks(d: ReplaySection) -> list[tuple]:
    s = d.schedule
    counts = ", ".join(f"{v} {k}" for k, v in (s.get("counts") or {}).items())
    out: list[tuple] = [
        (
            "text",
            f"One decode step of {s.get('model')} at TP {s.get('tp')} replayed without the model: {counts} per step "
            "in vLLM's order, each after memory-streaming work of its layer's bytes (scaled by the work scale). "
            "Three timings of the same step: with the collectives, compute only, collectives only. The full "
            "step splits exactly as the in-serving attribution does: compute + transfer (min over ranks per "
            "call) + wait (the rest).",
        )
    ]
    t1, t2 = [], []
    for r in d.rows:
        sp, ar, tps = r.split_us, r.allreduce, r.tok_per_s
        t1.append(
            [
                r.backend,
                r.mode,
                fmt(r.full_p50_us),
                fmt(r.full_p99_us),
                fmt(r.compute_p50_us),
                fmt(r.comm_p50_us),
                fmt(r.cost_us_per_token),
                fmt(ar.get("duration_us_p50")),
            ]
        )
        t2.append(
            [
                r.backend,
                r.mode,
                fmt(sp.get("step_us")),
                fmt(sp.get("compute_us")),
                fmt(sp.get("transfer_us")),
                fmt(sp.get("wait_us")),
                fmt(tps.get("compute_only")),
                fmt(tps.get("comm_only")),
            ]
        )
    out.append(
        (
            "table",
            (
                [
                    "backend",
                    "mode",
                    "step p50 us",
                    "step p99 us",
                    "compute only p50 us",
                    "comm only p50 us",
                    "interconnect us/token (p50s)",
                    "all-reduce in step p50 us",
                ],
                t1,
                [0.8, 0.7, 1, 1, 1, 1, 1.1, 1.1],
            ),
        )
    )
    out.append(
        (
            "text",
            "The full step split (trimmed means over ranks and steps; compute + transfer + wait = step), and the "
            "ceilings if the interconnect or the compute were free:",
        )
    )
    out.append(
        (
            "table",
            (
                [
                    "backend",
                    "mode",
                    "step us",
                    "compute us",
                    "transfer us",
                    "wait us",
                    "tok/s, comm free",
                    "tok/s, compute free",
                ],
                t2,
                [0.8, 0.7, 1, 1, 1, 1, 1.1, 1.1],
            ),
        )
    )
    for r in d.rows:
        out.append(("text", f"{r.backend}, {r.mode}: {r.conditions}."))
    if d.compare:
        sv = d.serving or {}
        out.append(
            (
                "text",
                "Beside the hook's in-serving figures at C=1 (the measured truth for the server; the replay is a model of "
                f"it without the model's compute; all-reduce at the per-token size, serving backend {sv.get('allreduce_backend')}):",
            )
        )
        out.append(
            (
                "table",
                (
                    ["quantity", "replay", "in serving (C=1)", "replay / serving"],
                    [
                        [c.what, f"{fmt(c.replay)} {c.unit}", f"{fmt(c.serving)} {c.unit}", f"{c.ratio:.2f}"]
                        for c in d.compare
                    ],
                    [2.5, 1, 1, 1],
                ),
            )
        )
    for sk in d.skipped:
        out.append(("text", f"Skipped {sk['backend']} ({sk['mode']}): {sk['reason']}"))
    if d.wrong:
        out.append(("text", f"WARNING: {d.wrong} elements were wrong in the replay's correctness check."))
    if d.state not in (None, "complete"):
        out.append(("text", f"The replay run is {d.state}: only the timings it finished are shown."))
    return out
