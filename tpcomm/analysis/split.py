"""Split the engine's per-token time into compute, collective transfer,
collective wait and the host gap between steps: one clock, one window, one
statistic, and the four terms add up by the way they are measured.

Per engine step and rank (from aligned hook records):
    transfer_us = sum over the step's collectives of the instance's minimum duration over ranks
    wait_us     = sum of (this rank's duration - that minimum)          (rank skew, not link speed)
    compute_us  = step_us - transfer_us - wait_us                       (everything else in the step)
Per level and rank, over the *decode pairs* of the level's steady window: a decode
step i and the step i-1 before it on the same rank (consecutive step counters; step
i-1 of any kind: the prefill that made a stream's first token, a mixed step or a
decode step); prefill and mixed steps themselves, and the idle time before them,
are left out:
    period_us   = t_end(i) - t_end(i-1)      = gap_us(i) + step_us(i)
    gap_us      = t_start(i) - t_end(i-1)    (host gap before the step: scheduling, output processing)
A token is made when its step ends, so a decode token's time is from the end of the
step that made the stream's previous token to the end of its own: over one stream's
tokens 1..n-1 the periods add up to end(last step) - end(prefill), the window the
client's and the delivery term's per-token times span (analysis/delivery.py), with
no step or gap at the window's edges left out (a start-to-start period, used until
2026-12-06, left out the gap after the prefill and the last decode step: a 1.1 s
stall in one request's last step then put the split 6% under the client's time).
Every running stream gets one token per decode step, so the engine's per-token
time is the mean period, and
    mean period = mean compute + mean transfer + mean wait + mean gap   (exact: means add).
Sampled collective timing (CUDA graphs, one step in TPCOMM_GRAPH_SAMPLE_EVERY):
transfer and wait are means over the *sampled* pairs, compute = mean step time -
transfer - wait, so unrecorded steps never count as zeros. Where a rank's steps carry
CUDA-graph rows (timing `cuda-event-graph`, `n_graph` below) or untimed collectives
(`untimed_collectives` of the hook's step rows: collectives that ran in a sampled step
without a row, e.g. graph timing off or a sample not read), a step is sampled when its
graph replays were read: n_graph > 0 and nothing untimed. A step's eager rows alone do
not make it sampled: vLLM's logits all-gather runs eagerly in every TP decode step, so
counting every step with a row averaged the graph's collectives over ~8x the sampled
steps (and with graph timing off gave a "transfer" that was the logits gather alone).
Elsewhere (eager or CPU workers: every collective has a row) every step with a row is.
The level's terms are the means over ranks of each rank's terms (still exact).

Which clock (`clock` in what engine_split returns): on CUDA workers the hook's step
rows carry the GPU's own step boundaries (gpu_start_ns / gpu_end_ns, hook/gpuclock.py)
and rank_steps puts the steps on that clock: step = GPU span, gap = GPU idle between
steps, period = GPU end to end. Under vLLM's async scheduling (the CUDA default)
the host span is only the enqueue span, one step ahead of the GPU, so the host clock
would split wrong there; on the GPU clock the four terms add up to the GPU period.
Without GPU columns (CPU workers, older records) the host clock stays; a GPU worker's
step whose GPU span was not read is left out of the pairs (counted).

Units: *_us microseconds, *_ms milliseconds, t_*_ns wall clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.terms import ENGINE_TERMS as TERMS

STEP_COLUMNS = [
    "concurrency",
    "repeat",
    "step",
    "step_us",
    "compute_us",
    "transfer_us",
    "wait_us",
    "n_collectives",
    "num_seqs",
    "num_tokens",
    "kind",
    "ranks",
    "t_start_ns",
    "t_end_ns",
]


GPU_COLUMNS = ("gpu_start_ns", "gpu_end_ns")


def _ns(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A ns column as float (NaN where missing, for the checks) and as int64 (exact: a Unix time in ns needs 61
    bits, a float64 keeps 53, so the float is off by up to 128 ns)."""
    v = pd.to_numeric(col, errors="coerce")
    f = v.to_numpy(dtype=np.float64, na_value=np.nan)
    exact = v.dtype.kind in "iu" or (v.dtype.kind in "O" and not v.isna().any())
    return f, (v.to_numpy(dtype=np.int64) if exact else np.nan_to_num(f).astype(np.int64))


