"""The client's side of a level beside the engine's per-token time, never mixed into it.

- client figures: TPOT p50 / mean (per request: (E2E - TTFT) / (tokens - 1)), the judged TPOT p50
  (the same, except that a stream the API server held back whole, its tokens delivered in one burst so
  that its TPOT says nothing, counts with (E2E - the fastest TTFT of the unheld requests) / (tokens - 1);
  see judged_tpot_ms) and ITL p50 / mean (all gaps between token chunks), from load/*.parquet;
- delivery = the client's held TPOT p50 over the requests without a stall - the engine's per-token time on
  TPOT's footing: the two sides the closure compares, in ms (what the API server, network and client add);
  a named difference, not a term of the split. It comes with the p50's distribution-free 95% interval
  (order statistics of the same requests) and is `resolved` only when that interval excludes 0: a
  difference of -0.1 ms over a dozen requests whose TPOTs spread by 0.5 ms is not separable from zero,
  and is never printed as a signed cost on its own;
- stalls: gaps between two token chunks of one request longer than STALL_FACTOR engine periods
  (and at least STALL_MIN_MS): counted, summed and named by request; they enter no per-token term;
- closure: the engine's per-token time, on TPOT's footing (plus the prefill-to-first-decode interval once
  per request, see engine_tpot_ms), against the client's held TPOT p50 over the requests without a stall
  (tpot_judged_ms_p50: a stall is counted apart and enters neither a term nor the figure the terms are held
  to; a starved API server on 2 cores held half of a level's streams for ~1 s, which moved the plain p50 by
  more than the whole per-token time). Compared at every level, judged (must agree within CLOSURE_TOL_PCT)
  at C=1. Both are measured independently (engine step clock vs client arrival clock), so this can fail;
  when it does, both numbers and the stalls are reported and no cause is named.

Units: *_ms milliseconds, t_ns wall clock nanoseconds.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd

STALL_FACTOR = 20.0
STALL_MIN_MS = 100.0
CLOSURE_TOL_PCT = 10.0
INTERVAL_COVERAGE = 0.95


def _pct(x, q) -> float | None:
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(x, q)) if x.size else None


def find_stalls(tokens: pd.DataFrame, period_ms: float | None) -> dict:
    """Token gaps far beyond the engine's step period: count, total ms, and where."""
    threshold = max(STALL_FACTOR * period_ms, STALL_MIN_MS) if period_ms else STALL_MIN_MS
    out = {"count": 0, "total_ms": 0.0, "threshold_ms": threshold, "requests": [], "gaps": []}
    if tokens.empty:
        return out
    t = tokens.sort_values(["request_id", "token_idx"])
    gaps = np.diff(t["t_ns"].to_numpy()) / 1e6
    rid = t["request_id"].to_numpy()
    same = rid[1:] == rid[:-1]
    hit = np.flatnonzero(same & (gaps > threshold))
    idx = t["token_idx"].to_numpy()
    out["gaps"] = [{"request_id": int(rid[i + 1]), "token_idx": int(idx[i + 1]), "gap_ms": float(gaps[i])} for i in hit]
    out.update(
        count=int(hit.size), total_ms=float(gaps[hit].sum()), requests=sorted({g["request_id"] for g in out["gaps"]})
    )
    return out


def closure(
    engine_ms: float | None, tpot_ms_p50: float | None, concurrency: int, engine_tpot_ms: float | None = None
) -> dict:
    """Compared at every level, judged at C=1 only: at higher C other streams' prefills enter a request's TPOT but
    are not decode periods. `tpot_ms_p50`: the client's held TPOT p50 over the requests without a stall.

    `engine_tpot_ms`: the engine's per-token time on TPOT's footing (see engine_tpot_ms()); the per-token time
    itself when not given."""
    ref = engine_tpot_ms if engine_tpot_ms is not None else engine_ms
    diff = (ref - tpot_ms_p50) / tpot_ms_p50 * 100 if ref and tpot_ms_p50 else None
    judged = concurrency == 1 and diff is not None
    return {
        "engine_ms_per_token": engine_ms,
        "engine_tpot_ms": ref,
        "client_tpot_ms_p50": tpot_ms_p50,
        "diff_pct": diff,
        "tolerance_pct": CLOSURE_TOL_PCT,
        "judged": judged,
        "ok": (abs(diff) <= CLOSURE_TOL_PCT) if judged else None,
    }


