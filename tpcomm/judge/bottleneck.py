"""The one bottleneck rule, for a measured split and for a model-based range alike.

The rule: the interconnect is the bottleneck when collective TRANSFER is at least BOTTLENECK_SHARE (half)
of each token. Why transfer: it is the time every rank spends inside a collective together, the link at
work; wait (rank skew) is time in a collective too, but a faster link does not remove it, so it is named
apart (and said when it exceeds transfer). Why half: at half the token the link takes more than all other
terms together, so nothing else removed could even double the token rate while the link stays as it is.
From MAJOR_SHARE (a quarter) the interconnect is "a major part". A model-based split has no rank skew: its
collective term (latency per call x calls per token) counts as transfer. A model-based verdict is stated
only when every corner of its input ranges agrees (over_range); otherwise it says it cannot decide and
names the measurement that would.

attribute (measured), predict (model-based) and report all call this module; none has its own threshold.

Units: shares are fractions of the per-token time (0..1); *_ms milliseconds per token.
"""

from __future__ import annotations

from tpcomm.rundir.results import Terms, Verdict

BOTTLENECK_SHARE = 0.5
MAJOR_SHARE = 0.25
LINK_TERMS = ("transfer", "collectives")  # measured transfer, or the model's collective time
SKEW_TERMS = ("wait",)
NAMES = {
    "compute": "compute",
    "host_gap": "the host gap between steps",
    "weights": "weight streaming from memory",
    "overhead": "per-kernel launch gaps",
    "host": "the engine's host time per step",
    "launch_bound": "eager kernel launches (the CPU slower than the GPU)",
    "moe_layers": "the fixed cost of the MoE kernels per layer",
    "kv_cache": "KV-cache reads",
    "moe_kernel_penalty": "the MoE-kernel penalty (fitted extra term)",
    "moe_kernel_bandwidth": "the MoE-kernel bandwidth penalty (fitted extra term)",
}


def classify(terms: dict[str, float]) -> dict:
    """One breakdown: the link's share (transfer, or the model's collectives), the skew's share, whether the
    link is the bottleneck or a major part, and the largest other term."""
    vals = {k: float(v) for k, v in terms.items() if isinstance(v, (int, float))}
    total = sum(v for v in vals.values() if v > 0)
    link = sum(vals.get(k, 0.0) for k in LINK_TERMS)
    skew = sum(vals.get(k, 0.0) for k in SKEW_TERMS)
    share = link / total if total else 0.0
    others = {k: v for k, v in vals.items() if k not in LINK_TERMS + SKEW_TERMS and v > 0}
    return {
        "share": share,
        "skew_share": skew / total if total else 0.0,
        "bottleneck": share >= BOTTLENECK_SHARE,
        "major": share >= MAJOR_SHARE,
        "main_other": max(others, key=others.get) if others else None,
        "main_other_share": max(others.values()) / total if others and total else None,
    }


def pct(x: float) -> str:
    """A share as the verdict prints it; one more digit next to a threshold ("50%" never prints for 49.6%)."""
    s = f"{100 * x:.0f}"
    edges = {f"{100 * BOTTLENECK_SHARE:.0f}", f"{100 * MAJOR_SHARE:.0f}"}
    return f"{100 * x:.1f}" if s in edges and abs(100 * x - int(s)) > 0.05 else s


