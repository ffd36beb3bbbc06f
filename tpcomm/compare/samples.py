"""One level of one run as the comparison resamples it: the decode pairs the headline was computed over,
cut into blocks, each block's sums per rank, the per-request delivery, and (where the blocks are its requests)
the delivery term's per-request sums.

The pairs are found by attribute's own code on the run's own files (attribution/steps_by_rank.parquet,
load/*.parquet), so the statistic resampled is exactly the headline's: `client_side` (analysis/attribution.py)
decides which decode steps the level's split rests on (`split_requests`: at C=1 the delivery term's requests'
own steps where it is measured, else the closure's compared requests' where it is judged, else the whole steady
window) and `decode_pairs` (analysis/split.py) which of them are
pairs. The point estimate from the block sums must equal the summary's figure; a level whose files do not
reproduce its summary gets no interval (its `problem` says why).

Blocks (decode steps are autocorrelated: a slow patch on a shared host lasts many steps, so single steps are
not independent draws):
- "request": where the split rests on some requests' own steps (one stream at a time, C=1), each request's
  decode pairs are one block, and the closure's delivery (client - engine time per token) goes with it when
  those are the closure's compared requests (else it is resampled over them on its own);
- "steps": otherwise, runs of `block_len` consecutive decode steps (one request's decode length, at least
  the cube root of the pairs), with the delivery resampled over the compared requests on its own.

Per block and rank the sums add exactly: period = step + gap and step = compute + transfer + wait per pair,
so any weighting of blocks gives terms that add up to its per-token time (means of sums).

Units: *_us microseconds in the sums, *_ms milliseconds in what leaves this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tpcomm.analysis.attribution import client_side, level_step_requests, on_one_clock
from tpcomm.analysis.pairing import output_rank
from tpcomm.analysis.split import carries_collectives, decode_pairs, sampled_mask, terms_from_sums
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution, LevelSplit
from tpcomm.terms import ENGINE_TERMS

# Block sums per (block, rank): the columns of `LevelSample.sums`.
SUMS = ("n", "n_sampled", "step_us", "gap_us", "period_us", "transfer_us", "wait_us", "seqs")
MIN_BLOCKS = 8  # fewer blocks than this: shorter blocks (a bootstrap over 3 blocks says little)
REPRODUCE_REL = 1e-6  # recomputed headline vs summary: relative tolerance (float sums in another order)


@dataclass
class LevelSample:
    concurrency: int
    repeat: int
    unit: str  # "request" | "steps"
    block_len: int | None  # decode steps per block ("steps"), None for requests
    blocks: int
    ranks: int
    sums: np.ndarray  # (blocks, ranks, len(SUMS))
    collectives: bool  # the level's steps carry collectives (TP > 1); else transfer and wait are 0
    delivery_ms: np.ndarray  # per compared request: client - engine time per token
    delivery_joint: bool  # delivery_ms[i] belongs to block i (resampled together)
    # per request of the delivery term (the term measured): (client ms, delivery ms, tokens - 1) over the
    # request's tokens (analysis/delivery.request_sums); else None. Row i is block i (resampled with the engine's
    # blocks) where the blocks are those requests (C=1); above C=1 (paired by request id, the blocks are runs of
    # steps that several requests share) the rows are drawn on their own (delivery_rows_joint False).
    delivery_rows: np.ndarray | None = None
    delivery_rows_joint: bool = True
    problem: str | None = None  # why no interval: the files do not reproduce the summary
    point: dict[str, float] = field(default_factory=dict)


def load_samples(rd: RunDir, att: Attribution) -> tuple[dict[tuple[int, int], LevelSample], str | None]:
    """Every attributed level's sample, or ({}, why) when the run directory lacks the per-step data."""
    rows_all, why = _rank_rows(rd, att)
    if rows_all is None:
        return {}, why
    req, tok = rd.read_table(C.LOAD_REQUESTS), rd.read_table(C.LOAD_TOKENS)
    sreq = rd.read_table(C.HOOK_STEP_REQUESTS) if rd.exists(C.HOOK_STEP_REQUESTS) else None
    if req is None or tok is None:
        return {}, "load/requests.parquet or load/tokens.parquet is missing"
    if "in_stats" in req.columns:  # as analyse_run_dir: only the requests the level's statistics use
        req = req[req["in_stats"]]
        tok = tok[tok["request_id"].isin(req["request_id"])]
    out = {}
    every = _every_step(rd) if sreq is not None and not sreq.empty else None
    out_rank = output_rank(att.conditions.get("ranks"), att.conditions.get("tp"))  # as analyse_run_dir
    for lv in att.levels:
        if not lv.attributed or lv.engine_ms_per_token is None:
            continue
        c, rep = lv.concurrency, lv.repeat
        rows = rows_all[(rows_all["concurrency"] == c) & (rows_all["repeat"] == rep)]
        lreq = req[(req["concurrency"] == c) & (req["repeat"] == rep)]
        ltok = tok[(tok["concurrency"] == c) & (tok["repeat"] == rep)]
        mine = level_step_requests(sreq, lreq)
        out[(c, rep)] = level_sample(lv, rows, lreq, ltok, att.conditions.get("output_len"), mine, every, out_rank)
    older = _older_periods(rd)
    for s in out.values():
        if older and s.problem and "no interval" in s.problem:
            s.problem += f"; {older}"
    return out, None


