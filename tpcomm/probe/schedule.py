"""One decode step as the replay runs it: the plan's collectives in vLLM's order,
each with the bytes its site reads from memory before it.

Order (vLLM 0.32 DeepseekV2/Llama/Qwen forward, TP only):
    embedding (VocabParallelEmbedding)      -> all_reduce [B, hidden]
    per layer: attention (q/kv/o weights + KV cache at the context) -> o_proj all_reduce
               MLP or MoE (dense, or router + shared + touched experts) -> its all_reduce
    lm_head                                  -> logits all_gather [B, vocab/tp]
Sizes and counts come from `tpcomm plan` (tpcomm/plan/collectives.py); the work
of each site from its weight components (tpcomm/plan/weights.py) divided over
the layers that hold them, plus the KV cache each attention layer reads
(context tokens x batch x bytes per token per layer). `work_scale` scales every
site's bytes alike: below 1 a fraction of them is read (a CPU cannot stream a
1T model's shard per token); above 1 the site's own bytes are re-read (a small
model whose layers cost more than their bytes keeps its cache footprint).

Units: bytes per rank; work_bytes per rank per call, after scaling.
"""

from __future__ import annotations

from tpcomm.errors import InputError
from tpcomm.plan import build_plan
from tpcomm.plan.layout import padded_vocab

SITE_EMBED = "model.embed_tokens"
SITE_ATTN = "model.layers.*.self_attn.o_proj"
SITE_DENSE = "model.layers.*.mlp.down_proj"
SITE_MOE = "model.layers.*.mlp.experts"
SITE_LOGITS = "logits_processor (lm_head vocab shards)"


def _component_site(name: str) -> str:
    if name.startswith("attention"):
        return SITE_ATTN
    if name.startswith("dense MLP"):
        return SITE_DENSE
    if name.startswith(("MoE router", "shared experts", "routed experts")):
        return SITE_MOE
    if name.startswith("lm_head"):
        return SITE_LOGITS
    if name.startswith("embedding"):
        return SITE_EMBED
    raise ValueError(f"weight component {name!r} has no replay site")


def build_schedule(model: str, tp: int, batch: int = 1, context: int = 1024, work_scale: float = 1.0) -> dict:
    """The replay's step: {"slots": [...], "counts", "weights_bytes_per_rank", "kv_bytes_per_rank", ...}."""
    if batch < 1:
        raise InputError(f"--batch {batch}", "is not a positive integer", "a decode batch >= 1")
    if context < 0:
        raise InputError(f"--context {context}", "is negative", "context tokens per sequence >= 0")
    if not work_scale >= 0:
        raise InputError(f"--work-scale {work_scale}", "is negative", "a scale >= 0 (0: no work between collectives)")
    plan = build_plan(model, tp=tp, batches=[batch])
    m = plan.model
    sizes = {c.site: c for c in plan.for_batch(batch)}
    act = batch * m.hidden_size * m.dtype_bytes
    logits = batch * (padded_vocab(m.vocab_size) // tp) * m.dtype_bytes
    # World size 1: vLLM issues no collective; the replay still runs each as a one-rank call
    # so a single GPU exercises graph capture and the timers at the model's sizes.
    ar = lambda site: sizes[site].bytes if site in sizes else act  # noqa: E731
    ag = sizes[SITE_LOGITS].bytes if SITE_LOGITS in sizes else logits
    work = {SITE_EMBED: 0.0, SITE_ATTN: 0.0, SITE_DENSE: 0.0, SITE_MOE: 0.0, SITE_LOGITS: 0.0}
    for comp in plan.to_dict()["weights"][str(batch)]["components"]:
        work[_component_site(comp["component"])] += comp["bytes_per_gpu"]
    moe, dense = set(m.moe_layers), set(m.dense_layers)
    n_moe = sum(1 for i in range(m.num_layers) if i in moe)
    n_dense = m.num_layers - n_moe if dense else 0
    kv = plan.to_dict()["kv_cache"]["bytes_per_token_per_layer"] * context * batch
    per_call = {
        SITE_EMBED: work[SITE_EMBED],
        SITE_ATTN: work[SITE_ATTN] / m.num_layers + kv,
        SITE_DENSE: work[SITE_DENSE] / max(n_dense, 1),
        SITE_MOE: work[SITE_MOE] / max(n_moe, 1),
        SITE_LOGITS: work[SITE_LOGITS],
    }
    dt = m.dtype
    slots = [_slot(SITE_EMBED, None, "all_reduce", ar(SITE_EMBED), dt, per_call[SITE_EMBED], work_scale)]
    for i in range(m.num_layers):
        slots.append(_slot(SITE_ATTN, i, "all_reduce", ar(SITE_ATTN), dt, per_call[SITE_ATTN], work_scale))
        mlp = SITE_MOE if i in moe else SITE_DENSE
        if mlp == SITE_DENSE and not dense:  # the plan's rule: a down_proj all-reduce only where dense layers exist
            continue
        slots.append(_slot(mlp, i, "all_reduce", ar(mlp), dt, per_call[mlp], work_scale))
    slots.append(_slot(SITE_LOGITS, None, "all_gather", ag, dt, per_call[SITE_LOGITS], work_scale))
    counts = {
        "all_reduce": sum(s["op"] == "all_reduce" for s in slots),
        "all_gather": sum(s["op"] == "all_gather" for s in slots),
    }
    if tp > 1:
        planned = {op: v["count"] for op, v in plan.totals(batch).items()}
        if planned != counts:  # the schedule must be the plan's, call for call
            raise RuntimeError(f"replay schedule {counts} differs from the plan {planned} for {m.name} at TP {tp}")
    weights = sum(work.values())
    return {
        "model": m.name,
        "architecture": m.architecture,
        "tp": tp,
        "batch": batch,
        "context": context,
        "work_scale": work_scale,
        "hidden": m.hidden_size,
        "dtype": dt,
        "num_layers": m.num_layers,
        "slots": slots,
        "counts": counts,
        "weights_bytes_per_rank": weights,
        "kv_bytes_per_rank": kv * m.num_layers,
        "work_bytes_per_rank_unscaled": weights + kv * m.num_layers,
        "work_bytes_per_rank": sum(s["work_bytes"] for s in slots),
        "work_footprint_bytes_per_rank": sum(s["footprint_bytes"] for s in slots),
        "vllm_version_followed": plan.to_dict()["vllm_version_followed"],
    }


def _slot(site: str, layer: int | None, op: str, nbytes: int, dtype: str, unscaled: float, scale: float) -> dict:
    # Scale <= 1: read a fraction of the site's bytes once. Scale > 1: re-read the site's own bytes
    # (footprint unchanged), so the collectives meet the caches as the model leaves them.
    return {
        "site": site,
        "layer": layer,
        "op": op,
        "bytes": int(nbytes),
        "dtype": dtype,
        "work_bytes": int(round(unscaled * scale)),
        "footprint_bytes": int(round(unscaled * min(scale, 1.0))),
    }
