"""Schema-true synthetic hook records with a known answer, for the speed
benchmark and for unit tests of the alignment and split.

Model of one decode step on each rank: compute pieces between collectives;
every collective instance ends at the same moment on all ranks (when the last
rank has arrived plus the transfer time), so each rank's duration = its wait
for the last arrival + the transfer, and the minimum over ranks = transfer.

Units: *_us microseconds, *_ns wall clock nanoseconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def make_records(steps: int = 1000, tp: int = 2, calls: int = 10, hidden: int = 256, transfer_us: float = 20.0,
                 compute_us: float = 300.0, skew_us: float = 40.0, seed: int = 0, t0_ns: int = 1_700_000_000_000_000_000,
                 step_gap_us: float = 500.0) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(collectives, steps, truth). `calls` per step: calls-1 all-reduces of hidden*2 bytes and one logits all-gather."""
    rng = np.random.default_rng(seed)
    S, R, K = steps, tp, calls
    # per (step, call, rank): compute before the call, then arrival; the instance ends at max arrival + transfer
    comp = rng.gamma(4.0, compute_us / K / 4.0, size=(S, K, R)) + rng.uniform(0, skew_us / K, size=(S, K, R))
    xfer = transfer_us * rng.uniform(0.8, 1.2, size=(S, K))
    arrive = np.zeros((S, K, R))
    end = np.zeros((S, K))
    cur = np.zeros((S, R))
    for k in range(K):  # K is small: loop over calls, vectorised over steps and ranks
        arrive[:, k, :] = cur + comp[:, k, :]
        end[:, k] = arrive[:, k, :].max(axis=1) + xfer[:, k]
        cur = np.repeat(end[:, k:k + 1], R, axis=1)
    tail = rng.gamma(4.0, compute_us / K / 4.0, size=(S, R))
    step_end_rel = cur + tail
    dur_step = step_end_rel.max(axis=1)
    # Steps run back to back with a host gap between them.
    step_start = np.concatenate([[0.0], np.cumsum(dur_step[:-1] + step_gap_us)])
    ts = (t0_ns + (step_start[:, None, None] + arrive) * 1e3).astype(np.int64)       # (S, K, R)
    te = (t0_ns + (step_start[:, None] + end) * 1e3).astype(np.int64)[:, :, None].repeat(R, axis=2)

    ops = np.array(["all_reduce"] * (K - 1) + ["all_gather"], dtype=object)
    nbytes = np.array([hidden * 2] * (K - 1) + [2048 // R * 2], dtype=np.int64)
    sidx, kidx, ridx = np.meshgrid(np.arange(S), np.arange(K), np.arange(R), indexing="ij")
    n = S * K * R
    coll = pd.DataFrame({
        "rank": ridx.ravel().astype(np.int32), "group": np.full(n, "tp", dtype=object),
        "group_rank": ridx.ravel().astype(np.int32), "group_size": np.full(n, R, np.int32),
        "op": ops[kidx.ravel()], "bytes": nbytes[kidx.ravel()], "dtype": np.full(n, "bfloat16", dtype=object),
        "backend": np.full(n, "shm", dtype=object), "step": sidx.ravel().astype(np.int64),
        "call_idx": kidx.ravel().astype(np.int32), "t_start_ns": ts.ravel(), "t_end_ns": te.ravel(),
    })
    coll["duration_us"] = (coll["t_end_ns"] - coll["t_start_ns"]) / 1e3
    coll["timing"] = "host-sync"
    s_start = np.repeat((t0_ns + step_start * 1e3).astype(np.int64), R)
    s_end = (t0_ns + ((step_start[:, None] + step_end_rel) * 1e3)).astype(np.int64).ravel()
    st = pd.DataFrame({"rank": np.tile(np.arange(R, dtype=np.int32), S), "step": np.repeat(np.arange(S), R),
                       "t_start_ns": s_start, "t_end_ns": s_end, "num_seqs": np.ones(S * R, np.int32),
                       "num_tokens": np.ones(S * R, np.int32), "kind": np.full(S * R, "decode", dtype=object)})
    st["duration_us"] = (st["t_end_ns"] - st["t_start_ns"]) / 1e3
    truth = {"transfer_us_per_step": float(xfer.sum(axis=1).mean()), "steps": S, "tp": R, "calls": K}
    return coll, st, truth
