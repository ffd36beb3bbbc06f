"""The client's side of a level beside the engine's split, never mixed into it, and the closure between them.

- client figures: TPOT p50 / mean over the level's successful requests (per request (E2E - TTFT) /
  (tokens - 1)) and ITL p50 / mean (all gaps between token chunks), from load/*.parquet;
- held streams: a request whose tokens arrived in bursts that leave less than half of them between its
  first burst and its last (pairing.py) was held back (nearly) whole by the API server: the client did not
  observe its pace (on 2 cores, both bound to the TP workers, this happens);
- stalls: gaps between two token chunks of one request longer than STALL_FACTOR engine periods (and at
  least STALL_MIN_MS): counted, summed and named by request; they enter no term;
- closure, per request (pairing.py): each request's engine time per token for its own decode steps against
  the client's time per token over the same tokens (its TPOT when every token arrives on its own); the
  statistic is the p50 over the SAME requests on both sides: the paired ones the API server did not hold
  back (those are named, per reason, and left out of both sides). A stall's window (from the burst before
  the long gap to the burst of several tokens it released) is left out of both sides of its request: the
  released burst arrives when the server or client woke, not when its tokens were made; a request whose
  stall windows hold most of its tokens is left out as "stalled". A long gap before each single token is
  the pace the client gets (a proxy slowing every event): it stays in, and the closure can fail. Compared
  at every level; judged (within CLOSURE_TOL_PCT) where streams run one at a time
  (C=1) and at least MIN_CLOSURE_REQUESTS requests are compared. Both sides are measured independently
  (engine step clock vs client arrival clock), so this can fail; when it does, both numbers are reported
  and no cause is named;
- delivery = the p50 over the same requests of (client - engine time per token): what the API
  server, network and client add per token, with the p50's distribution-free interval (order statistics
  of the paired differences); `resolved` only when the interval excludes 0 at >= INTERVAL_COVERAGE.

Units: *_ms milliseconds, t_ns wall clock nanoseconds.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd

from tpcomm.judge.tolerances import CLOSURE_TOL_PCT, INTERVAL_COVERAGE, MIN_CLOSURE_REQUESTS, STALL_FACTOR, STALL_MIN_MS
from tpcomm.rundir.results import Client, Closure, Delivery, StallGap, Stalls

STALLED = "stalled (its stall windows hold most of its tokens)"
HELD = "held back (nearly) whole by the API server"
MAX_STALL_GAPS = 100  # stall locations kept in the summary (the longest); count and total_ms cover all


def _finite(x) -> np.ndarray:
    a = np.asarray([v for v in x if v is not None], dtype=float)
    return a[np.isfinite(a)]


def _p50(x) -> float | None:
    a = _finite(x)
    return float(np.percentile(a, 50)) if a.size else None


def stall_threshold_ms(period_ms: float | None) -> float:
    """A gap between two token chunks of one request longer than this is a stall."""
    return max(STALL_FACTOR * period_ms, STALL_MIN_MS) if period_ms else STALL_MIN_MS


def find_stalls(tokens: pd.DataFrame, period_ms: float | None) -> Stalls:
    """Token gaps far beyond the engine's step period: count, total ms, and in which requests."""
    threshold = stall_threshold_ms(period_ms)
    if tokens.empty:
        return Stalls(0, 0.0, threshold, [])
    t = tokens.sort_values(["request_id", "token_idx"])
    gaps = np.diff(t["t_ns"].to_numpy()) / 1e6
    rid = t["request_id"].to_numpy()
    hit = np.flatnonzero((rid[1:] == rid[:-1]) & (gaps > threshold))
    idx = t["token_idx"].to_numpy()
    where = sorted(hit, key=lambda i: -gaps[i])[:MAX_STALL_GAPS]
    at = [StallGap(int(rid[i + 1]), int(idx[i + 1]), float(gaps[i])) for i in sorted(where)]
    return Stalls(int(hit.size), float(gaps[hit].sum()), threshold, sorted({int(rid[i + 1]) for i in hit}), at)


def client_figures(requests: pd.DataFrame, tokens: pd.DataFrame, held: list[int], stalls: Stalls) -> Client:
    """The client's own figures over the level's successful requests (plain TPOT and ITL, as `vllm bench
    serve` defines them), and which requests were held back or stalled."""
    ok = requests[requests["ok"]]
    t = tokens[tokens["request_id"].isin(ok["request_id"])].sort_values(["request_id", "token_idx"])
    itl = np.array([])
    if not t.empty:
        same = t["request_id"].to_numpy()[1:] == t["request_id"].to_numpy()[:-1]
        itl = (np.diff(t["t_ns"].to_numpy()) / 1e6)[same]
    tp = _finite(ok["tpot_ms"])
    return Client(
        requests=int(len(ok)),
        tpot_ms_p50=_p50(tp),
        tpot_ms_mean=float(tp.mean()) if tp.size else None,
        itl_ms_p50=_p50(itl),
        itl_ms_mean=float(itl.mean()) if itl.size else None,
        held_requests=held,
        stalled_requests=list(stalls.requests),
    )