def _older_periods(rd: RunDir) -> str | None:
    """Why a summary may not be reproduced by this tpcomm's split: it is stamped before end-to-end decode periods
    (schema_version 3 or older: start to start, but for a day's runs), and how to redo it. None for a summary of
    this definition."""
    doc = rd.read_json(C.ATTR_SUMMARY)  # the bounded, checked reader the Attribution came from
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and version < C.PERIODS_END_TO_END:
        return (
            f"its summary has schema_version {version}, older than this tpcomm's end-to-end decode periods "
            f"(schema_version {C.PERIODS_END_TO_END}; before, start to start): where its records are whole, "
            f"tpcomm attribute --reanalyse {rd.path} redoes it"
        )
    return None


def _every_step(rd: RunDir) -> pd.DataFrame | None:
    """Every step of the run (rank_steps rows, not cut to the levels' windows), on one clock as analyse_run_dir
    puts them: the steps of requests paired by their ids (client_side)."""
    coll, steps = rd.read_table(C.HOOK_COLLECTIVES), rd.read_table(C.HOOK_STEPS)
    if coll is None or steps is None or coll.empty or steps.empty:
        return None
    from tpcomm.analysis.split import rank_steps

    aligned, steps, _, _ = on_one_clock(coll, steps, rd.read_json(C.HOOK_STATUS))
    return rank_steps(aligned, steps)


def _rank_rows(rd: RunDir, att: Attribution) -> tuple[pd.DataFrame | None, str | None]:
    rows = rd.read_table(C.ATTR_STEPS_BY_RANK)
    if rows is not None and {"concurrency", "repeat", "kind", "t_start_ns", "t_end_ns"} <= set(rows.columns):
        return rows, None
    # Older run directories: the same rows from the hook records, as analyse_run_dir makes them.
    coll, steps = rd.read_table(C.HOOK_COLLECTIVES), rd.read_table(C.HOOK_STEPS)
    if coll is None or steps is None or coll.empty or steps.empty:
        return None, "neither attribution/steps_by_rank.parquet nor the hook records (hook/*.parquet) are in it"
    from tpcomm.analysis.align import align
    from tpcomm.analysis.split import assign_levels, rank_steps

    return assign_levels(rank_steps(align(coll), steps), att.windows), None


