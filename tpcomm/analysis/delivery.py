"""The fifth term of a token: delivery, from the end of the engine step that made it to the client's receipt.

For each token k of a request, on one clock: made at e_k (the end of the step that made it: the request's
prefill step for token 0, its k-th decode step for token k) and received at a_k (the arrival of the chunk
that carried it; a chunk of several tokens delivers them all at once). Its delivery delay is d_k = a_k - e_k:
the API server's output processing, detokenisation, streaming loop and event-loop scheduling, the network
and the client. Over a request's tokens 0..n-1:

    client per token    = (a_{n-1} - a_0) / (n - 1)                 (the textbook TPOT)
    engine per token    = (e_{n-1} - e_0) / (n - 1)                 (from the ends of the steps that made them)
    delivery per token  = (d_{n-1} - d_0) / (n - 1) = client - engine   (how much later each token came)

Held tokens and burst releases are in it, not left out: a stream whose last tokens the API server held
for a second carries that second in its delivery. A constant offset between the client's clock and the
server's cancels in d_{n-1} - d_0, so the term needs no shared clock; the delays themselves (d_k) do, and
are given only where the client and the server ran on one host.

A level's figures pool its requests by token (sum over requests / sum of n - 1), the same statistic as the
split's mean decode period, so

    client per token = compute + transfer + wait + host gap + delivery  + (pairing residue)

where the four engine terms are the split over the SAME requests' decode steps (analysis/split.py: their
mean period, each from the end of the step before to the end of its own) and the residue is the engine's
per-token time from the step ends the tokens were paired with, less the split's mean period. Over a request's
own steps each rank's periods add up to its end(last step) - end(prefill), so the residue is only the output
rank's ends against the mean over ranks (and steps left out of the pairs): zero by construction at TP 1. The
pairing of tokens to steps is judged by the early-token rule below (on one clock) and by the closure.
Measured where each request's steps are known: one stream at a time (C=1, paired by prefill segments), or at
any C where the hook recorded which of attribute's requests each step served (paired by request ids: the
client's X-Request-Id, hook/recorder.py). Above C=1 the split is over the union of those requests' steps, each
once, while a request's engine time counts every step it was in: the residue then also carries the steps
where another request's prefill joined the batch (a mixed step is slower), and the check says how far that
goes. Elsewhere above C=1 (a hook without request ids) a token's step is not known: "not measured".

Units: *_ms milliseconds (per token unless named), t_*_ns wall clock ns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.judge.tolerances import EARLY_MS, FIVE_TERM_MIN_REQUESTS, FIVE_TERM_TOL_PCT, HELD_MS
from tpcomm.rundir.results import DeliveryTerm, Terms


def token_delays(
    pairs: pd.DataFrame,
    rank_rows: pd.DataFrame,
    tokens: pd.DataFrame,
    requests: pd.DataFrame,
    token_steps: bool = False,
    earliest: dict | None = None,
    out_rank: int | None = None,
):
    """Per request paired by prefill segments (pairing.by_prefill rows with `steps`) or, `token_steps`, by the request
    ids the hook recorded (pairing.by_request_steps: `steps` are the steps that made its tokens 0..n-1):
    (request_id, made_ns, arrived_ns) arrays of its tokens, and {request_id: why not} for the others.
    `earliest`: a dict that receives {request_id: the earliest rank's end of each token's step} (a token cannot
    reach the client before the first rank that finished its step: a descheduled peer ends later). A token is
    made when `out_rank`'s step ends (pairing.step_ends: the rank vLLM takes the output from)."""
    from tpcomm.analysis.pairing import DECODE, PREFILL, STEPPED, step_ends

    s = step_ends(rank_rows, out_rank).set_index("step")
    n_tok = requests.set_index("request_id")["output_tokens"]
    by_req = {int(r): g.sort_values("token_idx") for r, g in tokens.groupby("request_id")}
    out, why = [], {}
    for _, p in pairs.iterrows():
        rid = int(p["request_id"])
        if p["why"] == STEPPED:
            why[rid] = STEPPED
            continue
        steps = [x for x in p["steps"] if x in s.index]
        kinds = s.loc[steps, "kind"].to_numpy() if steps else np.array([])
        n = n_tok.get(rid)
        if not steps or n is None or not np.isfinite(n) or int(n) < 2:
            why[rid] = "not paired with its steps"
            continue
        n = int(n)
        if token_steps:
            if len(steps) != n:
                why[rid] = p["why"] or f"{len(steps)} steps made its {n} tokens"
                continue
        elif kinds[0] != PREFILL or int((kinds == DECODE).sum()) != n - 1 or len(kinds) != n:
            why[rid] = p["why"] or "its segment is not one prefill step and one decode step per token"
            continue
        g = by_req.get(rid)
        if g is None:
            why[rid] = "no token arrivals"
            continue
        # A chunk's token count, where the client counted one (NaN on a cut or failed stream: one token each)
        raw = g["n_tokens"].to_numpy(dtype=np.float64) if "n_tokens" in g.columns else np.ones(len(g))
        if not np.isfinite(raw).all() or (raw < 1).any():
            raw = np.ones(len(g))
        t = g["t_ns"].to_numpy(dtype=np.float64)
        if not np.isfinite(t).all():
            why[rid] = "token arrivals without a time (a cut stream)"
            continue
        arrived = np.repeat(t.astype(np.int64), raw.astype(np.int64))
        if len(arrived) != n:
            why[rid] = f"{len(arrived)} token arrivals for {n} tokens"
            continue
        made = s.loc[steps, "t_end_ns"].to_numpy(dtype=np.float64)
        out.append((rid, made, arrived.astype(np.float64)))
        if earliest is not None:
            earliest[rid] = s.loc[steps, "t_first_end_ns"].to_numpy(dtype=np.float64)
    return out, why


