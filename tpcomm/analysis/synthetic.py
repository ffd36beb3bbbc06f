"""Schema-true synthetic hook records and client timings with a known answer,
for the speed benchmark and for unit tests of the alignment and split.

Model of one engine step on each rank: compute pieces between collectives;
every collective instance ends at the same moment on all ranks (when the last
rank has arrived plus the transfer time), so each rank's duration = its wait
for the last arrival + the transfer, and the minimum over ranks = transfer.
Steps run back to back with a host gap between them; optionally every
`prefill_every`-th step is a prefill (a new request, `prefill_scale` x the
compute, after an idle gap) and only one step in `sample_every` keeps its
collective records (what sampled CUDA-graph timing gives).

Units: *_us microseconds, *_ns wall clock nanoseconds, *_ms milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

T0_NS = 1_700_000_000_000_000_000


def make_records(
    steps: int = 1000,
    tp: int = 2,
    calls: int = 10,
    hidden: int = 256,
    transfer_us: float = 20.0,
    compute_us: float = 300.0,
    skew_us: float = 40.0,
    seed: int = 0,
    t0_ns: int = T0_NS,
    step_gap_us: float = 500.0,
    prefill_every: int = 0,
    prefill_scale: float = 8.0,
    idle_us: float = 20_000.0,
    sample_every: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(collectives, steps, truth). `calls` per step: calls-1 all-reduces of hidden*2 bytes and one logits all-gather.

    truth: transfer_us_per_step (all steps), and over decode pairs (a decode step and the step before it):
    period_us, compute_us, transfer_us, wait_us, gap_us (means over pairs and ranks; they add up to period_us)."""
    rng = np.random.default_rng(seed)
    S, R, K = steps, tp, calls
    kind = np.array(["decode"] * S, dtype=object)
    if prefill_every:
        kind[::prefill_every] = "prefill"
    scale = np.where(kind == "prefill", prefill_scale, 1.0)[:, None, None]
    # per (step, call, rank): compute before the call, then arrival; the instance ends at max arrival + transfer
    comp = (rng.gamma(4.0, compute_us / K / 4.0, size=(S, K, R)) + rng.uniform(0, skew_us / K, size=(S, K, R))) * scale
    xfer = transfer_us * rng.uniform(0.8, 1.2, size=(S, K))
    arrive = np.zeros((S, K, R))
    end = np.zeros((S, K))
    cur = np.zeros((S, R))
    for k in range(K):  # K is small: loop over calls, vectorised over steps and ranks
        arrive[:, k, :] = cur + comp[:, k, :]
        end[:, k] = arrive[:, k, :].max(axis=1) + xfer[:, k]
        cur = np.repeat(end[:, k : k + 1], R, axis=1)
    tail = rng.gamma(4.0, compute_us / K / 4.0, size=(S, R)) * scale[:, :, 0]
    step_end_rel = cur + tail
    # Every rank starts a step at the same time; the next starts a host gap after the slowest rank ends
    # (plus an idle wait for the client before a prefill).
    gap = np.full(S, step_gap_us)
    gap[:-1] += np.where(kind[1:] == "prefill", idle_us, 0.0)
    step_start = np.concatenate([[0.0], np.cumsum(step_end_rel.max(axis=1)[:-1] + gap[:-1])])
    ts = (t0_ns + (step_start[:, None, None] + arrive) * 1e3).astype(np.int64)  # (S, K, R)
    te = (t0_ns + (step_start[:, None] + end) * 1e3).astype(np.int64)[:, :, None].repeat(R, axis=2)

    ops = np.array(["all_reduce"] * (K - 1) + ["all_gather"], dtype=object)
    nbytes = np.array([hidden * 2] * (K - 1) + [2048 // R * 2], dtype=np.int64)
    sidx, kidx, ridx = np.meshgrid(np.arange(S), np.arange(K), np.arange(R), indexing="ij")
    n = S * K * R
    coll = pd.DataFrame(
        {
            "rank": ridx.ravel().astype(np.int32),
            "group": np.full(n, "tp", dtype=object),
            "group_rank": ridx.ravel().astype(np.int32),
            "group_size": np.full(n, R, np.int32),
            "op": ops[kidx.ravel()],
            "bytes": nbytes[kidx.ravel()],
            "dtype": np.full(n, "bfloat16", dtype=object),
            "backend": np.full(n, "shm", dtype=object),
            "step": sidx.ravel().astype(np.int64),
            "call_idx": kidx.ravel().astype(np.int32),
            "t_start_ns": ts.ravel(),
            "t_end_ns": te.ravel(),
        }
    )
    coll["duration_us"] = (coll["t_end_ns"] - coll["t_start_ns"]) / 1e3
    coll["timing"] = "host-sync"
    if sample_every > 1:  # the same steps on every rank, as the hook samples them
        coll = coll[coll["step"] % sample_every == 0].reset_index(drop=True)
    s_start = np.repeat((t0_ns + step_start * 1e3).astype(np.int64), R)
    s_end = (t0_ns + ((step_start[:, None] + step_end_rel) * 1e3)).astype(np.int64).ravel()
    st = pd.DataFrame(
        {
            "rank": np.tile(np.arange(R, dtype=np.int32), S),
            "step": np.repeat(np.arange(S), R),
            "t_start_ns": s_start,
            "t_end_ns": s_end,
            "num_seqs": np.ones(S * R, np.int32),
            "num_tokens": np.where(np.repeat(kind, R) == "prefill", 32, 1).astype(np.int32),
            "kind": np.repeat(kind, R),
        }
    )
    st["duration_us"] = (st["t_end_ns"] - st["t_start_ns"]) / 1e3
    # The known answer over decode pairs (a decode step and the step before it, any kind: split.decode_pairs),
    # from the generator's own arrays: per rank, period = end to end, gap = the host gap before the step.
    pair = np.zeros(S, bool)
    pair[1:] = kind[1:] == "decode"
    wait = (arrive.max(axis=2, keepdims=True) - arrive).sum(axis=1)  # (S, R)
    x = xfer.sum(axis=1)
    end_abs = step_start[:, None] + step_end_rel  # (S, R)
    period = (end_abs[1:] - end_abs[:-1])[pair[1:]]
    before = (step_start[1:, None] - end_abs[:-1])[pair[1:]]
    truth = {
        "transfer_us_per_step": float(x.mean()),
        "steps": S,
        "tp": R,
        "calls": K,
        "period_us": float(period.mean()) if period.size else None,
        "transfer_us": float(x[pair].mean()),
        "wait_us": float(wait[pair].mean()),
        "gap_us": float(before.mean()) if before.size else None,
        "compute_us": float((step_end_rel - wait - x[:, None])[pair].mean()),
    }
    return coll, st, truth


def make_client(
    st: pd.DataFrame,
    delivery_us: float = 150.0,
    burst: int = 1,
    stall: Sequence[tuple[int, int, float]] = (),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, tokens) of one single-stream client for steps from make_records(prefill_every=n):
    each prefill starts a request; every step's token reaches the client `delivery_us` after the step ends
    on the slowest rank; `burst` > 1 delivers tokens in groups (a starved API server); `stall` =
    [(request_id, token_idx, ms)]: the client stops reading before each such token for `ms`."""
    s = st.groupby("step").agg(t_start_ns=("t_start_ns", "min"), t_end_ns=("t_end_ns", "max"), kind=("kind", "first"))
    rid = np.cumsum(s["kind"].to_numpy() == "prefill") - 1
    t = s["t_end_ns"].to_numpy() + int(delivery_us * 1e3)
    keep = rid >= 0
    tok = pd.DataFrame({"request_id": rid[keep], "concurrency": 1, "repeat": 0, "t_ns": t[keep]})
    tok["token_idx"] = tok.groupby("request_id").cumcount()
    if burst > 1:  # after the first token, groups of `burst` tokens arrive together, with their last one
        grp = (tok["token_idx"] + burst - 1) // burst
        tok["t_ns"] = tok.groupby([tok["request_id"], grp])["t_ns"].transform("max")
    for r, k, ms in stall:
        m = tok["request_id"] == r
        t_before = tok.loc[m & (tok["token_idx"] == k - 1), "t_ns"].iloc[0]
        later = m & (tok["token_idx"] >= k)
        tok.loc[later, "t_ns"] = np.maximum(tok.loc[later, "t_ns"], t_before + int(ms * 1e6))
    starts = s["t_start_ns"].to_numpy()[s["kind"].to_numpy() == "prefill"] - 1_000_000
    g = tok.groupby("request_id")["t_ns"]
    first, last, n = g.min(), g.max(), g.size()
    req = pd.DataFrame(
        {
            "concurrency": 1,
            "repeat": 0,
            "round": 0,
            "in_stats": True,
            "request_id": first.index,
            "ok": True,
            "output_tokens": n.to_numpy(),
            "t_start_ns": starts[first.index],
            "t_end_ns": last.to_numpy(),
        }
    )
    req["ttft_ms"] = (first.to_numpy() - req["t_start_ns"]) / 1e6
    req["e2e_ms"] = (req["t_end_ns"] - req["t_start_ns"]) / 1e6
    req["tpot_ms"] = (req["e2e_ms"] - req["ttft_ms"]) / (req["output_tokens"] - 1)
    return req, tok