def closure(
    pairs: pd.DataFrame, concurrency: int, pairing: str, pairing_problem: str | None = None
) -> tuple[Closure, Delivery | None, list[int]]:
    """The closure, delivery and the ids of the compared requests: observed by the client, paired with their
    engine steps, and not stalled over most of their tokens.

    `pairs`: pairing.by_prefill / by_client_times rows (request_id, client_ms_per_token, engine_ms_per_token,
    holes, tokens, stalled_out, observed, paired, why)."""
    excluded: dict[str, list[int]] = {}
    eligible = pairs[pairs["observed"] & pairs["paired"]]
    out = eligible["stalled_out"].astype(bool)
    held = sorted(int(r) for r in pairs.loc[~pairs["observed"], "request_id"])
    if held:
        excluded[HELD] = held
    if out.any():
        excluded[STALLED] = sorted(int(r) for r in eligible.loc[out, "request_id"])
    bad = pairs[pairs["observed"] & ~pairs["paired"]]
    for why, g in bad.groupby("why"):
        excluded[f"not paired ({why})" if why and why != "not paired" else "not paired"] = sorted(
            int(r) for r in g["request_id"]
        )
    keep = eligible[~out]
    client, engine = keep["client_ms_per_token"], keep["engine_ms_per_token"]
    windows = sum(len(h) for h in keep["holes"])
    note = ""
    if windows:
        tok = int(sum(kb - ka for h in keep["holes"] for ka, kb, _, _ in h))
        note = f"; {windows} stall window{'' if windows == 1 else 's'} ({tok} tokens) left out of both sides"
    client, engine = client.to_numpy(dtype=float), engine.to_numpy(dtype=float)
    fin = np.isfinite(client) & np.isfinite(engine)
    client, engine, ids = client[fin], engine[fin], [int(r) for r in keep["request_id"].to_numpy()[fin]]
    n = len(ids)
    e50, c50 = _p50(engine), _p50(client)
    diff = (e50 - c50) / c50 * 100 if e50 is not None and c50 else None
    why_not = None
    if pairing_problem:
        why_not = f"requests could not be paired with the engine's steps: {pairing_problem}"
    elif concurrency != 1 and pairing != "request ids":
        why_not = (
            "judged only where streams run one at a time (C=1) or are paired by their request ids: at higher C the "
            "pairing by times needs one clock"
        )
    elif n < MIN_CLOSURE_REQUESTS:
        why_not = f"{n} request(s) could be compared (at least {MIN_CLOSURE_REQUESTS} needed)"
    judged = why_not is None and diff is not None
    c = Closure(
        statistic=f"p50 over {n} request{'' if n == 1 else 's'}, paired by {pairing}{note}",
        pairing=pairing,
        requests=n,
        excluded=excluded,
        engine_ms=e50,
        client_ms=c50,
        diff_pct=diff,
        tolerance_pct=CLOSURE_TOL_PCT,
        judged=judged,
        ok=(abs(diff) <= CLOSURE_TOL_PCT) if judged else None,
        why_not_judged=why_not,
    )
    return c, delivery(client - engine), ids


def closure_text(concurrency: int, repeat: int, c: Closure | None, stalls: Stalls | None, five=None) -> str | None:
    """The sentence `attribute` and the report print when a judged closure fails: no cause named, unless the
    five terms (`five`: results.DeliveryTerm, analysis/delivery.py) account for the client's time, which
    names it: delivery (the client got tokens late, then in catch-up bursts)."""
    if c is None or c.ok is not False:
        return None
    where = f" in request(s) {', '.join(map(str, stalls.requests[:8]))}" if stalls and stalls.requests else ""
    if five is not None and five.ok:
        return (
            f"C={concurrency} repeat {repeat}: the client's pace between holds (p50 {c.client_ms:.2f} ms per token "
            f"over {c.requests} requests) differs from the engine's ({c.engine_ms:.2f} ms) by {c.diff_pct:+.1f}%: "
            f"delivery, not the split: the five terms add up to the client's own time per token within "
            f"{five.diff_pct:+.1f}%{five.of} (held tokens {five.held_tokens}; stalls {stalls.count if stalls else 0}{where})"
        )
    return (
        f"C={concurrency} repeat {repeat}: closure check failed: per request, the engine's time per token "
        f"(p50 {c.engine_ms:.2f} ms) and the client's TPOT (p50 {c.client_ms:.2f} ms) over the same {c.requests} "
        f"requests differ by {c.diff_pct:+.1f}% (tolerance {c.tolerance_pct:g}%); client stalls: "
        f"{stalls.count if stalls else 0} ({stalls.total_ms if stalls else 0.0:.0f} ms){where}"
    )


