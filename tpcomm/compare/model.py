"""Two predictions (predict.json) side by side: model-based, never called a measurement.

B - A per term at the central inputs, and over the input corners both predictions evaluated with the same
inputs (predict's range: each uncertain input at its low or high end): the model-based difference holds over
that range, or the statement says it cannot decide the sign. A term only one model has (e.g. a fitted
MoE-kernel term) counts as 0 ms in the other, and is named.

Units: ms per token, tok/s.
"""

from __future__ import annotations

from tpcomm.compare.levels import signed
from tpcomm.compare.results import ModelDiff, ModelTerm
from tpcomm.rundir.documents import Prediction, SingleStream


def _corners(p: Prediction) -> list[tuple[dict, dict]]:
    """(input levels, ms per term) of every corner of a prediction's range."""
    return [
        (c.get("inputs") or {}, {"ms_per_token": c.get("ms_per_token"), **(c.get("breakdown_ms") or {})})
        for c in (p.range or {}).get("corners") or []
    ]


def _pairs(ca: list, cb: list) -> list[tuple[dict, dict]]:
    """Corners of A and B at the same levels of every input both vary. An input one prediction holds fixed
    (given by the user, or fitted) takes any level of the other's: e.g. NVFP4's fitted MoE cost against INT4's
    low and high one."""
    out = []
    for ia, a in ca:
        for ib, b in cb:
            shared = set(ia) & set(ib)
            if all(ia[k] == ib[k] or "fixed" in (ia[k], ib[k]) for k in shared):
                out.append((a, b))
    return out


def _own_range(p: Prediction, name: str) -> list[float] | None:
    ss = (p.range or {}).get("single_stream") or {}
    r = ss.get("ms_per_token") if name == "ms_per_token" else (ss.get("breakdown_ms") or {}).get(name)
    return [r["low"], r["high"]] if isinstance(r, dict) and "low" in r else None


def model_diff(pa: Prediction, pb: Prediction) -> ModelDiff:
    sa, sb = pa.single_stream or SingleStream(), pb.single_stream or SingleStream()
    ba, bb = sa.breakdown_ms, sb.breakdown_ms
    names = ["ms_per_token"] + list(ba) + [k for k in bb if k not in ba]
    shared = _pairs(_corners(pa), _corners(pb))
    central = {"ms_per_token": (sa.ms_per_token, sb.ms_per_token)}
    central.update({k: (ba.get(k, 0.0), bb.get(k, 0.0)) for k in names[1:]})
    terms = []
    for k in names:
        a, b = central[k]
        d = b - a if a is not None and b is not None else None
        spread = [b_.get(k, 0.0) - a_.get(k, 0.0) for a_, b_ in shared if a_.get(k, 0.0) is not None]
        spread = [x for x in spread if x is not None] + ([d] if d is not None else [])
        terms.append(
            ModelTerm(
                name=k,
                a_ms=a,
                b_ms=b,
                diff_ms=d,
                diff_low_ms=min(spread) if shared and spread else None,
                diff_high_ms=max(spread) if shared and spread else None,
                a_range_ms=_own_range(pa, k),
                b_range_ms=_own_range(pb, k),
            )
        )
    notes = []
    for k in names[1:]:
        if k not in ba or k not in bb:
            notes.append(f"{k}: a term of {'B' if k not in ba else 'A'}'s model only (0 ms in the other)")
    for side, p in (("A", pa), ("B", pb)):
        for f in p.fitted:
            notes.append(f"{side}: {f.text or f.term} (fitted to measured figures, not predicted)")
        if sa.value == "measured terms" and p is pa or sb.value == "measured terms" and p is pb:
            notes.append(f"{side}: predict.json is anchored on the run's measured split (its terms are measured)")
    label = (
        f"model-based (predict.json): central inputs, and B - A over the {len(shared)} pairs of input corners at the same levels (an input one side holds fixed pairs with both of the other's)"
        if shared
        else "model-based (predict.json): central inputs only (no input range in both predictions)"
    )
    return ModelDiff(
        source="model-based",
        label=label,
        corners=len(shared),
        terms=terms,
        tok_per_s=[sa.tok_per_s, sb.tok_per_s],
        statement=_statement(terms, len(shared), {f.term for p in (pa, pb) for f in p.fitted}),
        notes=notes,
    )


def _statement(terms: list[ModelTerm], corners: int, fitted: set) -> str:
    head = terms[0]
    if head.diff_ms is None:
        return "Model-based: one of the predictions has no per-token time."
    lo, hi = head.diff_low_ms, head.diff_high_ms
    over = f" over the {corners} input corners both share: {signed(lo)} to {signed(hi)} ms" if corners else ""
    moved = sorted((t for t in terms[1:] if t.diff_ms), key=lambda t: -abs(t.diff_ms))
    which = ", ".join(f"{t.name} {signed(t.diff_ms)} ms" + (" (fitted)" if t.name in fitted else "") for t in moved[:3])
    if all(abs(t.diff_ms or 0) < 1e-12 for t in terms) and (not corners or max(abs(lo), abs(hi)) < 1e-12):
        return (
            "Model-based: the model predicts the same per-token time for A and B, 0 ms in every term"
            + (f" at all {corners} input corners" if corners else "")
            + ": a measured difference between them comes from something the model does not hold."
        )
    if corners and lo < 0 < hi:
        return (
            f"Model-based: B - A = {signed(head.diff_ms)} ms per token at the central inputs, but{over}: "
            "over its inputs' range the model cannot say which is faster"
            + (f" (terms that differ: {which})" if which else "")
        )
    word = "slower" if head.diff_ms > 0 else "faster"
    return (
        f"Model-based: B is {signed(abs(head.diff_ms))[1:]} ms per token {word} than A at the central inputs"
        + (f" ({over.strip()})" if over else "")
        + (f"; from {which}" if which else "")
        + "."
    )
