"""When did the client get each token, against when the engine made it? Read from a run directory's raw
files (load/tokens.parquet, load/requests.parquet, attribution/steps_by_rank.parquet) by a route of its
own, not tpcomm's pairing: the closure tests use it to check that the requests the closure left out were
really delivered late (the API server held or the client stalled them), and that a closure not judged had
too few requests delivered on time to judge.

At C=1 one request runs at a time: the engine steps that start within a request's client time span are
its own; it makes token 0 at the end of the span's prefill step and token k at the end of its k-th decode
step (rank 0's steps, on the host wall clock that the client shares on one machine). A token's delivery
delay is its arrival minus that end. A constant delay (the API server's path) is every stream's; a
request is late when its delays spread by more than LATE_MS, or by more than LATE_SHARE of its own
generation time (first token made to last) where that is shorter: a held stream arrives in one lump after
its last token was made (its delays spread by ~0.9 of that time), a stalled one in a lump after the stall,
and one held over its last half by ~0.4. The share matters on a fast host: on an AVX-512 host (vLLM's
shared-memory all-reduce) the Llama test model makes a token in 1.9 ms, a 64-token request in 120 ms, and a
stream held whole spread by 96 ms, under LATE_MS (2026-12-06).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

LATE_MS = 100.0  # far above a token's period here (2-15 ms) and a burst's worth of jitter
LATE_SHARE = 0.25  # of the request's own generation time: below a half-held stream's spread, above jitter
# A stall in delivery: the client's longest wait between two tokens, at least the stall rule's threshold
# (analysis: 100 ms), mostly the path's (the delivery delay rose over it by at least half of it), not the
# engine's own pause. A stall late in a stream spreads the delays of its last tokens only: request 5 of a busy
# demo (2026-12-07) waited 132 ms at token 46 of 64, 81 ms of it delivery, and its spread (81.2 ms) stayed
# under the quarter of its generation time (84.4 ms).
STALL_MS = 100.0
STALL_DELIVERY_SHARE = 0.5


def delay_spread_ms(run_dir: Path, concurrency: int = 1) -> dict[int, float]:
    """Per request of the level: p90 - min of its tokens' delivery delay (ms); NaN where its steps do not
    match its tokens (no prefill step in its span, or not one decode step per token)."""
    return {r: v[0] for r, v in _spread_and_span_ms(run_dir, concurrency).items()}


def _spread_and_span_ms(run_dir: Path, concurrency: int = 1) -> dict[int, tuple[float, float]]:
    """Per request: (its delays' p90 - min, its generation time: first token made to last), in ms; NaN, NaN
    where its steps do not match its tokens."""
    return {r: v[:2] for r, v in _readings(run_dir, concurrency).items()}


def _readings(run_dir: Path, concurrency: int = 1) -> dict[int, tuple[float, float, bool]]:
    """Per request: its delays' spread and generation time (ms, as _spread_and_span_ms) and whether its
    longest wait between two tokens was a stall in delivery (STALL_MS, STALL_DELIVERY_SHARE); NaN, NaN, False
    where its steps do not match its tokens."""
    run_dir = Path(run_dir)
    req = pd.read_parquet(run_dir / "load/requests.parquet")
    tok = pd.read_parquet(run_dir / "load/tokens.parquet")
    steps = pd.read_parquet(run_dir / "attribution/steps_by_rank.parquet")
    req = req[(req["concurrency"] == concurrency) & req["ok"]]
    tok = tok[tok["concurrency"] == concurrency]
    s = steps[(steps["rank"] == steps["rank"].min()) & (steps["kind"] != "empty")].sort_values("step")
    t_end = s["host_t_end_ns"] if "host_t_end_ns" in s.columns else s["t_end_ns"]
    s = s.assign(_start=s.get("host_t_start_ns", s["t_start_ns"]), _end=t_end)
    out: dict[int, tuple[float, float]] = {}
    for _, r in req.iterrows():
        rid = int(r["request_id"])
        mine = s[(s["_start"] >= r["t_start_ns"]) & (s["_start"] <= r["t_end_ns"])]
        pre = np.flatnonzero(mine["kind"].to_numpy() == "prefill")
        if len(pre) != 1:
            out[rid] = (float("nan"), float("nan"), False)
            continue
        made = mine["_end"].to_numpy(dtype=np.int64)[pre[0] :]
        g = tok[tok["request_id"] == rid].sort_values("token_idx")
        counts = g["n_tokens"].to_numpy() if "n_tokens" in g.columns else np.ones(len(g), dtype=np.int64)
        if (counts < 1).any():
            counts = np.ones(len(g), dtype=np.int64)
        arrival = np.repeat(g["t_ns"].to_numpy(dtype=np.int64), counts)  # a chunk's tokens arrive together
        n = int(r["output_tokens"])
        if len(made) < n or len(arrival) != n:
            out[rid] = (float("nan"), float("nan"), False)
            continue
        delay = (arrival - made[:n]) / 1e6
        stalled = False
        if n > 1:
            gaps = np.diff(arrival) / 1e6
            i = int(np.argmax(gaps))
            stalled = bool(gaps[i] >= STALL_MS and delay[i + 1] - delay[i] >= STALL_DELIVERY_SHARE * gaps[i])
        out[rid] = (float(np.percentile(delay, 90) - delay.min()), float(made[n - 1] - made[0]) / 1e6, stalled)
    return out


def late_and_on_time(run_dir: Path, concurrency: int = 1) -> tuple[set[int], set[int]]:
    """Requests delivered late (their delays spread beyond LATE_MS or LATE_SHARE of their generation time, or
    their longest wait was a stall in delivery) and those delivered on time; neither where unreadable."""
    got = _readings(run_dir, concurrency)
    late = {
        r
        for r, (v, span, stalled) in got.items()
        if np.isfinite(v) and (v > min(LATE_MS, LATE_SHARE * span) or stalled)
    }
    on_time = {r for r, (v, _, _) in got.items() if np.isfinite(v)} - late
    return late, on_time
