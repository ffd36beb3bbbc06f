"""The per-token split of aligned records, the same function for the trace's
records and the hook's, so that both instruments' terms are computed by one
piece of code (analysis/split.py's rank_steps and engine_split, unchanged):
    per-token time = compute + transfer + wait + host gap   (means over decode pairs; exact)

Traces without vLLM's step ranges (training traces, `ProfilerStep#N`) are
split per step instead of per token; the result says which (`unit`).

Units: *_us microseconds, *_ms milliseconds, t_*_ns Unix clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.analysis.crosscheck import compare, observed_per_step, planned_per_step
from tpcomm.analysis.split import engine_split, rank_steps
from tpcomm.terms import ENGINE_TERMS as TERMS


def by_rank_steps(aligned: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step): step_us (span), compute_us, coll_us, transfer_us, wait_us, gap_us (to the
    rank's next step; NaN for its last), n_collectives, kind."""
    rows = rank_steps(aligned, steps).sort_values(["rank", "step"]).reset_index(drop=True)
    nxt = rows["t_start_ns"].astype("Int64").groupby(rows["rank"]).shift(-1)  # Int64: ns stay exact
    rows["gap_us"] = ((nxt - rows["t_end_ns"]).astype("Float64") / 1e3).astype("float64")
    return rows


def in_window(df: pd.DataFrame, window: tuple[int, int] | None) -> pd.DataFrame:
    if window is None or df.empty:
        return df
    return df[(df["t_start_ns"] >= window[0]) & (df["t_start_ns"] <= window[1])]


def split(aligned: pd.DataFrame, steps: pd.DataFrame, window=None, multi_host: bool = False) -> dict:
    """engine_split over the steps (and their records) that start inside `window` (all when None)."""
    rows = in_window(rank_steps(aligned, steps), window)
    unit = "token"
    if not rows.empty and not (rows["kind"] == "decode").any() and rows["kind"].isin(["profiler_step"]).any():
        # A training trace: consecutive profiler steps take the place of decode steps; per step, not per token.
        rows = rows.assign(kind=rows["kind"].replace({"profiler_step": "decode"}))
        unit = "step"
    sp = engine_split(rows)
    sp["unit"] = unit
    if sp.get("clock") == "gpu":  # the hook's note speaks of its CUDA events; say what the trace's GPU clock is
        sp["clock_note"] = (
            "GPU timeline of the traces: a step is the kernels its host range launched (CUDA-graph replays "
            "included), first kernel start to last kernel end; collectives are kernels; host_gap = GPU idle "
            "between steps"
        )
    sp["ranks"] = sorted(int(r) for r in rows["rank"].unique()) if not rows.empty else []
    if multi_host and sp.get("per_token_ms"):
        for d in [sp["per_token_ms"], *(r["per_token_ms"] for r in sp["by_rank"])]:
            d["collective"] = d["transfer"] + d["wait"]
            d["transfer"] = d["wait"] = None
        sp.pop("shares_pct", None)
        sp["note"] = "transfer and wait not separable across hosts without a common clock: `collective` is their sum"
    return sp


def crosscheck(aligned: pd.DataFrame, steps: pd.DataFrame, model_source, window=None) -> dict:
    """Collectives per decode step (lowest rank's most common pattern) against `tpcomm plan` of `model_source`."""
    a = in_window(aligned, window)
    dec = in_window(steps[steps["kind"] == "decode"], window)
    st = dec.groupby("step", as_index=False).agg(num_seqs=("num_seqs", "max"))
    obs = observed_per_step(a, st)
    tp = int(a.loc[a["group"] == "tp", "group_size"].mode().iloc[0]) if (a["group"] == "tp").any() else None
    if model_source is None:
        doc = compare(obs, None, "no model config given (--model-config PATH)")
    else:
        label = "the server-reported model config" if isinstance(model_source, dict) else str(model_source)
        planned, note, _ = planned_per_step(model_source, tp, obs["batch"], label)
        if planned is not None and any(b < 0 for (_, _, b) in obs["signature"]):
            doc = _compare_counts(obs, planned, note)
        else:
            doc = compare(obs, planned, note)
    return doc


def _compare_counts(obs: dict, planned: dict, note: str) -> dict:
    """Sizes not in the trace (the profiler ran without record_shapes): counts per (group, op) only."""

    def per_op(sig):
        out: dict = {}
        for (g, op, _), n in sig.items():
            out[(g, op, -1)] = out.get((g, op, -1), 0) + n
        return out

    doc = compare({**obs, "signature": per_op(obs["signature"])}, per_op(planned), note)
    doc["detail"] += " (counts only: the trace holds no sizes; start the profiler with torch_profiler_record_shapes)"
    return doc


def comparison(hook: dict, trace: dict) -> list[dict]:
    """Per term: hook ms, trace ms, difference ms and as % of the hook's per-token time."""
    ht, tt = hook.get("per_token_ms") or {}, trace.get("per_token_ms") or {}
    total = hook.get("engine_ms_per_token")
    out = []
    for k in ("per_token", *TERMS):
        h = total if k == "per_token" else ht.get(k)
        t = trace.get("engine_ms_per_token") if k == "per_token" else tt.get(k)
        d = t - h if h is not None and t is not None else None
        out.append(
            {
                "term": k,
                "hook_ms": h,
                "trace_ms": t,
                "diff_ms": d,
                "diff_pct_of_per_token": 100.0 * d / total if d is not None and total else None,
            }
        )
    return out


def rank_summary(by_rank: pd.DataFrame) -> list[dict]:
    """Per rank, over all its steps: steps, span, compute, collective, transfer, wait, gap (sums, us)."""
    out = []
    for r, g in by_rank.groupby("rank", sort=True):
        out.append(
            {
                "rank": int(r),
                "steps": int(len(g)),
                "span_us": float(g["step_us"].sum()),
                "compute_us": float(g["compute_us"].sum()),
                "collective_us": float(g["coll_us"].sum()),
                "transfer_us": float(g["transfer_us"].sum()),
                "wait_us": float(g["wait_us"].sum()),
                "gap_us": float(np.nansum(g["gap_us"])),
                "collectives": int(g["n_collectives"].sum()),
            }
        )
    return out