def request_sums(per_request: list) -> np.ndarray:
    """Per request of token_delays() output, in its order: (client ms over its tokens, delivery ms over them,
    tokens - 1). The level's delivery term is column 1's sum over column 2's, its client per-token time column
    0's: compare resamples these rows."""
    return np.array(
        [((a[-1] - a[0]) / 1e6, ((a[-1] - m[-1]) - (a[0] - m[0])) / 1e6, len(m) - 1) for _, m, a in per_request],
        dtype=float,
    ).reshape(-1, 3)


def delivery_term(
    per_request: list,
    split_ms: float | None,
    concurrency: int,
    one_clock: bool,
    not_measured: str | None = None,
    pairing: str = "prefill segments",
    earliest: dict | None = None,
    split_terms: dict | None = None,
    offset_hi_ms: float | None = None,
) -> DeliveryTerm:
    """The level's delivery term from token_delays() output, beside the split's per-token time over the same
    requests' decode steps (`split_ms`: the sum of the four engine terms). `pairing`: how its tokens were paired
    with their steps (pairing.py): "prefill segments" (C=1) or "request ids" (the hook's records of them).
    `offset_hi_ms`: at most this much is the server's clock ahead of the client's (serverclock.py's bound),
    where they are not one clock: the early-token check then allows for it."""
    if not_measured or not per_request:
        return DeliveryTerm.not_measured(not_measured or "no request's tokens could be paired with their steps")
    sums = request_sums(per_request)
    n1 = sums[:, 2].sum()
    client, dl = sums[:, 0].sum() / n1, sums[:, 1].sum() / n1
    d = [a - m for _, m, a in per_request]
    engine = client - dl
    allv = np.concatenate(d) / 1e6
    base = float(np.median(allv))  # a constant offset (another host's clock) cancels in d - median
    held = allv - base > HELD_MS
    total = split_ms + dl if split_ms is not None else None
    # The residue (the sum of the five less the client's) is the split's miss of the engine's time over these
    # tokens (client = engine + delivery, token by token: delivery cancels), so it is judged against the
    # engine's time. Against the client's it was loose where delivery adds much (a 20% miss of the engine read
    # +4% of a client's 5x slower) and meaningless where the API server sent whole streams in one lump (0.05 ms
    # a token at the client against the engine's 2.3 on a busy 2-core AVX-512 host, 2026-12-06). An engine's
    # time that is not positive (steps out of order) is judged against the client's, and fails as before.
    diff_of = "engine" if engine > 0 else "client"
    denom = engine if engine > 0 else client
    diff = float((total - client) / denom * 100) if total is not None and denom > 0 else None
    k = len(per_request)
    why_not = None
    if concurrency != 1 and pairing != "request ids":
        why_not = "judged only where streams run one at a time (C=1) or are paired by their request ids"
    elif k < FIVE_TERM_MIN_REQUESTS:
        why_not = f"{k} request(s) measured (at least {FIVE_TERM_MIN_REQUESTS} needed)"
    elif diff is None:
        why_not = "no engine split over these requests' decode steps"
    judged = why_not is None
    # On one clock a token cannot reach the client before the step that made it ended: any that did were paired
    # with the wrong step (an off-by-one, another request's steps), whatever the per-token sums say.
    # Against the earliest rank's end of the step (token_delays' `earliest`; else the ranks' mean end): a rank
    # descheduled after its part of the step ends later than the token, which the first rank already made.
    first = [earliest.get(rid, m) for rid, m, _ in per_request] if earliest else [m for _, m, _ in per_request]
    lead = np.concatenate([a - f for (_, _, a), f in zip(per_request, first)]) / 1e6
    # off one clock, a token is certainly early only if it is so with the server's clock as far ahead as the
    # bound allows: its arrival on the server's clock is at most a + hi
    allow = 0.0 if one_clock else offset_hi_ms
    early = int((lead + allow < -EARLY_MS).sum()) if allow is not None else 0
    return DeliveryTerm(
        measured=True,
        ms=dl,
        client_ms=client,
        engine_ms=engine,
        split_ms=split_ms,
        sum_ms=total,
        diff_pct=diff,
        diff_of=diff_of,
        tolerance_pct=FIVE_TERM_TOL_PCT,
        judged=judged,
        ok=bool(abs(diff) <= FIVE_TERM_TOL_PCT and not early) if judged else None,
        requests=k,
        tokens=int(n1 + k),
        held_tokens=int(held.sum()),
        held_requests=sorted(rid for (rid, _, _), x in zip(per_request, d) if ((x / 1e6 - base) > HELD_MS).any()),
        delay_ms_p50=base if one_clock else None,
        delay_ms_p90=float(np.percentile(allv, 90)) if one_clock else None,
        delay_ms_max=float(allv.max()) if one_clock else None,
        held_delay_ms_max=float((allv - base).max()),
        why_not_judged=why_not,
        pairing=pairing,
        early_tokens=early,
        split_terms=Terms(**split_terms) if split_terms and split_ms is not None else None,
    )


def client_boot_id() -> str | None:
    """This machine's boot id (Linux), which the hook reports per rank too: equal ids mean one machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def one_clock(nodes: dict, conditions: dict) -> bool:
    """Client and server on one machine, so the delays d_k are on one wall clock: the client's boot id is
    every rank's, or (runs recorded before the client noted it) the server was reached on loopback."""
    boots = {n.get("boot_id") for n in nodes.values()}
    if conditions.get("client_boot_id"):
        return boots == {conditions["client_boot_id"]}
    from urllib.parse import urlsplit

    return (urlsplit(str(conditions.get("server_url") or "")).hostname or "") in LOOPBACK
