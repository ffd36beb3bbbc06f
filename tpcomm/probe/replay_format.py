"""The replay's summary as text: one block per (backend, mode), every number
under a line stating its conditions (backend, world size, eager/graph, work
scale, context, versions)."""

from __future__ import annotations

from tpcomm.probe.results import PREEMPTED_WARN
from tpcomm.table import human_bytes, render


def conditions_line(doc: dict, backend: str | None = None, mode: str | None = None) -> str:
    c, s = doc.get("conditions") or {}, doc.get("schedule") or {}
    hw = (c.get("hardware_by_backend") or {}).get(backend) if backend else None
    parts = [
        f"{s.get('model')} decode step at TP {s.get('tp')}, batch {s.get('batch')}, context {s.get('context')} tokens",
        f"work scale {s.get('work_scale'):g} ({human_bytes(s.get('work_bytes_per_rank', 0))} read per rank per step from "
        f"{human_bytes(s.get('work_footprint_bytes_per_rank', s.get('work_bytes_per_rank', 0)))} of memory)",
    ]
    if backend:
        parts.append(f"backend {backend}, {mode}, world size {c.get('world_size')}")
    if c.get("skew_us"):
        parts.append(f"skew {c['skew_us']:g} us before each collective on rank {c.get('skew_rank')}")
    parts.append(f"{c.get('steps')} steps after {c.get('warmup')} warm-up")
    if hw:
        parts.append(str(hw))
    parts.append(f"tpcomm {c.get('tpcomm')}, torch {c.get('torch')}, vLLM {c.get('vllm') or 'not installed'}")
    return "; ".join(parts)


def format_replay(doc: dict) -> str:
    out = []
    s = doc.get("schedule") or {}
    counts = ", ".join(f"{v} {k}" for k, v in (s.get("counts") or {}).items())
    for e in doc.get("results") or []:
        out.append(f"# {conditions_line(doc, e['backend'], e['mode'])}")
        out.append(
            f"# per step: {counts}; step times are the mean over ranks; transfer = min over ranks per call, wait = the rest"
        )
        t = e["timings"]
        rows = [
            [name, t[k]["p50_us"], t[k]["p99_us"], (e.get("tok_per_s") or {}).get(tk)]
            for k, name, tk in (
                ("full", "with collectives", "with_collectives"),
                ("compute", "compute only", "compute_only"),
                ("comm", "collectives only", "comm_only"),
            )
            if k in t
        ]
        out.append(render(["step", "p50(us)", "p99(us)", "tok/s at p50"], rows))
        for k, v in t.items():
            n, lost = v.get("steps") or 0, v.get("preempted_steps")
            if lost is not None and n and lost / n > PREEMPTED_WARN:
                out.append(
                    f"# WARNING: a rank was preempted in {lost}/{n} {k} steps ({lost / n:.0%}): their times, and the "
                    "wait above all, hold the scheduler's slices (another busy process on the ranks' cores)"
                )
        sp = e.get("full_step_split_us")
        if sp:
            out.append(
                f"full step (trimmed mean) {sp['step_us']:.1f} us = compute {sp['compute_us']:.1f} + transfer {sp['transfer_us']:.1f} "
                f"+ wait {sp['wait_us']:.1f} us ({sp['collectives_per_step']} collectives)"
            )
        if e.get("interconnect_cost_us_per_token") is not None:
            out.append(
                f"interconnect cost per token in context (with minus without collectives): "
                f"{e['interconnect_cost_us_per_token']:.1f} us between step p50s, "
                f"{e['interconnect_cost_us_per_token_mean']:.1f} us between trimmed means; "
                f"in-step transfer + wait (trimmed mean) {e.get('in_step_comm_us_per_token', 0):.1f} us"
            )
        ops = [
            [
                o["timing"],
                o["op"],
                human_bytes(o["bytes"]),
                o["count_per_step"],
                o["duration_us_p50"],
                o["duration_us_p99"],
                o["transfer_us_p50"],
                o["wait_us_p50"],
            ]
            for o in e.get("ops") or []
        ]
        if ops:
            out.append(
                render(
                    ["timing", "op", "size", "per step", "p50(us)", "p99(us)", "transfer p50", "wait p50"],
                    ops,
                    align="lllrrrrr",
                )
            )
        out.append("")
    for sk in doc.get("skipped") or []:
        out.append(f"# skipped {sk['backend']} ({sk['mode']}): {sk['reason']}")
    if doc.get("wrong"):
        out.append(f"# WARNING: {doc['wrong']} elements wrong in the correctness check")
    return "\n".join(out).rstrip()
