"""Two checkpoints of one model side by side: do they differ in anything the
interconnect or weight streaming could explain?"""

from __future__ import annotations

from tpcomm.plan.layout import Layout
from tpcomm.plan.weights import weight_bytes_per_gpu
from tpcomm.predict import plan_for


def compare_models(
    a: str,
    b: str,
    doc_a: dict,
    doc_b: dict,
    layout: Layout,
    measured: list[float] | None = None,
    engine: str | None = None,
) -> dict:
    """`engine`: the --engine both were predicted for (its vocabulary layout: Engine.vocab_parallel)."""
    from tpcomm.predict.engine import resolve_engine

    eng = resolve_engine(engine)
    pa, pb = plan_for(a, layout, engine=eng), plan_for(b, layout, engine=eng)
    key = lambda c: (c.op, c.group, c.bytes, c.count, c.site)
    same_coll = sorted(map(key, pa.collectives)) == sorted(map(key, pb.collectives))
    wa, wb = (weight_bytes_per_gpu(p.model, p.layout, vocab_parallel=p.vocab_parallel) for p in (pa, pb))
    same_bytes = abs(wa - wb) <= 1e-6 * max(wa, wb)
    out = {
        "models": [a, b],
        "same_collectives": same_coll,
        "weight_bytes_per_gpu": [wa, wb],
        "same_weight_bytes": same_bytes,
        "predicted_tok_per_s": [doc_a["single_stream"]["tok_per_s"], doc_b["single_stream"]["tok_per_s"]],
        "quantization": [pa.model.quant.description, pb.model.quant.description],
    }
    backends = [
        ((d.get("range") or {}).get("inputs") or {}).get("moe_layer_us", {}).get("backend") for d in (doc_a, doc_b)
    ]
    out["moe_kernel_backend"] = backends
    if same_coll and same_bytes:
        pa_, pb_ = out["predicted_tok_per_s"]
        text = (
            f"{a} and {b} issue the same collectives and read the same weight bytes per GPU per token "
            f"({wa / 1e9:.2f} GB), so a gap between them cannot come from the interconnect or from weight streaming: "
            "it comes from a term that differs, i.e. the kernels"
        )
        if backends[0] != backends[1]:
            text += (
                f". The model's MoE kernel-backend term differs ({backends[0]} vs {backends[1]}: e.g. W4A4 "
                f"activation quantization and the FP4 grouped GEMM versus INT4 weight-only Marlin kernels), so it "
                f"predicts {pa_:.1f} vs {pb_:.1f} tok/s."
            )
        else:
            text += f"; the model has no term that tells them apart and predicts the same speed ({pa_:.1f} tok/s)."
    else:
        text = (
            f"{a} and {b} differ in "
            + " and ".join(x for x, same in (("collectives", same_coll), ("weight bytes", same_bytes)) if not same)
            + f": predicted {out['predicted_tok_per_s'][0]:.1f} vs {out['predicted_tok_per_s'][1]:.1f} tok/s."
        )
    if measured and len(measured) == 2:
        ma, mb = measured
        gap_ms = 1e3 / mb - 1e3 / ma
        out["measured_tok_per_s"] = [ma, mb]
        out["measured_gap_ms_per_token"] = gap_ms
        slow, fast = (b, a) if gap_ms >= 0 else (a, b)
        gap = abs(gap_ms)
        moe_layers = len((pb if gap_ms >= 0 else pa).model.moe_layers)
        text += (
            f" Measured {ma:g} vs {mb:g} tok/s (given): {slow} spends {gap:.2f} ms more per token than {fast}"
            + (
                f", {gap * 1e3 / moe_layers:.0f} us per MoE layer if it all sits in the MoE kernels"
                if moe_layers
                else ""
            )
            + ". Fit the MoE extra terms to it with --fitted-to 1:TOK_S[,B:TOK_S] (labelled fitted, never called a prediction)."
        )
    out["conclusion"] = text
    return out
