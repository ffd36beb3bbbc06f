"""Aligned steps and collectives as a Chrome/Perfetto trace (JSON trace-event
format), so a user can open in ui.perfetto.dev or chrome://tracing the very
instances the split counted: one process per rank, with tracks for its steps,
its collectives, and each collective's wait and transfer.

Within one collective call on a rank, its wait is drawn first (it arrived
before the slowest rank) and its transfer last: the transfer is the part all
ranks spend together, which ends with the call. Times are microseconds from
the first record (`otherData.t0_unix_ns` holds that origin).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

STEPS, COLLECTIVES, SPLIT = 1, 2, 3


def perfetto(aligned: pd.DataFrame, steps: pd.DataFrame, label: str) -> dict:
    if {"gpu_start_ns", "gpu_end_ns"} <= set(steps.columns):  # steps drawn on the clock of their collectives
        g0 = pd.to_numeric(steps["gpu_start_ns"], errors="coerce")
        g1 = pd.to_numeric(steps["gpu_end_ns"], errors="coerce")
        ok = g0.notna() & g1.notna() & (g0 > 0) & (g1 >= g0)
        steps = steps.assign(
            t_start_ns=steps["t_start_ns"].where(~ok, g0).astype("int64"),
            duration_us=steps["duration_us"].where(~ok, (g1 - g0) / 1e3),
        )
    t0 = int(min(aligned["t_start_ns"].min(), steps["t_start_ns"].min() if len(steps) else aligned["t_start_ns"].min()))
    ev: list[dict] = []
    for r in sorted(set(aligned["rank"]) | set(steps["rank"])):
        r = int(r)
        ev.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r} ({label})"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for tid, name in ((STEPS, "steps"), (COLLECTIVES, "collectives"), (SPLIT, "wait | transfer")):
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
    for s in steps.itertuples(index=False):
        ev.append(
            {
                "ph": "X",
                "cat": "step",
                "name": f"{s.kind} step {s.step}",
                "pid": int(s.rank),
                "tid": STEPS,
                "ts": (s.t_start_ns - t0) / 1e3,
                "dur": s.duration_us,
                "args": {"step": int(s.step), "num_seqs": int(s.num_seqs), "num_tokens": int(s.num_tokens)},
            }
        )
    for c in aligned.itertuples(index=False):
        ts, end = (c.t_start_ns - t0) / 1e3, (c.t_end_ns - t0) / 1e3
        args = {
            "step": int(c.step),
            "call_idx": int(c.call_idx),
            "instance": int(c.instance),
            "group": c.group,
            "bytes": int(c.bytes),
            "backend": c.backend,
            "transfer_us": round(float(c.transfer_us), 3),
            "wait_us": round(float(c.wait_us), 3),
            "complete": bool(c.complete),
        }
        name = f"{c.op} {int(c.bytes)} B" if c.bytes >= 0 else c.op
        ev.append(
            {
                "ph": "X",
                "cat": "collective",
                "name": name,
                "pid": int(c.rank),
                "tid": COLLECTIVES,
                "ts": ts,
                "dur": float(c.duration_us),
                "args": args,
            }
        )
        if c.complete and c.wait_us > 0:
            ev.append(
                {
                    "ph": "X",
                    "cat": "wait",
                    "name": "wait",
                    "pid": int(c.rank),
                    "tid": SPLIT,
                    "ts": ts,
                    "dur": float(c.wait_us),
                    "args": {"instance": int(c.instance)},
                }
            )
        ev.append(
            {
                "ph": "X",
                "cat": "transfer",
                "name": "transfer" if c.complete else "transfer+wait (not aligned)",
                "pid": int(c.rank),
                "tid": SPLIT,
                "ts": end - float(c.transfer_us),
                "dur": float(c.transfer_us),
                "args": {"instance": int(c.instance)},
            }
        )
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"t0_unix_ns": t0, "source": label}}


def write(root: Path, rel: str, doc: dict) -> Path:
    """root/rel (a run directory and a path inside it), written whole through safefs (no links followed)."""
    from tpcomm.rundir import safefs

    return safefs.write_atomic(root, rel, json.dumps(doc, separators=(",", ":")).encode())