def level_sample(
    lv: LevelSplit,
    rows: pd.DataFrame,
    req: pd.DataFrame,
    tok: pd.DataFrame,
    output_len: int | None,
    step_reqs: pd.DataFrame | None = None,
    every_step: pd.DataFrame | None = None,
    out_rank: int | None = None,
) -> LevelSample:
    """The level's decode pairs in blocks (see the module docstring); `point` = the block sums' estimate.
    `step_reqs`: the level's rows of hook/step_requests.parquet (client_side pairs by them above C=1)."""
    c = lv.concurrency
    cs = client_side(  # as analyse_run_dir paired it: on the server's clock as the level was placed
        rows, req, tok, c, step_reqs=step_reqs, every_step=every_step, out_rank=out_rank, server_clock=lv.server_clock
    )
    compared = cs["compared"]
    pairs_doc = cs["pairs"]
    by_request = bool(cs["split_requests"])
    if by_request:  # the split rests on these requests' own steps (client_side: the closure's or delivery's)
        own = pairs_doc[pairs_doc["request_id"].isin(cs["split_requests"])]
        step_req = {s: int(r) for r, ids in zip(own["request_id"], own["steps"]) for s in ids}
        pairs = decode_pairs(rows[rows["step"].isin(list(step_req))])
        order = sorted(cs["split_requests"])
        block_idx = np.searchsorted(np.array(order), pairs["step"].map(step_req).to_numpy())
        block_len = None
    else:
        pairs = decode_pairs(rows) if not rows.empty else rows
        steps = np.sort(pairs["step"].unique()) if len(pairs) else np.array([], dtype=np.int64)
        block_len = _block_len(len(steps), output_len)
        block_idx = np.searchsorted(steps, pairs["step"].to_numpy()) // block_len if len(steps) else np.array([])
        order = list(range(int(math.ceil(len(steps) / block_len)))) if len(steps) else []
    d = pairs_doc[pairs_doc["request_id"].isin(compared)].set_index("request_id")
    # the closure's delivery (its compared requests) goes with the blocks when they are those same requests
    joint = by_request and list(order) == sorted(compared)
    delivery = (d["client_ms_per_token"] - d["engine_ms_per_token"]).reindex(order if joint else compared).to_numpy()
    # the delivery term's own requests are the blocks (client_side rests the split on them where it is measured)
    drows = cs["delivery_rows"]
    rows_joint = bool(by_request and drows and set(drows) == set(order))
    # blocks of requests that are not the term's own (not expected): no sample of the term
    usable = drows and (rows_joint or not by_request)
    term_rows = np.array([drows[r] for r in (order if rows_joint else sorted(drows))]) if usable else None
    sample = LevelSample(
        concurrency=c,
        repeat=lv.repeat,
        unit="request" if by_request else "steps",
        block_len=block_len,
        blocks=len(order),
        ranks=0,
        sums=np.zeros((0, 0, len(SUMS))),
        collectives=carries_collectives(rows),
        delivery_ms=np.asarray(delivery, dtype=float),
        delivery_joint=joint,
        delivery_rows=term_rows,
        delivery_rows_joint=rows_joint,
    )
    if pairs.empty:
        sample.problem = "no decode pairs in the level's files"
        return sample
    sample.sums, sample.ranks = block_sums(pairs, block_idx, len(order))
    sample.point = point_estimate(sample)
    sample.problem = _reproduces(sample, lv, cs["split"])
    if sample.problem is None and sample.blocks < 2:
        sample.problem = f"one {'request' if by_request else 'block of steps'} only: nothing to resample"
    return sample


