"""Per-level figures from client-side rows: throughput, percentiles, whether
the level was steady, and how far repeats of a level disagree.

A level is steady when its round's two halves (by wall time, between the
moment all C clients are busy and the moment the first one runs out of work)
agree on token rate and median ITL within `steady_pct`. Repeats of one level
differing by more than `spread_pct` in output tok/s are flagged: a benchmark
once gave 464 and 800 tok/s for the same level and nobody noticed.

Units: *_ms milliseconds, *_per_s per second of wall time, t_*_ns wall clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _pct(x, q):
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(x, q)) if x.size else None


def _mean(x):
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    return float(x.mean()) if x.size else None


def level_figures(rows: pd.DataFrame, tokens: pd.DataFrame) -> dict:
    """Throughput and percentiles over the rows of one round (failed requests counted, not timed)."""
    ok = rows[rows["ok"]]
    out = {"requests": int(len(rows)), "failed": int((~rows["ok"]).sum())}
    if ok.empty:
        return {
            **out,
            "output_tok_per_s": None,
            "requests_per_s": None,
            "ttft_ms_p50": None,
            "ttft_ms_p99": None,
            "tpot_ms_p50": None,
            "tpot_ms_p99": None,
            "tpot_ms_mean": None,
            "itl_ms_p50": None,
            "itl_ms_p99": None,
            "e2e_ms_p50": None,
            "duration_s": None,
        }
    dur_s = round_seconds(rows)
    itl = itls_ms(tokens[tokens["request_id"].isin(ok["request_id"])])
    tpot50 = _pct(ok["tpot_ms"], 50)
    # Tokens arriving in bursts (gaps far below the mean per-token time) mean the server's
    # streaming loop was starved: the median ITL then says little about step time.
    burst = float((itl < 0.2 * tpot50).mean() * 100) if itl.size and tpot50 else None
    return {
        **out,
        "output_tok_per_s": float(ok["output_tokens"].sum() / dur_s) if dur_s > 0 else None,
        "requests_per_s": float(len(ok) / dur_s) if dur_s > 0 else None,
        "ttft_ms_p50": _pct(ok["ttft_ms"], 50),
        "ttft_ms_p99": _pct(ok["ttft_ms"], 99),
        "tpot_ms_p50": _pct(ok["tpot_ms"], 50),
        "tpot_ms_p99": _pct(ok["tpot_ms"], 99),
        "tpot_ms_mean": _mean(ok["tpot_ms"]),
        "itl_ms_p50": _pct(itl, 50),
        "itl_ms_p99": _pct(itl, 99),
        "itl_ms_mean": float(itl.mean()) if itl.size else None,
        "itl_burst_pct": burst,
        "e2e_ms_p50": _pct(ok["e2e_ms"], 50),
        "duration_s": float(dur_s),
    }


def itls_ms(tokens: pd.DataFrame) -> np.ndarray:
    """All inter-token gaps (ms), pooled over requests as `vllm bench serve` does."""
    if tokens.empty:
        return np.array([])
    t = tokens.sort_values(["request_id", "token_idx"])
    gaps = np.diff(t["t_ns"].to_numpy()) / 1e6
    same = t["request_id"].to_numpy()[1:] == t["request_id"].to_numpy()[:-1]
    return gaps[same]


def steadiness(
    rows: pd.DataFrame, tokens: pd.DataFrame, concurrency: int, steady_pct: float
) -> tuple[bool | None, str]:
    """Compare the two halves of the round's full-concurrency window."""
    ok = rows[rows["ok"]]
    if len(ok) < 2 or tokens.empty:
        return None, "too few successful requests to judge"
    starts = np.sort(ok["t_start_ns"].to_numpy())
    ends = np.sort(ok["t_end_ns"].to_numpy())
    # All C clients are busy from the C-th start; the first client is idle after the
    # (N - C + 1)-th end, since each client's last request is one of the final C.
    lo = starts[min(concurrency, len(starts)) - 1]
    hi = ends[max(len(ends) - concurrency, 0)] if len(ends) > concurrency else ends[-1]
    if concurrency == 1:
        lo, hi = starts[0], ends[-1]
    t = tokens[(tokens["t_ns"] >= lo) & (tokens["t_ns"] <= hi)]
    if len(t) < 8 or hi <= lo:
        return None, f"steady window too short ({len(t)} tokens); add --requests"
    mid = lo + (hi - lo) // 2
    a, b = t[t["t_ns"] < mid], t[t["t_ns"] >= mid]
    rate_a, rate_b = len(a) / (mid - lo), len(b) / (hi - mid)
    itl_a, itl_b = np.median(itls_ms(a)) if len(a) > 2 else np.nan, np.median(itls_ms(b)) if len(b) > 2 else np.nan
    d_rate = abs(rate_a - rate_b) / max(rate_a, rate_b) * 100
    d_itl = abs(itl_a - itl_b) / max(itl_a, itl_b) * 100 if np.isfinite(itl_a) and np.isfinite(itl_b) else 0.0
    note = f"halves differ by {d_rate:.1f}% in token rate and {d_itl:.1f}% in median ITL (threshold {steady_pct:g}%)"
    return bool(d_rate <= steady_pct and d_itl <= steady_pct), note


def repeat_spread(levels: list[dict], spread_pct: float) -> None:
    """Set repeat_spread_pct and a flag on every level whose repeats disagree (in place)."""
    by_c: dict[int, list[dict]] = {}
    for lv in levels:
        by_c.setdefault(lv["concurrency"], []).append(lv)
    for c, group in by_c.items():
        vals = [g["output_tok_per_s"] for g in group if g.get("output_tok_per_s")]
        if len(vals) < 2:
            for g in group:
                g["repeat_spread_pct"] = None
            continue
        spread = (max(vals) - min(vals)) / float(np.median(vals)) * 100
        for g in group:
            g["repeat_spread_pct"] = round(spread, 2)
            if spread > spread_pct:
                flag = (
                    f"repeats of C={c} disagree: output tok/s {min(vals):.1f} to {max(vals):.1f} "
                    f"({spread:.1f}% > {spread_pct:g}%)"
                )
                if flag not in g["flags"]:
                    g["flags"].append(flag)


def round_seconds(rows: pd.DataFrame) -> float:
    """The round's span from its first send to its last token, on the monotonic clock where the rows carry it
    (each request is placed on the wall clock as it read at its own send: a step of the wall clock between two
    requests is not in their difference there), else on the wall clock (older files)."""
    mono = ("t_start_mono_ns", "t_end_mono_ns")
    if set(mono) <= set(rows.columns):
        a, b = (pd.to_numeric(rows[c], errors="coerce") for c in mono)
        if a.notna().all() and b.notna().all():
            return float(b.max() - a.min()) / 1e9
    return float(rows["t_end_ns"].max() - rows["t_start_ns"].min()) / 1e9
