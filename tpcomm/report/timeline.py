"""One decode step as a per-rank timeline, from the hook's records.

Picks a representative decode step (present on every rank, single sequence
when there is one, median duration) and returns, per rank, the step's span
and each collective's span relative to the earliest rank's step start, plus
the entry skew of each collective (how much later the last rank arrived).

Units: *_us microseconds on the hosts' wall clock (time.time_ns), which is
comparable across ranks on one host; across hosts it carries clock offset.
"""

from __future__ import annotations

from typing import Any


def one_step_timeline(colls, steps) -> dict[str, Any] | None:
    if colls is None or len(colls) == 0 or "step" not in colls.columns:
        return None
    c = colls[colls["step"] >= 0]
    if len(c) == 0:
        return None
    ranks = sorted(int(r) for r in c["rank"].unique())
    step = _pick_step(c, steps, ranks)
    if step is None:
        return None
    cs = c[c["step"] == step].sort_values(["rank", "call_idx" if "call_idx" in c.columns else "t_start_ns"])
    st = None
    if steps is not None and len(steps) and "step" in steps.columns:
        st = steps[steps["step"] == step]
    starts = [int(st["t_start_ns"].min())] if st is not None and len(st) else []
    t0 = min(starts + [int(cs["t_start_ns"].min())])
    per_rank = []
    for r in ranks:
        rc = cs[cs["rank"] == r]
        span = None
        if st is not None and len(st[st["rank"] == r]):
            row = st[st["rank"] == r].iloc[0]
            span = ((int(row["t_start_ns"]) - t0) / 1e3, (int(row["t_end_ns"]) - t0) / 1e3)
        calls = [{"op": x["op"], "bytes": int(x["bytes"]), "start_us": (int(x["t_start_ns"]) - t0) / 1e3,
                  "end_us": (int(x["t_end_ns"]) - t0) / 1e3, "backend": x.get("backend"),
                  "call_idx": int(x["call_idx"]) if "call_idx" in rc.columns else i}
                 for i, (_, x) in enumerate(rc.iterrows())]
        per_rank.append({"rank": r, "step_span_us": span, "calls": calls,
                         "collective_us": sum(k["end_us"] - k["start_us"] for k in calls)})
    skews = _entry_skews(per_rank)
    spans = [p["step_span_us"] for p in per_rank if p["step_span_us"]]
    timing = sorted({str(t) for t in cs["timing"].unique()}) if "timing" in cs.columns else []
    backends = sorted({str(b) for b in cs["backend"].unique()}) if "backend" in cs.columns else []
    kind_row = st.iloc[0] if st is not None and len(st) else None
    return {
        "step": int(step),
        "ranks": per_rank,
        "num_seqs": int(kind_row["num_seqs"]) if kind_row is not None and "num_seqs" in st.columns else None,
        "step_us": max(s[1] for s in spans) - min(s[0] for s in spans) if spans else None,
        "n_collectives": len(per_rank[0]["calls"]) if per_rank else 0,
        "max_entry_skew_us": max(skews) if skews else None,
        "sum_entry_skew_us": sum(skews) if skews else None,
        "entry_skew_us": skews,
        "conditions": (f"hook records of decode step {int(step)}; {len(ranks)} ranks; backend {'/'.join(backends) or '?'}; "
                       f"timing {'/'.join(timing) or '?'}; times relative to the earliest rank's step start (wall clock)"),
    }


def _pick_step(c, steps, ranks: list[int]) -> int | None:
    per_step = c.groupby("step")["rank"].nunique()
    full = set(per_step[per_step == len(ranks)].index)
    if steps is not None and len(steps) and "step" in steps.columns:
        s = steps[steps["step"].isin(full)]
        if "kind" in s.columns and (s["kind"] == "decode").any():
            s = s[s["kind"] == "decode"]
        if "num_seqs" in s.columns and (s["num_seqs"] == 1).any():
            s = s[s["num_seqs"] == 1]
        if len(s):
            dur = s.groupby("step")["duration_us"].max().sort_values()
            return int(dur.index[len(dur) // 2])
    if not full:
        return None
    # No step table: the step with the median collective count is a decode step more often than not.
    ordered = sorted(full)
    return int(ordered[len(ordered) // 2])


def _entry_skews(per_rank: list[dict]) -> list[float]:
    """Per collective (by call index): latest rank's entry minus earliest rank's entry."""
    by_idx: dict[int, list[float]] = {}
    for p in per_rank:
        for k in p["calls"]:
            by_idx.setdefault(k["call_idx"], []).append(k["start_us"])
    return [max(v) - min(v) for _, v in sorted(by_idx.items()) if len(v) == len(per_rank)]