def closure_text(lv: dict) -> str | None:
    """The sentence `attribute` and the report print when a judged closure fails (no cause named)."""
    c, s = lv.get("closure") or {}, lv.get("stalls") or {}
    if c.get("ok") is not False:
        return None
    where = f" in request(s) {', '.join(map(str, s['requests'][:8]))}" if s.get("requests") else ""
    return (
        f"C={lv['concurrency']} repeat {lv.get('repeat', 0)}: closure check failed: the engine's per-token time "
        f"{c.get('engine_tpot_ms') or c['engine_ms_per_token']:.2f} ms (on TPOT's footing) and the client's held TPOT (requests without a stall) "
        f"p50 {c['client_tpot_ms_p50']:.2f} ms differ by "
        f"{c['diff_pct']:+.1f}% (tolerance {c['tolerance_pct']:g}%); client stalls: {s.get('count', 0)} "
        f"({s.get('total_ms', 0.0):.0f} ms){where}"
    )


def median_interval(values) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of `values`: [x_(j), x_(n+1-j)] (order statistics,
    1-based) with the largest j whose coverage 1 - 2 P(Bin(n, 1/2) <= j - 1) is at least INTERVAL_COVERAGE.
    Below six values no j reaches it, and the whole range stands with the coverage it has.
    Returns (lo, hi, coverage), or None without values."""
    x = np.sort(np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float))
    n = int(x.size)
    if not n:
        return None

    # tail = P(Bin(n, 1/2) <= j - 1) * 2^n, exact in integers (2.0**n overflows past n = 1023)
    j, term, tail, whole = 1, 1, 1, 2**n

    def coverage(tail: int) -> float:
        return 1.0 - float(Fraction(2 * tail, whole))

    while j + 1 <= (n + 1) // 2:
        term = term * (n - j + 1) // j  # C(n, j)
        if coverage(tail + term) < INTERVAL_COVERAGE:
            break
        j, tail = j + 1, tail + term
    return float(x[j - 1]), float(x[n - j]), coverage(tail)


def delivery(per_request_ms, engine_tpot: float | None) -> dict | None:
    """The client's held TPOT p50 over the requests without a stall minus the engine's per-token time on
    TPOT's footing (the closure's two sides, in ms), with the p50's interval shifted by the same engine
    figure. The interval is the client side's: the engine's per-token time is a mean over every decode
    period of the window and is taken as given. `resolved`: the interval excludes 0 and covers at least
    INTERVAL_COVERAGE (six requests or more)."""
    x = np.asarray([v for v in per_request_ms if v is not None and np.isfinite(v)], dtype=float)
    iv = median_interval(x)
    if iv is None or not engine_tpot:
        return None
    lo, hi, cov = iv
    p50 = float(np.percentile(x, 50))
    lo_ms, hi_ms = lo - engine_tpot, hi - engine_tpot
    return {
        "ms": p50 - engine_tpot,
        "lo_ms": lo_ms,
        "hi_ms": hi_ms,
        "coverage": cov,
        "requests": int(x.size),
        "engine_tpot_ms": engine_tpot,
        "resolved": bool(cov >= INTERVAL_COVERAGE and (lo_ms > 0 or hi_ms < 0)),
    }


def delivery_text(d: dict | None, fmt) -> str | None:
    """Delivery as `attribute` and the report print it: the signed figure only when its interval excludes 0."""
    if not d:
        return None
    n = d["requests"]
    iv = (  # the coverage rounded down: never more than it is
        f"{math.floor(d['coverage'] * 100)}% interval {fmt(d['lo_ms'])} to {fmt(d['hi_ms'])} ms "
        f"over {n} request{'' if n == 1 else 's'}"
    )
    if d["resolved"]:
        return f"{fmt(d['ms'])} ms ({iv})"
    if d["lo_ms"] > 0 or d["hi_ms"] < 0:  # excludes 0, but too few requests for a 95% interval
        return f"not resolved with {n} request{'' if n == 1 else 's'} ({fmt(d['ms'])} ms; {iv}; 6 give 95%)"
    return f"not separable from zero ({fmt(d['ms'])} ms; {iv})"


DELIVERY_CELL_NOTE = (
    "delivery = held TPOT p50 without stalls - engine on TPOT's footing; n.s. (its interval): not separable "
    "from zero; n.r.: fewer than 6 requests, no 95% interval; n/a: not measured, or a summary from an older "
    "tpcomm without the interval"
)


def delivery_cell(d: dict | None, fmt) -> str:
    """Delivery in a table cell (DELIVERY_CELL_NOTE): the figure when resolved, else why not, with its interval."""
    if not d:
        return "n/a"
    if d["resolved"]:
        return fmt(d["ms"])
    iv = f"({fmt(d['lo_ms'])} to {fmt(d['hi_ms'])})"
    return f"n.r. {iv}" if d["lo_ms"] > 0 or d["hi_ms"] < 0 else f"n.s. {iv}"


def engine_tpot_ms(
    engine_ms: float | None, first_interval_ms: float | None, tokens_per_request: float | None
) -> float | None:
    """The engine's per-token time on TPOT's footing. A client's TPOT spans tokens 1..n of a request: n - 2
    decode-to-decode periods and, once, the interval from the prefill step's end to the first decode step's end
    (scheduling the new request; not a decode period, so not in the per-token time). On the engine's clock:
    (first interval + (n - 2) x per-token time) / (n - 1)."""
    if not engine_ms or first_interval_ms is None or not tokens_per_request or tokens_per_request < 3:
        return engine_ms
    n = float(tokens_per_request)
    return (first_interval_ms + (n - 2) * engine_ms) / (n - 1)


def client_side(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    engine_ms: float | None,
    concurrency: int,
    first_interval_ms: float | None = None,
) -> dict:
    """Client figures of one level (its in-stats requests), delivery, stalls and closure."""
    ok = requests[requests["ok"]] if "ok" in requests.columns else requests
    tok = tokens[tokens["request_id"].isin(ok["request_id"])] if not tokens.empty else tokens
    t = tok.sort_values(["request_id", "token_idx"]) if not tok.empty else tok
    itl = np.array([])
    if not t.empty:
        same = t["request_id"].to_numpy()[1:] == t["request_id"].to_numpy()[:-1]
        itl = (np.diff(t["t_ns"].to_numpy()) / 1e6)[same]
    tpot50 = _pct(ok["tpot_ms"], 50) if "tpot_ms" in ok.columns else None
    tpots = [v for v in ok.get("tpot_ms", []) if v is not None and np.isfinite(v)]
    per_req, n_held = judged_tpot_ms(ok, tok, engine_ms)
    stalls = find_stalls(tok, engine_ms)
    free = ok[~ok["request_id"].isin(stalls["requests"])] if "request_id" in ok.columns else ok
    tok_free = tok[tok["request_id"].isin(free["request_id"])] if not tok.empty else tok
    per_free, _ = judged_tpot_ms(free, tok_free, engine_ms)
    client = {
        "requests": int(len(ok)),
        "tpot_ms_p50": tpot50,
        "tpot_ms_mean": float(np.mean(tpots)) if tpots else None,
        "tpot_held_ms_p50": _pct(per_req, 50) if per_req.size else None,
        "held_requests": n_held,
        # the held TPOT p50 over the requests without a stall: what the engine's terms are held to
        "tpot_judged_ms_p50": _pct(per_free, 50) if per_free.size else None,
        "stalled_requests": int(len(ok) - len(free)),
        "itl_ms_p50": _pct(itl, 50),
        "itl_ms_mean": float(itl.mean()) if itl.size else None,
    }
    n_tokens = float(ok["output_tokens"].median()) if "output_tokens" in ok.columns and len(ok) else None
    judged = client["tpot_judged_ms_p50"]  # None when every request stalled: nothing to hold the terms to
    e_tpot = engine_tpot_ms(engine_ms, first_interval_ms, n_tokens)
    d = delivery(per_free, e_tpot) if per_free.size else None
    return {
        "client": client,
        "delivery_ms": d["ms"] if d else None,
        "delivery": d,
        "stalls": stalls,
        "first_interval_ms": first_interval_ms,
        "closure": closure(engine_ms, judged, concurrency, e_tpot),
    }


HELD_GAP_FRACTION = 0.1  # a token gap under this fraction of the engine's period: delivered in a burst
HELD_SHARE = 0.9  # a request with at least this share of such gaps was held back whole (bursty delivery is not)


def judged_tpot_ms(requests: pd.DataFrame, tokens: pd.DataFrame, engine_ms: float | None) -> tuple[np.ndarray, int]:
    """Per request the TPOT the closure judges: the plain TPOT, except for a request whose tokens mostly arrived
    in bursts (a held stream: its TPOT says nothing), for which the held TPOT stands in (held_tpot_ms).
    Returns (values, number of held requests)."""
    if requests.empty or "tpot_ms" not in requests.columns:
        return np.array([]), 0
    vals = requests["tpot_ms"].to_numpy(dtype=float)
    if not engine_ms or tokens is None or tokens.empty:
        return vals[np.isfinite(vals)], 0
    t = tokens.sort_values(["request_id", "token_idx"])
    gaps = t.groupby("request_id")["t_ns"].diff().dropna() / 1e6
    burst = (gaps < HELD_GAP_FRACTION * engine_ms).groupby(t.loc[gaps.index, "request_id"]).mean()
    held_ids = set(burst[burst >= HELD_SHARE].index)
    if held_ids:
        free = requests[~requests["request_id"].isin(held_ids)]
        ttft_ref = float(free["ttft_ms"].min()) if len(free) else float(requests["ttft_ms"].min())
        held = requests["request_id"].isin(held_ids).to_numpy()
        vals = np.where(held, (requests["e2e_ms"] - ttft_ref) / (requests["output_tokens"] - 1), vals)
    return vals[np.isfinite(vals)], len(held_ids)


def held_tpot_ms(requests: pd.DataFrame) -> np.ndarray:
    """Per request: (E2E - the level's fastest TTFT) / (tokens - 1).

    TPOT = (E2E - TTFT) / (tokens - 1) assumes the first token reached the client when the engine made it. A
    starved API server (2 cores, both bound to the TP workers) can hold a stream's first tokens and deliver
    them in one burst with the rest: TTFT then swallows the decode time and TPOT drops towards 0 (0.15 ms
    against a 3.6 ms engine period, seen here). E2E is not fooled (the last token cannot arrive before the
    engine made it), so the time after the level's fastest first token, per token, is what the stream spent
    decoding and being delivered. On an unstarved server it equals TPOT within the TTFT spread / (tokens - 1)."""
    need = {"e2e_ms", "ttft_ms", "output_tokens"}
    if requests.empty or not need <= set(requests.columns):
        return np.array([])
    r = requests.dropna(subset=list(need))
    r = r[r["output_tokens"] > 1]
    if r.empty:
        return np.array([])
    ttft_min = float(r["ttft_ms"].min())
    return ((r["e2e_ms"] - ttft_min) / (r["output_tokens"] - 1)).to_numpy(dtype=float)
