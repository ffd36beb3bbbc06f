"""Align hook records across ranks: one collective *instance* is the same
(group, group id, step, call_idx) seen on every rank of that group.

Why instances: each rank's duration of a collective includes waiting for the
slowest rank to arrive. The part all ranks spend together (the minimum
duration over the ranks of the instance) is the transfer; the rest of each
rank's duration is wait, i.e. rank skew. Summing raw durations overstates
communication (users have reported 3x the ITL that way).

Which group a rank belongs to: a `group_id` column when the records carry
one; otherwise TP groups are contiguous blocks of ranks in vLLM's layout
(TP innermost), so group_id = rank // group_size; other groups are taken as
one group per name.

Units: *_us microseconds, *_ns wall clock nanoseconds, bytes per rank per call.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

INSTANCE_KEY = ["group", "group_id", "step", "call_idx"]


def with_group_ids(coll: pd.DataFrame) -> pd.DataFrame:
    if "group_id" in coll.columns:
        return coll
    gid = np.where(
        coll["group"].to_numpy() == "tp", coll["rank"].to_numpy() // np.maximum(coll["group_size"].to_numpy(), 1), 0
    )
    return coll.assign(group_id=gid.astype(np.int64))


def align(coll: pd.DataFrame) -> pd.DataFrame:
    """Add per-call columns: instance (id), n_ranks, complete, transfer_us, wait_us, entry_skew_us.

    Rows with step < 0 (outside a known engine step) cannot be aligned and get instance -1.
    """
    df = with_group_ids(coll).reset_index(drop=True)
    known = df["step"].to_numpy() >= 0
    inst = np.full(len(df), -1, dtype=np.int64)
    if known.any():
        sub = df.loc[known, INSTANCE_KEY]
        inst[known] = sub.groupby(INSTANCE_KEY, sort=False, observed=True).ngroup().to_numpy()
    n_inst = int(inst.max()) + 1 if known.any() else 0
    idx = np.where(known, inst, 0)

    dur = df["duration_us"].to_numpy(dtype=np.float64)
    t0 = df["t_start_ns"].to_numpy(dtype=np.int64)
    min_dur = np.full(n_inst, np.inf)
    np.minimum.at(min_dur, idx[known], dur[known])
    min_t0 = np.full(n_inst, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(min_t0, idx[known], t0[known])
    n_ranks = np.bincount(idx[known], minlength=n_inst)
    # One op per instance: a different op on another rank means the step counters disagree.
    op_codes = pd.factorize(df["op"])[0]
    op_min = np.full(n_inst, np.iinfo(np.int64).max, dtype=np.int64)
    op_max = np.full(n_inst, -1, dtype=np.int64)
    np.minimum.at(op_min, idx[known], op_codes[known])
    np.maximum.at(op_max, idx[known], op_codes[known])

    gsize = df["group_size"].to_numpy()
    complete = known & (n_ranks[idx] == gsize) & (op_min[idx] == op_max[idx])
    transfer = np.where(complete, min_dur[idx], dur)
    return df.assign(
        instance=inst,
        n_ranks=np.where(known, n_ranks[idx], 1),
        complete=complete,
        transfer_us=transfer,
        wait_us=dur - transfer,
        entry_skew_us=np.where(known, (t0 - min_t0[idx]) / 1e3, 0.0),
    )


def instances(aligned: pd.DataFrame) -> pd.DataFrame:
    """One row per complete instance: group, step, call_idx, op, bytes, transfer_us, max_us, skew_us."""
    a = aligned[aligned["complete"]]
    return (
        a.groupby("instance", sort=True)
        .agg(
            group=("group", "first"),
            group_id=("group_id", "first"),
            step=("step", "first"),
            call_idx=("call_idx", "first"),
            op=("op", "first"),
            bytes=("bytes", "max"),
            n_ranks=("n_ranks", "first"),
            transfer_us=("transfer_us", "first"),
            max_us=("duration_us", "max"),
            skew_us=("entry_skew_us", "max"),
            t_start_ns=("t_start_ns", "min"),
        )
        .reset_index()
    )


def alignment_quality(aligned: pd.DataFrame) -> dict:
    """How well the ranks lined up; the report states these next to the split."""
    n = len(aligned)
    known = aligned["instance"] >= 0
    comp = aligned[aligned["complete"]]
    # Per instance: how much later the last rank entered than the first (the rank skew it paid).
    skew = comp.groupby("instance")["entry_skew_us"].max() if not comp.empty else pd.Series(dtype=float)
    return {
        "records": int(n),
        "outside_step": int((~known).sum()),
        "in_complete_instances_pct": round(float(aligned["complete"].mean() * 100), 2) if n else None,
        "instance_entry_skew_us_p50": float(skew.median()) if len(skew) else None,
        "instance_entry_skew_us_p99": float(skew.quantile(0.99)) if len(skew) else None,
    }