def _block_len(n_steps: int, output_len: int | None) -> int:
    """One request's decode length (a slow patch as long as a request stays in one block), at least the cube
    root of the pairs, and short enough to leave MIN_BLOCKS blocks."""
    want = max((output_len or 0) - 1, math.ceil(n_steps ** (1 / 3)), 1)
    return max(1, min(want, n_steps // MIN_BLOCKS)) if n_steps >= MIN_BLOCKS else max(1, n_steps)


def block_sums(pairs: pd.DataFrame, block_idx: np.ndarray, blocks: int) -> tuple[np.ndarray, int]:
    ranks = np.sort(pairs["rank"].unique())
    r_idx = np.searchsorted(ranks, pairs["rank"].to_numpy())
    sampled = sampled_mask(pairs).to_numpy().astype(float)  # the split's rule (graph replays read)
    cols = {
        "n": np.ones(len(pairs)),
        "n_sampled": sampled,
        "step_us": pairs["step_us"].to_numpy(dtype=float),
        "gap_us": pairs["gap_us"].to_numpy(dtype=float),
        "period_us": pairs["period_us"].to_numpy(dtype=float),
        "transfer_us": pairs["transfer_us"].to_numpy(dtype=float) * sampled,
        "wait_us": pairs["wait_us"].to_numpy(dtype=float) * sampled,
        "seqs": pairs["num_seqs"].to_numpy(dtype=float),
    }
    out = np.zeros((blocks, len(ranks), len(SUMS)))
    flat = block_idx.astype(np.int64) * len(ranks) + r_idx
    for j, k in enumerate(SUMS):
        out[:, :, j] = np.bincount(flat, weights=cols[k], minlength=blocks * len(ranks)).reshape(blocks, len(ranks))
    return out, len(ranks)


def estimates(sample: LevelSample, weights: np.ndarray) -> dict[str, np.ndarray]:
    """The level's per-token time and terms (ms) and tok/s for each row of `weights` (replicates x blocks:
    how often each block is drawn). Per rank as split.py's _rank_terms, then the mean over ranks."""
    s = np.einsum("bk,krj->brj", weights, sample.sums)  # (replicates, ranks, SUMS)
    get = {k: s[:, :, j] for j, k in enumerate(SUMS)}
    t = terms_from_sums(**{k: get[k] for k in SUMS if k != "seqs"}, collectives=sample.collectives)
    with np.errstate(invalid="ignore", divide="ignore"):
        seqs = get["seqs"].sum(axis=1) / get["n"].sum(axis=1)

    def mean(x):  # over ranks; a rank with no sampled pair in a draw has no terms (split.py leaves it out)
        return np.nanmean(np.where(t["ok"], x, np.nan), axis=1)

    per_token = mean(t["period"])
    out = {"per_token": per_token, **{k: mean(t[k]) for k in ENGINE_TERMS}}
    out["collective"] = out["transfer"] + out["wait"]
    out["tok_per_s"] = 1e3 / per_token * seqs
    if sample.delivery_rows is not None and sample.delivery_rows_joint:
        out.update(term_estimates(sample.delivery_rows, weights))
    return out


def term_estimates(rows: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """The fifth term and the client's per-token time, pooled by token, for each row of `weights` (replicates x
    requests: how often each request's (client ms, delivery ms, tokens - 1) row is drawn)."""
    d = weights @ rows  # (replicates, 3)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"delivery_term": d[:, 1] / d[:, 2], "client_per_token": d[:, 0] / d[:, 2]}


def point_estimate(sample: LevelSample) -> dict[str, float]:
    est = estimates(sample, np.ones((1, sample.blocks)))
    if sample.delivery_rows is not None and not sample.delivery_rows_joint:
        est.update(term_estimates(sample.delivery_rows, np.ones((1, len(sample.delivery_rows)))))
    out = {k: float(v[0]) for k, v in est.items()}
    if sample.delivery_ms.size:
        out["delivery"] = float(np.percentile(sample.delivery_ms[np.isfinite(sample.delivery_ms)], 50))
    return out


def _reproduces(sample: LevelSample, lv: LevelSplit, split: dict) -> str | None:
    """None when the block sums give the summary's headline and terms, else why not (no interval then)."""
    p = sample.point
    want = {"per_token": lv.engine_ms_per_token, **(lv.per_token_ms.as_dict() if lv.per_token_ms else {})}
    again = split.get("engine_ms_per_token")
    for k, v in want.items():
        if v is None or not math.isclose(p[k], v, rel_tol=REPRODUCE_REL, abs_tol=1e-9):
            return (
                f"the run's per-step files give {k.replace('_', ' ')} {p[k]:.6g} ms, its summary {v} ms "
                "(files trimmed or written by another tpcomm): no interval"
            )
    if again is None or not math.isclose(p["per_token"], again, rel_tol=REPRODUCE_REL):
        return "attribute's split of these files differs from the block sums: no interval"
    if lv.delivery is not None and "delivery" in p and not math.isclose(p["delivery"], lv.delivery.ms, abs_tol=1e-9):
        return f"the run's files give delivery {p['delivery']:.6g} ms, its summary {lv.delivery.ms} ms: no interval"
    dt = lv.delivery_term
    for k, v in (("delivery_term", dt.ms if dt else None), ("client_per_token", dt.client_ms if dt else None)):
        if k in p and (v is None or not math.isclose(p[k], v, rel_tol=REPRODUCE_REL, abs_tol=1e-9)):
            return f"the run's files give {k.replace('_', ' ')} {p[k]:.6g} ms, its summary {v} ms: no interval"
    return None
