"""Each request's time per token, on the client's clock and on the engine's, over the same tokens.

The client sees each token arrive; the engine makes token 0 at the end of the request's prefill step and
token k at the end of its k-th decode step. Over tokens k0..k1 of one request:

    client_ms_per_token = (arrival of token k1 - arrival of token k0) / (k1 - k0)
    engine_ms_per_token = (end of the step that made k1 - end of the step that made k0) / (k1 - k0)

"The end of the step" is the end on the rank vLLM takes the step's output from (its output rank: rank 0 with
TP alone), not a mean over ranks: a peer descheduled after its step's work stamps its end late without
delaying the token (step_ends).
A fixed delay between engine and client (API server, network) cancels in each difference. Which tokens:
the client's first and last burst. An API server that falls behind delivers several tokens at once (in one
chunk, or in chunks back to back); such a burst arrives when its LAST token was made, so a burst counts
at the index of its last token (chunk token counts come from the server's token_ids). Tokens k0..k1 run
from the first burst's last token to the last token. When every token arrives on its own this is the
textbook TPOT ((E2E - TTFT) / (tokens - 1)). A request whose bursts leave less than half its tokens between
k0 and k1 was held back (nearly) whole: the client did not observe its pace, and it is compared on
neither side (closure.py names it).

Stall windows: where the gap before a burst exceeds the stall threshold (closure.stall_threshold_ms) and
that burst released several tokens at once, the tokens from the burst before the gap to the burst after it
are left out of BOTH sides: a burst released by a stall arrives when the API server or client woke, not when
its last token was made. A long gap followed by a single token is the pace the client gets (a slow proxy
adding 0.3 s per event): it stays in. Both figures are also kept over the whole span (*_span).

Which engine steps are a request's:
- "prefill segments" (one stream at a time, C=1): every request starts with one prefill step; the decode
  steps up to the next prefill step are its own. The k-th prefill step of the level's window is the k-th
  request sent (by request id: one stream at a time, the client sends them in id order, and no clock decides
  it, so a backward step of the wall clock cannot reorder them); a segment must hold exactly tokens - 1
  decode steps, else the request is not paired. No clock is shared with the client.
- "request ids" (any C, where the hook recorded which of attribute's requests each step served: the client
  names each request with X-Request-Id and the hook notes it per step, hook/recorder.py): a request's tokens
  are made by its last `tokens` scheduled steps (its prefill's last chunk, then one decode step per token);
  earlier steps of it must all be prefill chunks. No clock is shared with the client.
- "client times" (C > 1, several streams per step, no request ids recorded): the steps that ended by the client's receipt of
  token k0 and of token k1; this needs the client and the server on one wall clock (one host, or clocks
  kept together) and is used where the closure is compared, not judged.

A request during which the wall clock was stepped (NTP; load.RequestClock measures it) is paired with no
steps either way: its own times are on the clock as it read at its send, the hook's stamps after the step
on the stepped clock, so its engine span (and its delivery delays) would carry the step.

Units: *_ms milliseconds, t_*_ns wall clock (or the GPU timeline placed on it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.analysis.closure import stall_threshold_ms
from tpcomm.judge.tolerances import BURST_GAP_FRACTION, MIN_OBSERVED

PREFILL = "prefill"
DECODE = "decode"
STEPPED = "the wall clock was stepped during it"  # load.RequestClock measured it: compared on neither side


SPAN_COLUMNS = [
    "request_id",
    "k0",
    "k1",
    "a0_ns",
    "a1_ns",
    "client_ms_per_token",
    "observed",
    "holes",
    "tokens",
    "client_ms_span",
    "stalled_out",
    "clock_step_ms",
]


def client_spans(requests: pd.DataFrame, tokens: pd.DataFrame, period_ms: float | None) -> pd.DataFrame:
    """Per request: k0, k1 (token indices), a0_ns, a1_ns (their arrivals), observed, holes (stall windows
    inside k0..k1: [(ka, kb, arrival_a_ns, arrival_b_ns)]), tokens (k1 - k0 less the holes' tokens),
    client_ms_per_token (over those tokens), client_ms_span (over k0..k1, holes included), stalled_out
    (observed, but the stall windows hold most of its tokens), clock_step_ms (the wall clock's step during the
    request, NaN: none measured)."""
    rows = []
    gap_ns = BURST_GAP_FRACTION * period_ms * 1e6 if period_ms else 0.0
    stall_ns = stall_threshold_ms(period_ms) * 1e6
    by_req = {rid: g for rid, g in tokens.sort_values(["request_id", "token_idx"]).groupby("request_id")}
    for _, r in requests.iterrows():
        rid, n = int(r["request_id"]), r["output_tokens"]
        step = pd.to_numeric(r.get("clock_step_ms"), errors="coerce")
        step = float(step) if pd.notna(step) else np.nan
        g = by_req.get(rid)
        none = (rid, -1, -1, 0, 0, np.nan, False, [], 0, np.nan, False, step)
        if g is None or not np.isfinite(n) or n < 2:
            rows.append(none)
            continue
        t = g["t_ns"].to_numpy(dtype=np.int64)
        cnt = g["n_tokens"].to_numpy() if "n_tokens" in g.columns else np.full(len(t), -1)
        if (cnt < 0).any():
            if len(t) != int(n):  # chunks that coalesced tokens, and no count to place them
                rows.append(none)
                continue
            cnt = np.ones(len(t), dtype=np.int64)
        last_tok = np.cumsum(cnt) - 1  # index of the last token in each chunk
        # A chunk that follows the previous within gap_ns belongs to its burst: only a burst's last chunk counts.
        ends = np.append(np.diff(t) >= gap_ns, True)
        e_idx = np.flatnonzero(ends)
        bt, bk = t[e_idx], last_tok[e_idx]
        k0, k1 = int(bk[0]), int(bk[-1])
        observed = k1 > k0 and (k1 - k0) >= MIN_OBSERVED * (int(n) - 1)
        # stall windows: the gap before burst j+1's first chunk exceeds the threshold
        holes = [
            (int(bk[j]), int(bk[j + 1]), int(bt[j]), int(bt[j + 1]))
            for j in range(len(e_idx) - 1)
            if t[e_idx[j] + 1] - t[e_idx[j]] > stall_ns and bk[j + 1] - bk[j] >= 2
        ]
        m = (k1 - k0) - sum(kb - ka for ka, kb, _, _ in holes)
        span_ms = (bt[-1] - bt[0]) / 1e6 / (k1 - k0) if k1 > k0 else np.nan
        own_ms = ((bt[-1] - bt[0]) - sum(b - a for _, _, a, b in holes)) / 1e6 / m if m > 0 else np.nan
        stalled_out = bool(observed and m < MIN_OBSERVED * (int(n) - 1))
        rows.append(
            (rid, k0, k1, int(bt[0]), int(bt[-1]), own_ms, bool(observed), holes, m, span_ms, stalled_out, step)
        )
    return pd.DataFrame(rows, columns=SPAN_COLUMNS)


def output_rank(ranks: list[int] | None, tp: int | None) -> int | None:
    """The rank whose step output vLLM's executor takes (MultiprocExecutor._get_output_rank, vLLM 0.32: the
    first TP rank of the last PP stage, world size - TP x PCP; PCP 1 assumed); None where TP or the ranks are
    not known, or that rank is not among them."""
    if not ranks or not isinstance(tp, int) or tp < 1:
        return None
    r = max(ranks) + 1 - tp
    return r if r in ranks else None


def step_ends(rank_rows: pd.DataFrame, out_rank: int | None = None) -> pd.DataFrame:
    """One row per step of the level (all kinds): kind, when its token was made (t_end_ns) and the earliest
    rank's end (t_first_end_ns), on the step clock rank_steps put the rows on (the GPU's where the worker
    recorded it, else the host's).

    t_end_ns is the end of `out_rank`'s step (output_rank()) where that rank recorded every step here: vLLM
    takes the step's output from that rank alone, so a peer descheduled after its step's work (its end stamped
    late on a busy host, seen: 1.7 s) does not delay the token, and must not move the step's end (a mean over
    ranks did: that closure read +11.4%). Without it, the mean over ranks."""
    rows = rank_rows[rank_rows["kind"] != "empty"]  # no token made in an empty step (PP batch-queue slots)
    g = rows.groupby("step", sort=True)
    out = g.agg(kind=("kind", "first"), t_end_ns=("t_end_ns", "mean"), t_first_end_ns=("t_end_ns", "min")).reset_index()
    if out_rank is not None:
        own = rows[rows["rank"] == out_rank].groupby("step")["t_end_ns"].first()
        made = out["step"].map(own)
        if len(out) and made.notna().all():
            out["t_end_ns"] = made.astype(float)
    return out


def _unmatched(s: pd.DataFrame, starts: np.ndarray, requests: pd.DataFrame, most: int = 3) -> str:
    """Which requests have not exactly one prefill step ending between their send and their first token (the
    client's clock), and the nearest prefill step's end: what a reader needs to tell a lost step from a
    clock offset between the client and the engine."""
    ends = s["t_end_ns"].to_numpy(dtype=float)[starts]
    if not len(ends) or not {"t_start_ns", "ttft_ms"} <= set(requests.columns):
        return ""
    odd = []
    r = requests.assign(
        _t0=pd.to_numeric(requests["t_start_ns"], errors="coerce"),
        _ttft=pd.to_numeric(requests["ttft_ms"], errors="coerce"),
    ).sort_values("_t0")
    for rid, t0, ttft in zip(r["request_id"], r["_t0"], r["_ttft"]):
        if not pd.notna(t0):
            odd.append(f"request {int(rid)}: no send time")
            continue
        t0 = float(t0)
        t1 = t0 + float(ttft) * 1e6 if pd.notna(ttft) else None
        inside = (ends >= t0) & (ends <= t1) if t1 is not None else ends >= t0
        n = int(inside.sum()) if t1 is not None else 0
        if t1 is None:
            odd.append(f"request {int(rid)}: no first token time")
        elif n != 1:
            i = int(np.argmin(np.abs(ends - t0)))
            odd.append(f"request {int(rid)}: {n} (the nearest ends {(ends[i] - t0) / 1e6:+.1f} ms from its send)")
    shown = "; ".join(odd[:most]) + (f"; {len(odd) - most} more" if len(odd) > most else "")
    return f"; prefill steps ending between a request's send and its first token: {shown}" if odd else ""


def by_prefill(
    rank_rows: pd.DataFrame, spans: pd.DataFrame, requests: pd.DataFrame, out_rank: int | None = None
) -> tuple[pd.DataFrame, str | None]:
    """Engine time per token of each request (one stream at a time) over the client's k0..k1. Returns
    (spans + engine_ms_per_token, steps (its segment's step ids), paired, why), and a level-wide reason when
    the requests and the prefill steps do not match one to one. `out_rank`: see step_ends."""
    s = step_ends(rank_rows, out_rank)
    out = spans.copy()
    out["engine_ms_per_token"], out["engine_ms_span"], out["paired"], out["why"] = np.nan, np.nan, False, ""
    out["steps"] = [[] for _ in range(len(out))]
    order = requests.sort_values("request_id")["request_id"].tolist()  # the send order (see the docstring)
    starts = np.flatnonzero(s["kind"].to_numpy() == PREFILL)
    if len(starts) != len(order):
        out["why"] = "not paired"
        return (
            out,
            f"{len(starts)} prefill steps in the level's window for {len(order)} requests (one expected per "
            f"request){_unmatched(s, starts, requests)}",
        )
    kinds, ends, ids = s["kind"].to_numpy(), s["t_end_ns"].to_numpy(dtype=float), s["step"].to_numpy()
    bounds = list(starts) + [len(s)]
    n_tok = requests.set_index("request_id")["output_tokens"]
    pos = {rid: i for i, rid in enumerate(out["request_id"])}
    for k, rid in enumerate(order):
        i = pos.get(int(rid))
        if i is None:
            continue
        a, b = bounds[k], bounds[k + 1]
        # every step number of the segment, the empty ones (left out above) included: the split over the compared
        # requests needs them to keep the decode steps consecutive
        out.at[i, "steps"] = list(range(int(ids[a]), int(ids[b - 1]) + 1))
        if np.isfinite(out.at[i, "clock_step_ms"]):  # the hook's stamps jumped inside its segment, the client's not
            out.at[i, "why"] = STEPPED
            continue
        n_dec = int((kinds[a:b] == DECODE).sum())
        if n_dec != b - a - 1:  # a mixed step (another request's prefill with decodes): not one stream
            out.at[i, "why"] = "a mixed step in its segment"
            continue
        n = n_tok.get(rid)
        if n is None or not np.isfinite(n) or n_dec != int(n) - 1:
            out.at[i, "why"] = f"{n_dec} decode steps in its segment for {n} tokens"
            continue
        k0, k1 = int(out.at[i, "k0"]), int(out.at[i, "k1"])
        if k1 <= k0:
            out.at[i, "why"] = "no token span observed"
            continue
        span = ends[a + k1] - ends[a + k0]
        holes = sum(ends[a + kb] - ends[a + ka] for ka, kb, _, _ in out.at[i, "holes"])
        _engine(out, i, span, holes, k1 - k0)
    return out, None


def by_request_steps(
    rank_rows: pd.DataFrame,
    step_reqs: pd.DataFrame,
    spans: pd.DataFrame,
    requests: pd.DataFrame,
    out_rank: int | None = None,
) -> pd.DataFrame:
    """Engine time per token of each request from the steps the hook saw serve it (`step_reqs`: rank, step,
    request, tokens; the lowest rank's rows). Same columns as by_prefill; `steps` holds the steps that made its
    tokens 0..n-1, in order."""
    s = step_ends(rank_rows, out_rank)
    ends = dict(zip(s["step"].to_numpy().tolist(), s["t_end_ns"].to_numpy(dtype=float)))
    out = spans.copy()
    out["engine_ms_per_token"], out["engine_ms_span"], out["paired"], out["why"] = np.nan, np.nan, False, ""
    out["steps"] = [[] for _ in range(len(out))]
    if step_reqs is None or step_reqs.empty:
        out["why"] = "no request ids recorded"
        return out
    sr = step_reqs[step_reqs["rank"] == step_reqs["rank"].min()].sort_values("step")
    by_req = {int(r): g for r, g in sr.groupby("request")}
    n_tok = requests.set_index("request_id")["output_tokens"]
    for i, r in out.iterrows():
        rid = int(r["request_id"])
        if np.isfinite(r["clock_step_ms"]):
            out.at[i, "why"] = STEPPED
            continue
        g, n = by_req.get(rid), n_tok.get(rid)
        if g is None:
            out.at[i, "why"] = "the hook saw no step serve it"
            continue
        if n is None or not np.isfinite(n) or int(n) < 1:
            out.at[i, "why"] = "no output token count"
            continue
        n = int(n)
        steps, toks = g["step"].to_numpy().tolist(), g["tokens"].to_numpy()
        if len(steps) < n:
            out.at[i, "why"] = f"{len(steps)} steps served it for {n} tokens"
            continue
        if (toks[len(steps) - n + 1 :] != 1).any():
            out.at[i, "why"] = (
                "a step of several of its tokens after its first token (speculative decoding, or a recompute after "
                "preemption)"
            )
            continue
        if (toks[: len(steps) - n] <= 1).any():
            out.at[i, "why"] = "a step of one token before its last prefill chunk (a 1-token chunk, or a step dropped)"
            continue
        made = steps[len(steps) - n :]
        if any(x not in ends for x in made):
            out.at[i, "why"] = "steps that made its tokens fall outside the level's records"
            continue
        out.at[i, "steps"] = made
        k0, k1 = int(r["k0"]), int(r["k1"])
        if k1 <= k0:
            out.at[i, "why"] = "no token span observed"
            continue
        e = [ends[x] for x in made]
        holes = sum(e[kb] - e[ka] for ka, kb, _, _ in r["holes"])
        _engine(out, i, e[k1] - e[k0], holes, k1 - k0)
    return out


def by_client_times(rank_rows: pd.DataFrame, spans: pd.DataFrame, out_rank: int | None = None) -> pd.DataFrame:
    """Engine time per token of each request (several streams per step): the steps that ended by the client's
    receipt of tokens k0 and k1 (one wall clock assumed). Same columns as by_prefill."""
    s = step_ends(rank_rows, out_rank)
    ends, ids = s["t_end_ns"].to_numpy(dtype=float), s["step"].to_numpy()
    out = spans.copy()
    out["engine_ms_per_token"], out["engine_ms_span"], out["paired"], out["why"] = np.nan, np.nan, False, ""
    out["steps"] = [[] for _ in range(len(out))]
    for i, r in out.iterrows():
        if r["k1"] <= r["k0"]:
            out.at[i, "why"] = "no token span observed"
            continue
        if np.isfinite(r["clock_step_ms"]):
            out.at[i, "why"] = STEPPED
            continue
        i0 = np.searchsorted(ends, r["a0_ns"], side="right") - 1
        i1 = np.searchsorted(ends, r["a1_ns"], side="right") - 1
        if i0 < 0 or i1 <= i0:
            out.at[i, "why"] = "its tokens fall outside the recorded steps"
            continue
        at = [np.searchsorted(ends, [a, b], side="right") - 1 for _, _, a, b in r["holes"]]
        holes = sum(ends[ib] - ends[max(ia, 0)] for ia, ib in at)
        out.at[i, "steps"] = list(range(int(ids[i0]), int(ids[i1]) + 1))
        _engine(out, i, ends[i1] - ends[i0], holes, r["k1"] - r["k0"])
    return out


def _engine(out: pd.DataFrame, i, span_ns: float, holes_ns: float, k: int) -> None:
    """The engine's time per token of row i over the client's tokens (stall windows out) and over its span."""
    m = int(out.at[i, "tokens"])
    out.at[i, "engine_ms_per_token"] = (span_ns - holes_ns) / 1e6 / m if m > 0 else np.nan
    out.at[i, "engine_ms_span"] = span_ns / 1e6 / k
    out.at[i, "paired"] = True