def measured(terms: Terms) -> Verdict:
    """The verdict on a measured split (one set of terms, one per-token time: always decided)."""
    c = classify(terms.as_dict())
    wait_over = terms.wait > terms.transfer
    main = NAMES.get(c["main_other"], c["main_other"])
    tail = f"; the largest term is {main} ({pct(c['main_other_share'])}%)." if c["main_other"] else "."
    if c["bottleneck"]:
        text = f"The interconnect is the bottleneck: collective transfer is {pct(c['share'])}% of each token."
    elif c["major"]:
        text = (
            f"The interconnect is a major part (transfer {pct(c['share'])}% of each token) but not the bottleneck"
            + tail
        )
    else:
        text = f"The interconnect is not the bottleneck: collective transfer is {pct(c['share'])}% of each token" + tail
    if wait_over:
        text += f" Rank skew (collective wait, {pct(c['skew_share'])}%) exceeds transfer: a faster link would not remove it."
    return Verdict(
        source="measured",
        decided=True,
        interconnect_is_bottleneck=c["bottleneck"],
        transfer_share=c["share"],
        collective_share=c["share"] + c["skew_share"],
        main_term=c["main_other"],
        wait_exceeds_transfer=wait_over,
        statement=text,
    )


def over_range(
    central: dict[str, float], corners: list[dict[str, float]], commands: dict[str, str], latency_alone_decides: bool
) -> dict:
    """The model-based verdict over an input box (predict/ranges.py: the extremes lie at its corners): a
    statement only where every corner agrees, else "cannot decide" and the measurement that decides it.
    `commands`: 'probe' and 'attribute' command lines. Returns predict.json's range.verdict document."""
    c = classify(central)
    at = [classify(x) for x in corners]
    lo, hi = min(a["share"] for a in at + [c]), max(a["share"] for a in at + [c])
    shares = (
        f"{pct(lo)}-{pct(hi)}% of each token over the stated ranges (central {pct(c['share'])}%)"
        if pct(lo) != pct(hi)
        else f"{pct(c['share'])}% of each token (every input fixed as given)"
    )
    bn = {a["bottleneck"] for a in at}
    out = {
        "share": {"low": lo, "central": c["share"], "high": hi},
        "decided": len(bn) == 1,
        "interconnect_is_bottleneck": bn.pop() if len(bn) == 1 else None,
        "main_other": None,
        "decides": None,
    }
    if not out["decided"]:
        cmd = commands["probe"] if latency_alone_decides else commands["attribute"]
        out["decides"] = cmd
        out["statement"] = (
            f"The model cannot decide whether the interconnect is the bottleneck: it takes {shares}. "
            f"The measurement that decides it: `{cmd}`."
        )
        return out
    if out["interconnect_is_bottleneck"]:
        out["statement"] = f"The interconnect is the bottleneck over the whole range of the model's inputs: {shares}."
        return out
    major = all(a["major"] for a in at)
    out["statement"] = (
        f"The interconnect is {'a major part but ' if major else ''}not the bottleneck over the whole range of "
        f"the model's inputs: {shares}."
    )
    mains = {a["main_other"] for a in at}
    if len(mains) == 1:
        out["main_other"] = mains.pop()
        out["statement"] += (
            f" The largest term is {NAMES.get(out['main_other'], out['main_other'])} at every corner of the range."
        )
    else:
        names = " or ".join(NAMES.get(m, m) for m in sorted(mains, key=str))
        out["cause_decides"] = commands["attribute"]
        out["statement"] += (
            f" Which term is largest ({names}) the model cannot decide: it turns on the assumed kernel costs, "
            f"memory efficiency and host time. The measurement that decides it: `{commands['attribute']}`."
        )
    return out


def from_range(doc: dict) -> Verdict:
    """predict.json's range.verdict as a Verdict (the report reads it unchanged)."""
    sh = doc.get("share") or {}
    return Verdict(
        source="model-based",
        decided=bool(doc.get("decided")),
        interconnect_is_bottleneck=doc.get("interconnect_is_bottleneck"),
        transfer_share=sh.get("central"),
        collective_share=sh.get("central"),
        main_term=doc.get("main_other"),
        wait_exceeds_transfer=None,
        statement=doc.get("statement") or "",
        decides=doc.get("decides") or doc.get("cause_decides"),
        share_range={k: float(sh[k]) for k in ("low", "central", "high") if isinstance(sh.get(k), (int, float))}
        or None,
    )
