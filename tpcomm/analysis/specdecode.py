"""Speculative decoding (MTP, EAGLE, n-gram) seen in a level's decode steps, and the split per accepted token.

Under speculative decoding a decode step schedules 1 + the request's draft tokens (the hook's step rows:
num_tokens > num_seqs in a decode step) and emits 1 + the accepted ones, so the split's per-step figures
overstate the time per token by the tokens a step emits. The hook does not read accepted tokens (no GPU sync
in the step path; docs/attribute.md says where vLLM 0.32 keeps them). At C=1 they are measured here without
it: each request's own decode steps (its prefill segment, pairing.by_prefill) against the tokens the client
received for it after the first, pooled over the level's requests. Above C=1 the step of a token is not
known: not measured, and said so."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.rundir.results import SpecDecode, Terms

DECODE = "decode"


def spec_decode(
    rows: pd.DataFrame, pairs: pd.DataFrame, requests: pd.DataFrame, concurrency: int, split: dict
) -> SpecDecode | None:
    """None when no decode step of the level scheduled a draft token; else the drafts per sequence and, at C=1,
    the tokens per decode step and the split (`split`: engine_split's dict) per accepted token."""
    if rows.empty or not {"num_tokens", "num_seqs", "kind", "step"} <= set(rows.columns):
        return None
    d = rows[rows["kind"] == DECODE].groupby("step").agg(tokens=("num_tokens", "max"), seqs=("num_seqs", "max"))
    drafts = float((d["tokens"] - d["seqs"]).clip(lower=0).sum()) if len(d) else 0.0
    if drafts <= 0 or d["seqs"].sum() <= 0:
        return None
    per_seq = drafts / float(d["seqs"].sum())
    if concurrency != 1:
        return SpecDecode(per_seq, None, 0, None, None, _ABOVE_C1)
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
        why = "no request paired with its own decode steps (one prefill step per request is needed at C=1)"
        return SpecDecode(per_seq, None, 0, None, None, why)
    tps = tokens / steps
    ms, terms = split.get("engine_ms_per_token"), split.get("per_token_ms")
    return SpecDecode(
        drafts_per_seq=per_seq,
        tokens_per_step=tps,
        requests=n_req,
        engine_ms_per_token=ms / tps if ms else None,
        per_token_ms=Terms(**{k: v / tps for k, v in terms.items()}) if terms else None,
    )


_ABOVE_C1 = (
    "accepted tokens per step not measured above C=1 (which step made a token is known only one stream at a "
    "time; the hook does not read them)"
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
    return (
        f"{head}. Each step emitted {s.tokens_per_step:.2f} tokens ({s.tokens_per_step - 1:.2f} accepted drafts; "
        f"the client's tokens over each request's own decode steps, {s.requests} requests): per accepted token "
        f"{per}, each term over {s.tokens_per_step:.2f}"
    )
