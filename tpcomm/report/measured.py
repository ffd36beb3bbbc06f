"""The measured half of the verdict: the headline, its split, the client beside it, and the
levers that follow from the same terms.

One denominator: the headline is the engine's per-token time at the lowest concurrency (the mean
start-to-start period of consecutive decode steps, attribution/summary.json split_format 2), and
compute + collective transfer + collective wait + host gap between steps = that time, so the shares
printed sum to 100% and the stacked bar ends at the headline. Collective time = transfer + wait;
wait is rank skew, never link speed. The client's TPOT p50 is stated beside it with the delivery
difference and the closure check; when the check fails the verdict says so and names no cause.
Without a split (plugin off) the headline is the client's TPOT p50 and there are no shares.

Units: *_ms milliseconds per token, *_us microseconds, tok/s per stream, *_pct percent.
"""

from __future__ import annotations

from typing import Any

from tpcomm.attribute.closure import delivery_text
from tpcomm.report import readers

TERMS = ("compute", "transfer", "wait", "host_gap")
TERM_NAMES = {
    "compute": "compute",
    "transfer": "collective transfer",
    "wait": "collective wait (rank skew)",
    "host_gap": "host gap between steps",
}
BOTTLENECK_SHARE = 50.0


def shares_pct(terms: dict[str, float], total: float) -> dict[str, float]:
    """Shares of `total` rounded to 0.1 so that the printed shares sum to exactly 100.0 (largest remainder)."""
    raw = {k: 1000.0 * v / total for k, v in terms.items()}  # in tenths of a percent
    floor = {k: int(v // 1) for k, v in raw.items()}
    left = 1000 - sum(floor.values())
    for k in sorted(raw, key=lambda k: raw[k] - floor[k], reverse=True)[: max(left, 0)]:
        floor[k] += 1
    return {k: floor[k] / 10.0 for k in terms}


def measured(inp: readers.Inputs) -> dict[str, Any] | None:
    alevels = [x for x in (inp.attribution or {}).get("levels") or [] if x.get("concurrency") is not None]
    clevels = [x for x in readers.levels_list(inp.levels) if x.get("concurrency") is not None]
    if not alevels and not clevels:
        return None
    conc = min(x["concurrency"] for x in (alevels or clevels))
    tpots = sorted(x["tpot_ms_p50"] for x in clevels if x["concurrency"] == conc and x.get("tpot_ms_p50"))
    client_ms = tpots[len(tpots) // 2] if tpots else None
    fmt2 = (inp.attribution or {}).get("split_format") == 2
    split_lvs = (
        sorted(
            (x for x in alevels if x["concurrency"] == conc and x.get("engine_ms_per_token") and x.get("per_token_ms")),
            key=lambda x: x["engine_ms_per_token"],
        )
        if fmt2
        else []
    )
    cond = readers.conditions_text((inp.attribution or {}).get("conditions") or readers.levels_conditions(inp.levels))
    out: dict[str, Any] = {
        "concurrency": conc,
        "split": False,
        "terms": {},
        "client_tpot_ms_p50": client_ms,
        "interconnect_ms": None,
        "interconnect_share": None,
        "transfer_ms": None,
        "wait_ms": None,
        "collectives_per_token": None,
        "latency_us_each": None,
    }
    if not split_lvs:
        lv = next((x for x in alevels if x["concurrency"] == conc), {})
        ms = client_ms or lv.get("itl_ms_p50")
        if not ms:
            return None
        what = "client TPOT p50" if client_ms else "client ITL p50"
        why = (
            "attribution/summary.json predates the closing split: re-run tpcomm attribute"
            if alevels and not fmt2
            else "no hook records"
        )
        out.update(
            tok_per_s=1000.0 / ms,
            ms_per_token=ms,
            cap_from=what,
            label=f"measured at concurrency {conc}: tok/s from the {what}; no per-token split ({why}) ({cond})",
        )
        return out
    lv = split_lvs[len(split_lvs) // 2]  # the median repeat
    ms, pt = lv["engine_ms_per_token"], lv["per_token_ms"]
    terms = {k: float(pt[k]) for k in TERMS}
    transfer, wait = terms["transfer"], terms["wait"]
    per_tok = readers.total_count(lv.get("collectives_per_step") or {}, "observed")
    out.update(
        tok_per_s=1000.0 / ms,
        ms_per_token=ms,
        split=True,
        terms=terms,
        split_total_ms=sum(terms.values()),
        shares_pct=shares_pct(terms, ms),
        cap_from="engine decode-step period",
        interconnect_ms=transfer + wait,
        interconnect_share=(transfer + wait) / ms,
        collective_ms=transfer + wait,
        transfer_ms=transfer,
        wait_ms=wait,
        collectives_per_token=per_tok,
        transfer_us_each=1000.0 * transfer / per_tok if per_tok else None,
        decode_pairs=lv.get("decode_pairs"),
        delivery_ms=lv.get("delivery_ms"),
        delivery=lv.get("delivery"),
        closure=lv.get("closure") or {},
        stalls=lv.get("stalls") or {},
        label=f"measured at concurrency {conc}: per-token time = mean start-to-start period of consecutive "
        f"decode steps on the server's step clock, split from the hook records of the same steps ({cond})",
    )
    return out


def sentences(m: dict[str, Any], num: dict[str, str], fmt) -> list[str]:
    """The split, collective time and client sentences; fills `num` with every number they print."""
    sh = m["shares_pct"]
    for k in TERMS:
        num[f"{k}_ms"], num[f"{k}_pct"] = fmt(m["terms"][k]), f"{sh[k]:.1f}"
    parts = ", ".join(f"{TERM_NAMES[k]} {num[k + '_ms']} ms ({num[k + '_pct']}%)" for k in TERMS)
    out = [
        f"Of each {num['ms_per_token']} ms token (engine step clock, C={m['concurrency']}, mean over "
        f"{m.get('decode_pairs') or 'n/a'} consecutive decode steps per rank): {parts}."
    ]
    num["collective_ms"] = fmt(m["collective_ms"])
    num["collective_pct"] = f"{sh['transfer'] + sh['wait']:.1f}"
    num["collectives_per_token"] = fmt(m["collectives_per_token"])
    txt = (
        f"Collective time = transfer + wait = {num['collective_ms']} ms ({num['collective_pct']}% of each token) "
        f"over {num['collectives_per_token']} collectives per token"
    )
    if m.get("transfer_us_each") is not None:
        num["transfer_us_each"] = fmt(m["transfer_us_each"])
        txt += f"; transfer, the interconnect at work, is {num['transfer_us_each']} us per collective"
    out.append(
        txt + "; wait is ranks reaching a collective at different times (rank skew), which a faster link "
        "does not remove."
    )
    c, s = m.get("closure") or {}, m.get("stalls") or {}
    if m.get("client_tpot_ms_p50"):
        num["client_tpot_ms_p50"] = fmt(m["client_tpot_ms_p50"])
        txt = f"Beside it, the client saw a TPOT p50 of {num['client_tpot_ms_p50']} ms"
        if c.get("client_tpot_ms_p50") is not None:
            num["client_held_tpot_ms_p50"] = fmt(c["client_tpot_ms_p50"])
            txt += (
                f" and, over the requests without a client stall, a held TPOT p50 of "
                f"{num['client_held_tpot_ms_p50']} ms (the same, with any stream the API server held back whole "
                "counted from the unheld streams' fastest TTFT to its last token; stalls are counted below, apart)"
            )
        txt += "."
        parts, d = [], m.get("delivery")
        if d:
            num["engine_tpot_ms"] = fmt(d["engine_tpot_ms"])
            num["delivery"] = delivery_text(d, fmt)
            parts.append(
                f"against the engine's {num['engine_tpot_ms']} ms per token on TPOT's footing (the per-token time, "
                "plus once per request the prefill-to-first-decode interval), delivery (API server, network and "
                f"client) is {num['delivery']}"
            )
        elif m.get("delivery_ms") is not None:
            # A summary written before delivery carried its interval: a bare difference could be noise.
            parts.append(
                "delivery (API server, network and client): not stated, since this summary (an older tpcomm) "
                "has no interval for it; re-running the analysis adds one"
            )
        if c.get("diff_pct") is not None and c.get("judged"):
            num["closure_diff_pct"] = f"{c['diff_pct']:+.1f}"
            parts.append(
                f"closure: engine vs client held TPOT {num['closure_diff_pct']}% (tolerance {c['tolerance_pct']:g}%): "
                + (
                    "the split accounts for what the client saw"
                    if c.get("ok")
                    else "CLOSURE CHECK FAILED: the split explains the engine's time, not the client's; "
                    "cause not determined"
                )
            )
        if parts:
            rest = "; ".join(parts)
            txt += f" {rest[0].upper()}{rest[1:]}."
        out.append(txt)
    if s.get("count"):
        num["stalls"] = str(s["count"])
        where = ", ".join(map(str, s.get("requests", [])[:8]))
        out.append(
            f"Client stalls (token gaps over {fmt(s.get('threshold_ms'))} ms, in no term above): "
            f"{num['stalls']}, {fmt(s.get('total_ms'))} ms in all, in request(s) {where}."
        )
    return out


def bottleneck(m: dict[str, Any], pred: dict[str, Any] | None, fmt) -> dict[str, Any]:
    sh = m["shares_pct"]
    transfer, wait, coll = sh["transfer"], sh["wait"], sh["transfer"] + sh["wait"]
    other = max(("compute", "host_gap"), key=lambda k: sh[k])
    if transfer >= BOTTLENECK_SHARE:
        text = f"The interconnect is the bottleneck: collective transfer is {transfer:.1f}% of each token."
    else:
        text = (
            f"The interconnect is not the bottleneck (collective transfer {transfer:.1f}% of each token); the "
            f"largest term is {TERM_NAMES[other]} ({sh[other]:.1f}%)."
        )
    if wait > m["shares_pct"]["transfer"]:
        text += (
            f" Most collective time ({coll:.1f}%) is waiting for the slowest rank, not moving bytes: a faster "
            "link alone helps little; rank skew (uneven compute or host jitter) is what to remove."
        )
    if pred:
        floor = sum(
            v for k, v in (pred.get("terms") or {}).items() if k != "collectives" and isinstance(v, (int, float))
        )
        if floor and m["terms"]["compute"] / floor >= 2.0:
            text += (
                f" Measured compute ({fmt(m['terms']['compute'])} ms) is {fmt(m['terms']['compute'] / floor)}x "
                "what the analytic model expects for weight streaming plus per-kernel overhead on "
                f"{pred.get('hardware')} ({fmt(floor)} ms): the kernels run slower than memory bandwidth allows."
            )
    return {
        "interconnect_is_bottleneck": transfer >= BOTTLENECK_SHARE,
        "interconnect_share": transfer / 100.0,
        "collective_share": coll / 100.0,
        "main_other": other,
        "statement": text,
    }


def levers(m: dict[str, Any]) -> list[dict[str, Any]]:
    """Bounds from the same terms as the headline: take one term away, keep the rest as measured."""
    ms, out = m["ms_per_token"], []
    for name, desc, cut in (
        ("remove rank skew", "ranks reach each collective together: collective wait = 0", m["wait_ms"]),
        ("free interconnect (transfer = 0)", "collective transfer removed, rank skew kept", m["transfer_ms"]),
        ("no collective time (upper bound)", "transfer + wait = 0: all collective time removed", m["collective_ms"]),
    ):
        if cut and 0 < cut < ms:
            t = 1000.0 / (ms - cut)
            out.append(
                {
                    "name": name,
                    "description": desc,
                    "tok_per_s": t,
                    "change_pct": readers.pct_change(t, m["tok_per_s"]),
                    "source": "bound from the measurement (same terms as the split)",
                }
            )
    return out
