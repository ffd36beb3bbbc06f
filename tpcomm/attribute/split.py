"""Split decode time into compute, collective transfer, collective wait and
host/engine overhead.

Per decode step and rank (from aligned hook records):
    transfer_us = sum over the step's collectives of the instance's minimum duration over ranks
    wait_us     = sum of (this rank's duration - that minimum)            (rank skew)
    compute_us  = step_us - transfer_us - wait_us                         (everything else in the step)
Per token of a request (what a stream sees as its inter-token latency):
    compute / transfer / wait = trimmed mean (p5..p95 of step time) over the level's decode steps,
                                averaged over ranks
    host_overhead             = mean over tokens of (client ITL - duration of the step that emitted it)
The four terms are measured independently of the client's ITL, so their sum
versus the median ITL (closure_pct) and the mean ITL (closure_mean_pct) checks
the split. When the client receives tokens in bursts (a starved API server),
those two mean little; stream_closure() still checks that the engine's steps
tile the client's wall time (closure_stream_pct).

Units: *_us microseconds, *_ms milliseconds, t_*_ns wall clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_COLUMNS = ["concurrency", "repeat", "step", "step_us", "compute_us", "transfer_us", "wait_us", "n_collectives",
                "num_seqs", "num_tokens", "kind", "ranks", "t_start_ns", "t_end_ns"]


def rank_steps(aligned: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step): the step's time split on that rank."""
    a = aligned[aligned["step"] >= 0]
    per = (a.groupby(["rank", "step"], sort=False)
           .agg(coll_us=("duration_us", "sum"), transfer_us=("transfer_us", "sum"), wait_us=("wait_us", "sum"),
                n_collectives=("duration_us", "size"))
           .reset_index())
    out = steps.merge(per, on=["rank", "step"], how="left")
    for c in ("coll_us", "transfer_us", "wait_us"):
        out[c] = out[c].fillna(0.0)
    out["n_collectives"] = out["n_collectives"].fillna(0).astype(np.int64)
    out["compute_us"] = out["duration_us"] - out["coll_us"]
    return out.rename(columns={"duration_us": "step_us"})


def assign_levels(df: pd.DataFrame, windows: list[dict], t_col: str = "t_start_ns") -> pd.DataFrame:
    """Tag rows with the (concurrency, repeat) whose wall-clock window holds them; drop the rest."""
    t = df[t_col].to_numpy()
    conc = np.full(len(df), -1, dtype=np.int64)
    rep = np.full(len(df), -1, dtype=np.int64)
    for w in windows:
        m = (t >= w["t_start_ns"]) & (t <= w["t_end_ns"])
        conc[m], rep[m] = w["concurrency"], w["repeat"]
    return df.assign(concurrency=conc, repeat=rep)[conc >= 0]


def decode_steps(rank_rows: pd.DataFrame) -> pd.DataFrame:
    """attribution/steps.parquet: one row per decode step, each term averaged over ranks."""
    d = rank_rows[rank_rows["kind"] == "decode"]
    if d.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    g = d.groupby(["concurrency", "repeat", "step"], sort=True)
    out = g.agg(step_us=("step_us", "mean"), compute_us=("compute_us", "mean"), transfer_us=("transfer_us", "mean"),
                wait_us=("wait_us", "mean"), n_collectives=("n_collectives", "max"), num_seqs=("num_seqs", "max"),
                num_tokens=("num_tokens", "max"), kind=("kind", "first"), ranks=("rank", "nunique"),
                t_start_ns=("t_start_ns", "min"), t_end_ns=("t_end_ns", "max")).reset_index()
    return out[STEP_COLUMNS]


def host_overhead_ms(tokens: pd.DataFrame, ref_steps: pd.DataFrame) -> np.ndarray:
    """Per token: client ITL minus the duration of the step that emitted it.

    The emitting step is the last step on the reference rank that ended before the
    token reached the client (both clocks are time.time_ns() on one host)."""
    if tokens.empty or ref_steps.empty:
        return np.array([])
    s = ref_steps.sort_values("t_end_ns")
    ends = s["t_end_ns"].to_numpy()
    dur_ms = s["step_us"].to_numpy() / 1e3
    t = tokens.sort_values(["concurrency", "repeat", "request_id", "token_idx"])
    tn = t["t_ns"].to_numpy()
    rid = t[["concurrency", "repeat", "request_id"]].to_numpy()
    same = (rid[1:] == rid[:-1]).all(axis=1)
    gap_ms = np.diff(tn) / 1e6
    pos = np.searchsorted(ends, tn[1:], side="right") - 1
    ok = same & (pos >= 0)
    return gap_ms[ok] - dur_ms[pos[ok]]


