"""Speculative decoding (MTP, EAGLE, n-gram) seen in a level's decode steps, and the split per accepted token.

Under speculative decoding a decode step schedules 1 + the request's draft tokens (the hook's step rows:
num_tokens > num_seqs in a decode step) and emits 1 + the accepted ones, so the split's per-step figures
overstate the time per token by the tokens a step emits. The hook reads no accepted token (no GPU sync in the
step path; docs/attribute.md says where vLLM 0.32 keeps them); the tokens a step emitted are measured here from
what the client received:

- at any concurrency, from the steps the hook saw serve each of the client's requests (its step requests: step,
  request, tokens scheduled): a request's leading steps up to its prompt's length are its prefill, the rest its
  decode steps, and the client received its tokens after the first from those; pooled over the level's requests,
  with the share of the scheduled drafts that were accepted;
- at C=1 without step requests (an older hook, the profiler route), from each request's own decode steps (its
  prefill segment, pairing.by_prefill).

Otherwise not measured, and said so."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpcomm.rundir.results import SpecDecode, Terms

DECODE = "decode"
BY_STEP_REQUESTS = "the steps the hook saw serve each request"
BY_PREFILL_SEGMENTS = "each request's own decode steps (one stream at a time)"


def spec_decode(
    rows: pd.DataFrame,
    pairs: pd.DataFrame,
    requests: pd.DataFrame,
    concurrency: int,
    split: dict,
    step_reqs: pd.DataFrame | None = None,
) -> SpecDecode | None:
    """None when no decode step of the level scheduled a draft token; else the drafts per sequence and, where
    measured, the tokens per decode step and the split (`split`: engine_split's dict) per accepted token.
    `step_reqs`: the hook's step requests of the level's requests (rank, step, request, tokens), or None."""
    if rows.empty or not {"num_tokens", "num_seqs", "kind", "step"} <= set(rows.columns):
        return None
    d = rows[rows["kind"] == DECODE].groupby("step").agg(tokens=("num_tokens", "max"), seqs=("num_seqs", "max"))
    extra = (d["tokens"] - d["seqs"]).clip(lower=0) if len(d) else pd.Series(dtype=float)
    drafts = float(extra.sum())
    if drafts <= 0 or d["seqs"].sum() <= 0:
        return None
    per_seq = drafts / float(d["seqs"].sum())
    if "ok" in requests.columns:
        requests = requests[requests["ok"].fillna(False).astype(bool)]
    # no request drafts more tokens in a decode step than the step's drafts in all
    c = by_step_requests(step_reqs, requests, int(extra.max()))
    if (c is None or not c.requests) and concurrency == 1:
        c = _by_prefill_segments(rows, pairs, requests) or c or Count(0, 0, 0, None, BY_PREFILL_SEGMENTS, _NO_C1_PAIRS)
    if c is None:
        return SpecDecode(per_seq, None, 0, None, None, _ABOVE_C1)
    if not c.requests:
        return SpecDecode(per_seq, None, 0, None, None, c.why)
    tps = c.tokens / c.steps
    ms, terms = split.get("engine_ms_per_token"), split.get("per_token_ms")
    return SpecDecode(
        drafts_per_seq=per_seq,
        tokens_per_step=tps,
        requests=c.requests,
        engine_ms_per_token=ms / tps if ms else None,
        per_token_ms=Terms(**{k: v / tps for k, v in terms.items()}) if terms else None,
        decode_steps=c.steps,
        draft_tokens=c.drafted,
        accepted_tokens=c.tokens - c.steps,
        measured_from=c.method,
    )


@dataclass
class Count:
    """The client's tokens after the first over the decode steps that made them, pooled over requests."""

    tokens: int
    steps: int
    requests: int
    drafted: int | None  # draft tokens its decode steps scheduled (None: not known per request)
    method: str
    why: str = ""  # why no request was counted


def by_step_requests(step_reqs: pd.DataFrame | None, requests: pd.DataFrame, most_drafts: int) -> Count | None:
    """From the steps the hook saw serve each request; None without step requests or prompt lengths. A request's
    prefill is its first step and the steps after it that complete its prompt (a chunk of more than 1 +
    `most_drafts` tokens, or one that completes the prompt exactly; a prefix vLLM served from its cache is not
    scheduled, so the prompt may end short of its length); the rest are its decode steps. Left out, and counted
    by reason: a later step of more than 1 + `most_drafts` tokens (a recompute after preemption), fewer client
    tokens than decode steps, more than they scheduled."""
    need = {"request_id", "output_tokens", "prompt_tokens"}
    if step_reqs is None or step_reqs.empty or not need <= set(requests.columns):
        return None
    if requests.empty:
        return Count(0, 0, 0, None, BY_STEP_REQUESTS, "no request of the level completed")
    sr = step_reqs[step_reqs["rank"] == step_reqs["rank"].min()].sort_values("step")
    by_req = {int(r): g["tokens"].to_numpy(dtype=np.int64) for r, g in sr.groupby("request")}
    tokens = steps = n_req = drafted = 0
    left: dict[str, int] = {}
    for rid, n, p in zip(requests["request_id"], requests["output_tokens"], requests["prompt_tokens"]):
        toks = by_req.get(int(rid))
        n, p = (float(x) if isinstance(x, (int, float, np.number)) else np.nan for x in (n, p))
        if toks is None or not (np.isfinite(n) and np.isfinite(p)) or n < 2:
            continue
        i, s = 0, int(toks[0])
        while s < p and i + 1 < len(toks) and (toks[i + 1] > 1 + most_drafts or s + toks[i + 1] == p):
            i, s = i + 1, s + int(toks[i + 1])
        dec = toks[i + 1 :]
        why = (
            "no decode step seen"
            if not len(dec)
            else "a step of more than 1 + the drafts' tokens after its prefill (a recompute after preemption)"
            if (dec > 1 + most_drafts).any()
            else "fewer tokens than decode steps"
            if n - 1 < len(dec)
            else "more tokens than its decode steps scheduled"
            if n - 1 > dec.sum()
            else ""
        )
        if why:
            left[why] = left.get(why, 0) + 1
            continue
        tokens, steps, n_req = tokens + int(n) - 1, steps + len(dec), n_req + 1
        drafted += int(dec.sum()) - len(dec)
    if not n_req:
        reasons = "; ".join(f"{k}: {v}" for k, v in left.items()) or "none of the level's requests in them"
        why = f"no request's decode steps could be counted from the hook's step requests ({reasons})"
        return Count(0, 0, 0, None, BY_STEP_REQUESTS, why)
    return Count(tokens, steps, n_req, drafted, BY_STEP_REQUESTS)


def _by_prefill_segments(rows: pd.DataFrame, pairs: pd.DataFrame, requests: pd.DataFrame) -> Count | None:
    """C=1: each request's own decode steps (its prefill segment); None where no request was paired so."""
    kind = rows.groupby("step")["kind"].first()
    n_tok = requests.set_index("request_id")["output_tokens"] if "output_tokens" in requests.columns else pd.Series()
    tokens = steps = n_req = 0
    for rid, ids in zip(pairs["request_id"], pairs["steps"]) if "steps" in pairs.columns else ():
        n = pd.to_numeric(pd.Series([n_tok.get(rid)]), errors="coerce").iloc[0]
        n_dec = int((kind.reindex(list(ids)) == DECODE).sum()) if len(ids) else 0
        if not np.isfinite(n) or n < 2 or n_dec < 1:
            continue
        tokens, steps, n_req = tokens + int(n) - 1, steps + n_dec, n_req + 1
    if not n_req:
        return None
    return Count(tokens, steps, n_req, None, BY_PREFILL_SEGMENTS)


_NO_C1_PAIRS = "no request paired with its own decode steps (one prefill step per request is needed at C=1)"
_ABOVE_C1 = (
    "accepted tokens per step not measured above C=1 without the hook's step requests (which step made a token "
    "is known one stream at a time, or from the request ids a hook that records them sees)"
)


def flag(s: SpecDecode) -> str:
    """The level's flag: what the split's figures are under speculative decoding."""
    head = (
        f"speculative decoding: {s.drafts_per_seq:.2f} draft tokens scheduled per sequence per decode step; the "
        "split's figures are per engine step"
    )
    if s.tokens_per_step is None:
        return f"{head}, not per token: {s.why_not}"
    per = f"{s.engine_ms_per_token:.3f} ms" if s.engine_ms_per_token else "not measured"
    acc = (
        f", {s.accepted_tokens} of {s.draft_tokens} drafts accepted"
        if s.draft_tokens and s.accepted_tokens is not None
        else ""
    )
    return (
        f"{head}. Each step emitted {s.tokens_per_step:.2f} tokens per sequence ({s.tokens_per_step - 1:.2f} "
        f"accepted drafts{acc}; the client's tokens after the first over {s.measured_from or BY_PREFILL_SEGMENTS}, "
        f"{s.requests} requests): per accepted token {per}, each term over {s.tokens_per_step:.2f}"
    )
