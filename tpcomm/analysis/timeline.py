"""One decode step as a per-rank timeline, from the records as `attribute` aligned them.

Written by `attribute` to attribution/timeline.json (the report only draws it):
a representative decode step (on every rank, single sequence when there is
one, median duration), per rank the step's span and each collective's span
relative to the earliest rank's step start, and per collective instance the
entry skew (how much later the last rank arrived) and the transfer/wait split,
taken from align.py: the same instance key (group, group id, step, call_idx)
and the same definitions as the per-token split.

Units: *_us microseconds on the hosts' wall clock (time.time_ns), comparable
across ranks on one host; across hosts it carries clock offset.
"""

from __future__ import annotations

from typing import Any

import pandas as pd


def one_step_timeline(aligned: pd.DataFrame | None, steps: pd.DataFrame | None) -> dict[str, Any] | None:
    if aligned is None or len(aligned) == 0:
        return None
    c = aligned[aligned["step"] >= 0]
    if len(c) == 0:
        return None
    ranks = sorted(int(r) for r in c["rank"].unique())
    step = _pick_step(c, steps, ranks)
    if step is None:
        return None
    cs = c[c["step"] == step].sort_values(["rank", "call_idx"])
    st = steps[steps["step"] == step] if steps is not None and len(steps) else None
    starts = ([int(st["t_start_ns"].min())] if st is not None and len(st) else []) + [int(cs["t_start_ns"].min())]
    t0 = min(starts)
    per_rank = []
    for r in ranks:
        rc = cs[cs["rank"] == r]
        span = None
        if st is not None and len(st[st["rank"] == r]):
            row = st[st["rank"] == r].iloc[0]
            span = ((int(row["t_start_ns"]) - t0) / 1e3, (int(row["t_end_ns"]) - t0) / 1e3)
        calls = [
            {
                "op": x.op,
                "bytes": int(x.bytes),
                "start_us": (int(x.t_start_ns) - t0) / 1e3,
                "end_us": (int(x.t_end_ns) - t0) / 1e3,
                "backend": x.backend,
                "call_idx": int(x.call_idx),
                "transfer_us": float(x.transfer_us),
                "wait_us": float(x.wait_us),
            }
            for x in rc.itertuples(index=False)
        ]
        per_rank.append(
            {
                "rank": r,
                "step_span_us": span,
                "calls": calls,
                "collective_us": sum(k["end_us"] - k["start_us"] for k in calls),
            }
        )
    inst = cs[cs["complete"]].groupby("instance", sort=False)
    skews = inst["entry_skew_us"].max().tolist() if len(cs) else []
    spans = [p["step_span_us"] for p in per_rank if p["step_span_us"]]
    kind_row = st.iloc[0] if st is not None and len(st) else None
    return {
        "step": int(step),
        "ranks": per_rank,
        "num_seqs": int(kind_row["num_seqs"]) if kind_row is not None else None,
        "step_us": max(s[1] for s in spans) - min(s[0] for s in spans) if spans else None,
        "n_collectives": len(per_rank[0]["calls"]) if per_rank else 0,
        "max_entry_skew_us": max(skews) if skews else None,
        "sum_entry_skew_us": sum(skews) if skews else None,
        "entry_skew_us": skews,
        "conditions": (
            f"hook records of decode step {int(step)}, aligned by attribute (instance = group, step, "
            f"call_idx); {len(ranks)} ranks; backend {'/'.join(sorted(map(str, cs['backend'].unique())))}; "
            f"timing {'/'.join(sorted(map(str, cs['timing'].unique())))}; times relative to the earliest "
            "rank's step start (wall clock)"
        ),
    }


def _pick_step(c: pd.DataFrame, steps: pd.DataFrame | None, ranks: list[int]) -> int | None:
    per_step = c.groupby("step")["rank"].nunique()
    full = set(per_step[per_step == len(ranks)].index)
    if steps is not None and len(steps):
        s = steps[steps["step"].isin(full)]
        if (s["kind"] == "decode").any():
            s = s[s["kind"] == "decode"]
        if (s["num_seqs"] == 1).any():
            s = s[s["num_seqs"] == 1]
        if len(s):
            dur = s.groupby("step")["duration_us"].max().sort_values()
            return int(dur.index[len(dur) // 2])
    if not full:
        return None
    ordered = sorted(full)
    return int(ordered[len(ordered) // 2])