def _on_step_clock(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps on the clock the split uses: the GPU's where the records have it (t_start_ns/t_end_ns/duration_us
    replaced, the host's kept as host_*), else the host's. Adds `clock`: "gpu", "host", or "none" (a GPU
    worker's step whose GPU span was not read: no clock the split can use)."""
    out = steps.copy()
    out["host_t_start_ns"], out["host_t_end_ns"] = out["t_start_ns"], out["t_end_ns"]
    if not all(c in out.columns for c in GPU_COLUMNS):
        return out.assign(clock="host")
    g0, i0 = _ns(out["gpu_start_ns"])
    g1, i1 = _ns(out["gpu_end_ns"])
    ok = np.isfinite(g0) & np.isfinite(g1) & (g0 > 0) & (g1 >= g0)
    t0 = out["t_start_ns"].to_numpy(dtype=np.int64).copy()
    t1 = out["t_end_ns"].to_numpy(dtype=np.int64).copy()
    t0[ok], t1[ok] = i0[ok], i1[ok]
    return out.assign(
        t_start_ns=t0,
        t_end_ns=t1,
        duration_us=(t1 - t0) / 1e3,
        clock=np.where(ok, "gpu", "none"),
    )


def rank_steps(aligned: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step): the step's time split on that rank, on the GPU clock where the step rows
    carry it (see the module docstring; `clock` says which per row)."""
    steps = _on_step_clock(steps)
    if "untimed_collectives" not in steps.columns:
        steps = steps.assign(untimed_collectives=0)
    per = collective_sums(aligned[aligned["step"] >= 0], ["rank", "step"], graph=True)
    out = steps.merge(per, on=["rank", "step"], how="left")
    for c in ("coll_us", "transfer_us", "wait_us"):
        out[c] = out[c].fillna(0.0)
    for c in ("n_collectives", "n_graph"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out["compute_us"] = out["duration_us"] - out["coll_us"]
    return out.rename(columns={"duration_us": "step_us"})


def collective_sums(aligned: pd.DataFrame, keys: list[str], graph: bool = False) -> pd.DataFrame:
    """Per `keys` (a rank's step, at least): the aligned collectives' coll_us, transfer_us, wait_us and
    n_collectives; with `graph`, n_graph (rows read from a sampled CUDA graph replay). Shared by attribute's
    split (rank_steps) and the replay's (probe/replay_results.step_table)."""
    aggs = {
        "coll_us": ("duration_us", "sum"),
        "transfer_us": ("transfer_us", "sum"),
        "wait_us": ("wait_us", "sum"),
        "n_collectives": ("duration_us", "size"),
    }
    if graph:
        aligned = aligned.assign(_graph=_graph_rows(aligned))
        aggs["n_graph"] = ("_graph", "sum")
    return aligned.groupby(keys, sort=False).agg(**aggs).reset_index()


def _graph_rows(a: pd.DataFrame) -> np.ndarray:
    """1 for rows read from a sampled CUDA graph replay (the hook's `cuda-event-graph` timing), else 0."""
    if "timing" not in a.columns:
        return np.zeros(len(a), dtype=np.int64)
    return (a["timing"] == "cuda-event-graph").to_numpy(dtype=np.int64)


def sampled_mask(p: pd.DataFrame) -> pd.Series:
    """Which rank_steps rows are sampled steps (their collectives all read), rank by rank: see the module
    docstring. The one rule for the split, top_sites, compare's resampling and selfcheck."""
    zero = pd.Series(0, index=p.index)
    untimed = p["untimed_collectives"] if "untimed_collectives" in p.columns else zero
    n_graph = p["n_graph"] if "n_graph" in p.columns else zero
    by_rank = p["rank"] if "rank" in p.columns else zero
    graph_mode = ((n_graph > 0) | (untimed > 0)).groupby(by_rank).transform("any").astype(bool)
    return ((n_graph > 0) & (untimed == 0)).where(graph_mode, p["n_collectives"] > 0).astype(bool)


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
    out = g.agg(
        step_us=("step_us", "mean"),
        compute_us=("compute_us", "mean"),
        transfer_us=("transfer_us", "mean"),
        wait_us=("wait_us", "mean"),
        n_collectives=("n_collectives", "max"),
        num_seqs=("num_seqs", "max"),
        num_tokens=("num_tokens", "max"),
        kind=("kind", "first"),
        ranks=("rank", "nunique"),
        t_start_ns=("t_start_ns", "min"),
        t_end_ns=("t_end_ns", "max"),
    ).reset_index()
    return out[STEP_COLUMNS]


def decode_pairs(rank_rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of `rank_rows` (one level) whose step is a decode step with the step before it on the same rank
    recorded (any kind but empty: at C=1 a stream's first decode step follows its prefill), with period_us
    (end to end) and gap_us (the host gap before the step) added. Empty steps (no scheduled token: PP's batch
    queue runs one per stage slot) between the two keep them consecutive when every step number between them
    was recorded as empty; their time is then part of the period (in the host gap)."""
    r = rank_rows.sort_values(["rank", "step"])
    empty = (r["kind"] == "empty").to_numpy()
    seen_empty = pd.Series(empty.astype(np.int64), index=r.index).groupby(r["rank"]).cumsum()
    r = r[~empty].assign(_empties=seen_empty[~empty])
    # Int64 (nullable) so that the shift's missing first row does not turn ns times into floats (128 ns off)
    r = r.assign(t_end_ns=r["t_end_ns"].astype("Int64"))
    prv = r.groupby("rank", sort=False)[["step", "t_end_ns", "kind", "_empties"]].shift(1)
    skipped = r["step"] - prv["step"] - 1
    ok = ((r["kind"] == "decode") & prv["kind"].notna() & (skipped == r["_empties"] - prv["_empties"])).to_numpy()
    if "clock" in r.columns:  # both steps of a pair on the same usable clock
        pclock = r.groupby("rank", sort=False)["clock"].shift(1)
        ok = ok & (r["clock"].to_numpy() == pclock.to_numpy()) & (r["clock"].to_numpy() != "none")
    out = r[ok].drop(columns="_empties").astype({"t_end_ns": "int64"})
    pend = prv.loc[ok, "t_end_ns"].to_numpy(dtype=np.int64)
    out["period_us"] = (out["t_end_ns"].to_numpy(dtype=np.int64) - pend) / 1e3
    out["gap_us"] = (out["t_start_ns"].to_numpy(dtype=np.int64) - pend) / 1e3
    return out


def terms_from_sums(n, n_sampled, step_us, gap_us, period_us, transfer_us, wait_us, collectives: bool) -> dict:
    """The one split arithmetic: a rank's per-token period and terms (ms) from sums over its decode pairs (n
    pairs, n_sampled of them with records; transfer and wait summed over the sampled ones). Scalars (one
    rank, `engine_split`) or arrays (compare's bootstrap: replicates x ranks) alike; "ok" is False where a
    rank has no term (collectives in the level but no sampled pair: such a rank is left out)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        step, gap, period = np.divide(step_us, n), np.divide(gap_us, n), np.divide(period_us, n)
        if collectives:  # means over the pairs whose step carries records (sampled CUDA-graph timing)
            transfer, wait = np.divide(transfer_us, n_sampled), np.divide(wait_us, n_sampled)
            ok = np.greater(n_sampled, 0)
        else:
            transfer = wait = np.zeros_like(step)
            ok = np.greater(n, 0)
    return {
        "period": period / 1e3,
        "compute": (step - transfer - wait) / 1e3,
        "transfer": transfer / 1e3,
        "wait": wait / 1e3,
        "host_gap": gap / 1e3,
        "ok": ok,
    }


def carries_collectives(rank_rows: pd.DataFrame) -> bool:
    """Whether any step of the level carries collectives, timed or not: with none (TP 1) transfer and wait are
    truly 0; with some, they are means over the sampled pairs (terms_from_sums)."""
    if rank_rows.empty:
        return False
    untimed = rank_rows["untimed_collectives"] if "untimed_collectives" in rank_rows.columns else 0
    return bool(((rank_rows["n_collectives"] > 0) | (untimed > 0)).any())


def _rank_terms(p: pd.DataFrame, collectives: bool) -> dict:
    """One rank's per-token terms (ms) over its decode pairs (terms_from_sums)."""
    s = sampled_mask(p).to_numpy()
    t = terms_from_sums(
        n=len(p),
        n_sampled=int(s.sum()),
        step_us=float(p["step_us"].sum()),
        gap_us=float(p["gap_us"].sum()),
        period_us=float(p["period_us"].sum()),
        transfer_us=float(p["transfer_us"].to_numpy()[s].sum()),
        wait_us=float(p["wait_us"].to_numpy()[s].sum()),
        collectives=collectives,
    )
    if not t["ok"]:
        return {"pairs": int(len(p)), "sampled_pairs": int(s.sum()), "per_token_ms": None}
    return {
        "pairs": int(len(p)),
        "sampled_pairs": int(s.sum()),
        "period_ms": float(t["period"]),
        "per_token_ms": {k: float(t[k]) for k in TERMS},
    }


_CLOCK_NOTES = {
    "gpu": "GPU clock: step boundaries and collectives from CUDA events; period = GPU end to end, "
    "host_gap = GPU idle before the step",
    "host": "host clock: step boundaries from the worker's thread (exact where collectives block the host, as on CPU)",
}


def engine_split(rank_rows: pd.DataFrame) -> dict:
    """The engine's per-token time of one level and its four terms, per rank and averaged over ranks.

    `rank_rows`: rank_steps() rows of one level's window (all step kinds)."""
    pairs = decode_pairs(rank_rows) if not rank_rows.empty else rank_rows
    kinds = rank_rows["kind"].value_counts().to_dict() if not rank_rows.empty else {}
    ranks_n = max(rank_rows["rank"].nunique(), 1) if not rank_rows.empty else 1
    clocks = set(rank_rows["clock"]) if "clock" in rank_rows.columns and not rank_rows.empty else {"host"}
    clock = "gpu" if clocks & {"gpu", "none"} else "host"
    out = {
        "engine_ms_per_token": None,
        "per_token_ms": None,
        "by_rank": [],
        "decode_pairs": 0,
        "steps_in_window": {k: int(v // ranks_n) for k, v in kinds.items()},
        "clock": clock,
        "clock_note": _CLOCK_NOTES[clock],
    }
    if clock == "gpu":
        out["steps_without_gpu_span"] = int((rank_rows["clock"] == "none").sum())
    if pairs.empty:
        out["note"] = "no decode step recorded with the step before it in this level's window" + (
            " with their GPU span read" if clock == "gpu" and out["steps_without_gpu_span"] else ""
        )
        return out
    # decode steps by how many sequences each carried (one rank's count: every rank runs the same steps)
    one = pairs[pairs["rank"] == pairs["rank"].min()]
    out["seqs_counts"] = {int(k): int(v) for k, v in one["num_seqs"].value_counts().items()}
    collectives = carries_collectives(rank_rows)
    by_rank = []
    for rank, p in pairs.groupby("rank", sort=True):
        t = _rank_terms(p, collectives)
        if t["per_token_ms"] is not None:
            by_rank.append({"rank": int(rank), **t})
    if not by_rank:
        untimed_pairs = int((pairs["untimed_collectives"] > 0).sum()) if "untimed_collectives" in pairs else 0
        out["note"] = (
            f"collectives ran untimed in the sampled decode steps ({untimed_pairs} pairs: CUDA graph timing off at "
            "server start, TPCOMM_GRAPH_TIMING=1 turns it on, or graph samples not read): transfer and wait "
            "not measured"
            if untimed_pairs
            else "no decode pair in this level's window carries collective records (sampling too sparse)"
        )
        return out
    terms = {k: float(np.mean([r["per_token_ms"][k] for r in by_rank])) for k in TERMS}
    total = float(np.mean([r["period_ms"] for r in by_rank]))
    out.update(
        engine_ms_per_token=total,
        per_token_ms=terms,
        by_rank=by_rank,
        decode_pairs=int(len(pairs) // max(len(by_rank), 1)),
        sampled_pairs_share=float(np.mean([r["sampled_pairs"] / r["pairs"] for r in by_rank])),
        seqs_per_step=float(pairs["num_seqs"].mean()),
    )
    seqs = out["seqs_per_step"]
    tr, wa = terms["transfer"], terms["wait"]
    # Ceilings: what one stream would get if a single term were all there is (tok/s per stream x streams/step).
    out.update(
        comm_only_tok_per_s=seqs / (tr / 1e3) if tr > 0 else None,
        comm_and_wait_only_tok_per_s=seqs / ((tr + wa) / 1e3) if tr + wa > 0 else None,
        compute_only_tok_per_s=seqs / (terms["compute"] / 1e3) if terms["compute"] > 0 else None,
    )
    return out


def top_sites(aligned_level: pd.DataFrame, step_rows: pd.DataFrame, n: int = 8) -> list[dict]:
    """Collectives grouped by (group, op, bytes): count and time per decode step per rank
    (over the decode steps that carry records; where CUDA-graph rows exist, over the steps whose graph
    replays were read, as the split counts them: eager rows of the other steps would dilute the counts)."""
    if aligned_level.empty or step_rows.empty:
        return []
    a = aligned_level[aligned_level["step"].isin(step_rows["step"])]
    g_rows = _graph_rows(a).astype(bool)
    if g_rows.any():
        a = a[a["step"].isin(a.loc[g_rows, "step"])]
    n_rank_steps = max(a.groupby("rank")["step"].nunique().mean(), 1) if not a.empty else 1
    ranks = max(a["rank"].nunique(), 1)
    g = (
        a.groupby(["group", "op", "bytes"])
        .agg(
            calls=("duration_us", "size"),
            time_us=("duration_us", "sum"),
            transfer_us=("transfer_us", "sum"),
            wait_us=("wait_us", "sum"),
            backend=("backend", "first"),
        )
        .reset_index()
    )
    per = ranks * n_rank_steps
    g["count_per_step"] = g["calls"] / per
    for c in ("time_us", "transfer_us", "wait_us"):
        g[c + "_per_step"] = g[c] / per
    g = g.sort_values("time_us_per_step", ascending=False).head(n)
    cols = [
        "group",
        "op",
        "bytes",
        "backend",
        "count_per_step",
        "time_us_per_step",
        "transfer_us_per_step",
        "wait_us_per_step",
    ]
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in g[cols].to_dict("records")]


def shares_pct(terms: dict[str, float], total: float) -> dict[str, float]:
    """Shares of `total` rounded to 0.1 so that the printed shares sum to exactly 100.0 (largest remainder)."""
    raw = {k: 1000.0 * v / total for k, v in terms.items()}  # in tenths of a percent
    floor = {k: int(v // 1) for k, v in raw.items()}
    left = 1000 - sum(floor.values())
    for k in sorted(raw, key=lambda k: raw[k] - floor[k], reverse=True)[: max(left, 0)]:
        floor[k] += 1
    return {k: floor[k] / 10.0 for k in terms}