EXACT_INTERVAL_N = 1000  # up to this many values the coverage is exact (integers); above, float64 in log space


def median_interval(values) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of `values`: [x_(j), x_(n+1-j)] (order statistics,
    1-based) with the largest j whose coverage 1 - 2 P(Bin(n, 1/2) <= j - 1) is at least INTERVAL_COVERAGE.
    Below six values no j reaches it, and the whole range stands with the coverage it has.
    Returns (lo, hi, coverage), or None without values. Linear in n past the sort: the clock estimate gives it
    one value per collective instance (millions at the seed's scale), where the exact integer walk, whose
    numbers grow to n bits, took 2.5 s at 16 000 values and grew faster than n squared."""
    x = np.sort(_finite(values))
    n = int(x.size)
    if not n:
        return None
    j, cov = _order_statistic(n) if n > EXACT_INTERVAL_N else _order_statistic_exact(n)
    return float(x[j - 1]), float(x[n - j]), cov


def _order_statistic_exact(n: int) -> tuple[int, float]:
    """(j, coverage) of median_interval, in integers: tail = P(Bin(n, 1/2) <= j - 1) * 2^n (2.0**n overflows
    past n = 1023)."""
    j, term, tail, whole = 1, 1, 1, 2**n

    def coverage(tail: int) -> float:
        return 1.0 - float(Fraction(2 * tail, whole))

    while j + 1 <= (n + 1) // 2:
        term = term * (n - j + 1) // j  # C(n, j)
        if coverage(tail + term) < INTERVAL_COVERAGE:
            break
        j, tail = j + 1, tail + term
    return j, coverage(tail)


def _order_statistic(n: int) -> tuple[int, float]:
    """(j, coverage) of median_interval in float64, O(n): log P(Bin(n, 1/2) = k) for k = 0..(n+1)//2 - 1 by the
    recurrence log C(n, k) = log C(n, k-1) + log(n-k+1) - log k, then the cumulative tail (the terms below 1e-308
    underflow to 0: they are that far below the 2.5% the interval is cut at). Agrees with the exact walk on j
    and to 1e-9 on the coverage (tests/test_attribute_units.py, n = 1001..3000)."""
    k = np.arange(1, (n + 1) // 2, dtype=np.float64)
    logp = np.concatenate(([-n * math.log(2.0)], -n * math.log(2.0) + np.cumsum(np.log(n - k + 1) - np.log(k))))
    cov = 1.0 - 2.0 * np.cumsum(np.exp(logp))  # cov[i]: coverage of j = i + 1
    j = max(1, int(np.count_nonzero(cov >= INTERVAL_COVERAGE)))
    return j, float(cov[j - 1])


def delivery(differences_ms) -> Delivery | None:
    """p50 of the paired per-request differences (client TPOT - engine time per token) with the p50's
    interval; `resolved`: the interval excludes 0 and covers at least INTERVAL_COVERAGE (six requests or more)."""
    x = _finite(differences_ms)
    iv = median_interval(x)
    if iv is None:
        return None
    lo, hi, cov = iv
    return Delivery(
        ms=float(np.percentile(x, 50)),
        lo_ms=lo,
        hi_ms=hi,
        coverage=cov,
        requests=int(x.size),
        resolved=bool(cov >= INTERVAL_COVERAGE and (lo > 0 or hi < 0)),
    )


def delivery_text(d: Delivery | None, fmt) -> str | None:
    """Delivery as `attribute` and the report print it: the signed figure only when its interval excludes 0."""
    if d is None:
        return None
    n = d.requests
    iv = (  # the coverage rounded down: never more than it is
        f"{math.floor(d.coverage * 100)}% interval {fmt(d.lo_ms)} to {fmt(d.hi_ms)} ms "
        f"over {n} request{'' if n == 1 else 's'}"
    )
    if d.resolved:
        return f"{fmt(d.ms)} ms ({iv})"
    if d.lo_ms > 0 or d.hi_ms < 0:  # excludes 0, but too few requests for a 95% interval
        return f"not resolved with {n} request{'' if n == 1 else 's'} ({fmt(d.ms)} ms; {iv}; 6 give 95%)"
    return f"not separable from zero ({fmt(d.ms)} ms; {iv})"