def _trimmed(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) < 10:
        return df
    lo, hi = df["step_us"].quantile([0.05, 0.95])
    return df[(df["step_us"] >= lo) & (df["step_us"] <= hi)]


def stream_closure(ref_steps: pd.DataFrame, concurrency: int, output_tok_per_s: float | None) -> dict:
    """A check that survives bursty token delivery: the engine's steps must tile the client's wall time.

    step_period_ms = mean start-to-start time of consecutive steps on the reference rank (any kind);
    stream_ms_per_token = C / (client output tok/s) = the time a stream spends per token over the round."""
    s = ref_steps.sort_values("t_start_ns")
    if len(s) < 2 or not output_tok_per_s:
        return {"step_period_ms": None, "engine_gap_ms": None, "stream_ms_per_token": None, "closure_stream_pct": None}
    period = float(np.diff(s["t_start_ns"].to_numpy()).mean()) / 1e6
    stream = concurrency * 1000.0 / output_tok_per_s
    return {"step_period_ms": period, "engine_gap_ms": period - float(s["step_us"].iloc[:-1].mean()) / 1e3,
            "stream_ms_per_token": stream, "closure_stream_pct": (period - stream) / stream * 100}


def level_split(step_rows: pd.DataFrame, aligned_level: pd.DataFrame, tokens: pd.DataFrame,
                ref_steps: pd.DataFrame, itl_ms_p50: float | None, itl_ms_mean: float | None = None) -> dict:
    """The per-token split, ceilings and top collective sites of one level."""
    if step_rows.empty:
        return {"per_token_ms": None, "note": "no decode steps recorded in this level's window"}
    t = _trimmed(step_rows)
    compute, transfer, wait = (float(t[c].mean()) / 1e3 for c in ("compute_us", "transfer_us", "wait_us"))
    host = host_overhead_ms(tokens, ref_steps)
    # A mean, not a median: when tokens reach the client in bursts, a burst's gaps sum to the
    # steps it covers, so only the mean keeps the per-token total right.
    host_ms = float(np.mean(host)) if host.size else None
    total = compute + transfer + wait + (host_ms or 0.0)
    seqs = float(t["num_seqs"].mean()) if t["num_seqs"].notna().any() else 1.0
    out = {
        "per_token_ms": {"compute": compute, "transfer": transfer, "wait": wait, "host_overhead": host_ms},
        "step_ms_mean": float(t["step_us"].mean()) / 1e3,
        "sum_ms": total,
        "closure_pct": (total - itl_ms_p50) / itl_ms_p50 * 100 if itl_ms_p50 else None,
        "closure_mean_pct": (total - itl_ms_mean) / itl_ms_mean * 100 if itl_ms_mean else None,
        "decode_steps": int(len(step_rows)),
        "seqs_per_step": seqs,
        "comm_only_tok_per_s": seqs / (transfer / 1e3) if transfer > 0 else None,
        "comm_and_wait_only_tok_per_s": seqs / ((transfer + wait) / 1e3) if transfer + wait > 0 else None,
        "compute_only_tok_per_s": seqs / (compute / 1e3) if compute > 0 else None,
        "top_sites": top_sites(aligned_level, step_rows),
    }
    return out


def top_sites(aligned_level: pd.DataFrame, step_rows: pd.DataFrame, n: int = 8) -> list[dict]:
    """Collectives grouped by (group, op, bytes): count and time per decode step per rank."""
    if aligned_level.empty or step_rows.empty:
        return []
    a = aligned_level[aligned_level["step"].isin(step_rows["step"])]
    n_rank_steps = max(a.groupby("rank")["step"].nunique().mean(), 1) if not a.empty else 1
    ranks = max(a["rank"].nunique(), 1)
    g = a.groupby(["group", "op", "bytes"]).agg(calls=("duration_us", "size"), time_us=("duration_us", "sum"),
                                                 transfer_us=("transfer_us", "sum"), wait_us=("wait_us", "sum"),
                                                 backend=("backend", "first")).reset_index()
    per = ranks * n_rank_steps
    g["count_per_step"] = g["calls"] / per
    for c in ("time_us", "transfer_us", "wait_us"):
        g[c + "_per_step"] = g[c] / per
    g = g.sort_values("time_us_per_step", ascending=False).head(n)
    cols = ["group", "op", "bytes", "backend", "count_per_step", "time_us_per_step", "transfer_us_per_step",
            "wait_us_per_step"]
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in g[cols].to_dict("records")]
