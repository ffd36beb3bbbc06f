"""`tpcomm plan`: the collectives vLLM issues per decode step, and the bytes each
GPU reads per token, for a model config and a parallel layout.

    >>> from tpcomm.plan import build_plan
    >>> doc = build_plan("kimi-k2.5", tp=8, batches=[1]).to_dict()
    >>> doc["collectives"][0]["op"], doc["totals"]["all_reduce"]["count"]
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.models import ModelSpec, load_model
from tpcomm.plan.collectives import VLLM_VERSION_FOLLOWED, Collective, decode_collectives
from tpcomm.plan.layout import Layout, pp_partition
from tpcomm.plan.weights import kv_bytes_per_token, weight_bytes_per_gpu, weight_components

__all__ = ["build_plan", "Plan", "Layout", "Collective"]


@dataclass
class Plan:
    model: ModelSpec
    layout: Layout
    batches: list[int]
    collectives: list[Collective] = field(default_factory=list)
    fusion: dict | None = None  # vLLM's all-reduce + RMSNorm fusion on the target GPU (topo/fusion.py)
    # The vocabulary sharded over TP (vLLM's plan); predict clears it for an engine that replicates the lm_head
    # (engine.Engine.vocab_parallel), whose plan then has no embedding all-reduce nor logits gather.
    vocab_parallel: bool = True

    def for_batch(self, batch: int) -> list[Collective]:
        return [c for c in self.collectives if c.batch == batch]

    def totals(self, batch: int | None = None) -> dict:
        """Per op: calls per decode step on the critical path (all pipeline stages) and bytes per rank."""
        batch = self.batches[0] if batch is None else batch
        t: dict = defaultdict(lambda: {"count": 0, "bytes": 0})
        for c in self.for_batch(batch):
            t[c.op]["count"] += c.count
            t[c.op]["bytes"] += c.count * c.bytes
        return dict(t)

    def message_sizes(self) -> list[dict]:
        """Distinct (op, group, group_size, bytes, dtype) for the probe, over all batches."""
        seen = {}
        for c in self.collectives:
            seen.setdefault((c.op, c.group, c.group_size, c.bytes, c.dtype), c.batch)
        return [
            {"op": o, "group": g, "group_size": n, "bytes": b, "dtype": d, "batch": bt}
            for (o, g, n, b, d), bt in seen.items()
        ]

    def to_dict(self) -> dict:
        m, lay = self.model, self.layout
        return {
            "model": {
                "name": m.name,
                "source": m.source,
                "architecture": m.architecture,
                "vllm_model_file": f"model_executor/models/{m.family}.py",
                "hidden_size": m.hidden_size,
                "num_layers": m.num_layers,
                "moe_layers": len(m.moe_layers),
                "dense_layers": len(m.dense_layers),
                "attention": m.attention,
                "layer_kinds": {k: m.layers_of(k) for k in ("full", "sliding", "linear") if m.layers_of(k)}
                if m.layer_kinds
                else None,
                "sliding_window": m.sliding_window or None,
                "num_heads": m.num_heads,
                "num_kv_heads": m.num_kv_heads,
                "vocab_size": m.vocab_size,
                "n_routed_experts": m.n_routed_experts,
                "num_experts_per_tok": m.num_experts_per_tok,
                "dtype": m.dtype,
                "quantization": {
                    "method": m.quant.method,
                    "description": m.quant.description,
                    "weight_bits": m.quant.weight_bits,
                    "activations": m.quant.activations,
                    "notes": list(m.quant.notes),
                },
            },
            "layout": lay.to_dict(),
            "pp_layers_per_stage": pp_partition(m.num_layers, lay.pp),
            "batches": self.batches,
            "vllm_version_followed": VLLM_VERSION_FOLLOWED,
            "collectives": [c.to_dict() for c in self.collectives],
            "allreduce_fusion": self.fusion,
            "totals": {str(b): self.totals(b) for b in self.batches},
            "weights": {
                str(b): {
                    "bytes_per_gpu_per_step": weight_bytes_per_gpu(m, lay, b, self.vocab_parallel),
                    "components": [c.to_dict() for c in weight_components(m, lay, b, self.vocab_parallel)],
                }
                for b in self.batches
            },
            "kv_cache": kv_bytes_per_token(m, lay),
            "conditions": {
                "phase": "decode (one token per sequence per step)",
                "batch_means": "sequences per step",
                "bytes_means": "per rank per call (input buffer); all_gather output = bytes x group_size",
                "count_means": "calls per decode step on one rank of the stage (pp_stage)",
                "derived_from": f"vLLM {VLLM_VERSION_FOLLOWED} model code, eager semantics (CUDA graphs replay the same collectives)",
                "path_means": "group_coordinator, or flashinfer_fused_ar_rmsnorm: the all-reduce runs fused with the "
                "RMSNorm after it in one FlashInfer kernel (same bytes), only with --sm 9.0/10.x",
            },
        }


def build_plan(
    model: str | Path | dict | ModelSpec,
    tp: int = 1,
    ep: bool = False,
    dp: int = 1,
    pp: int = 1,
    dcp: int = 1,
    batches: list[int] | tuple[int, ...] = (1,),
    sm: str | None = None,
    flashinfer: bool | None = None,
    server_batch_invariant: bool | None = None,
) -> Plan:
    """`sm` (compute capability of the target GPU, e.g. "9.0") and `flashinfer` (usable in the server; None: not
    known, the fusion is judged as if it were and its `why` says so)
    decide vLLM's FlashInfer all-reduce + RMSNorm fusion; without `sm` every row stays group_coordinator.
    `server_batch_invariant`: the server's VLLM_BATCH_INVARIANT from its hook status (allreduce_fusion
    .batch_invariant); None: this shell's, assumed the server's (the fusion's `why` says so)."""
    m = model if isinstance(model, ModelSpec) else load_model(model)
    lay = Layout(tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp)
    lay.validate(m)
    batches = list(batches) or [1]
    for b in batches:
        if not isinstance(b, int) or b < 1:
            raise InputError(f"--batch {b}", "is not a positive integer", "a decode batch size >= 1")
    plan = Plan(m, lay, batches)
    for b in batches:
        plan.collectives.extend(decode_collectives(m, lay, b))
    if sm is not None:
        _apply_fusion(plan, sm, flashinfer, server_batch_invariant)
    return plan


def _apply_fusion(plan: Plan, sm: str, flashinfer: bool | None, server_batch_invariant: bool | None = None) -> None:
    from tpcomm.topo.fusion import PATH, allreduce_fusion, is_fused
    from tpcomm.topo.rules import vllm_tables

    m = plan.model
    tables = vllm_tables()
    rule = allreduce_fusion(
        sm,
        plan.layout.tp,
        flashinfer,
        tables,
        m.hidden_size,
        m.dtype_bytes,
        server_batch_invariant=server_batch_invariant,
        rms_norm_eps=m.rms_norm_eps,
    )
    plan.fusion = {**rule, "sm": sm, "flashinfer": flashinfer, "tables_source": tables["source"]}
    plan.collectives = [
        replace(c, path=PATH, fused=True) if is_fused(c.site, c.op, c.group, c.bytes, rule, c.batch, sm) else c
        for c in plan.collectives
    ]
