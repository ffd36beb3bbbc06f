"""Bytes each GPU reads per decode step: weights by component, and the KV cache.

Units: bytes per GPU (for PP: per GPU of the stage, summed over the pipeline
where noted). "replicated" = every TP rank holds and reads the full tensor;
"sharded" = each rank reads 1/tp (or 1/ep for expert-parallel experts).
Routed experts at batch B: the expected number of distinct experts a step
touches is E * (1 - (1 - k/E)^B) (uniform routing), each read once.
Norms and biases are left out (< 0.1% of the bytes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpcomm.models.spec import ModelSpec
from tpcomm.plan.layout import Layout, padded_vocab


@dataclass(frozen=True)
class WeightComponent:
    component: str
    sharding: str  # replicated | sharded | expert
    params_per_gpu: float  # parameters read per step (all layers of the model; divide by pp for one stage)
    bits_per_weight: float
    bytes_per_gpu: float
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def expected_experts(n_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts touched by `batch` tokens with top-k of E (uniform routing)."""
    if n_experts <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** batch)


def weight_components(m: ModelSpec, lay: Layout, batch: int = 1) -> list[WeightComponent]:
    tp, H, q = lay.tp, m.hidden_size, m.quant
    comps: list[WeightComponent] = []
    L1 = 1 if m.num_layers > 1 else 0  # a representative layer index for module names

    def add(name, sharding, params, module, note="", linear=True):
        bits = q.bits_for(module, linear)
        comps.append(WeightComponent(name, sharding, params, bits, params * bits / 8, note))

    nl = m.num_layers
    if m.attention == "mla":
        rope, nope, v, kvr = m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank
        qk = nope + rope
        if m.q_lora_rank:
            add(
                "attention q_a/kv_a (replicated)",
                "replicated",
                nl * H * (m.q_lora_rank + kvr + rope),
                f"model.layers.{L1}.self_attn.q_a_proj",
                "fused_qkv_a_proj: replicated on every TP rank",
            )
            add(
                "attention q_b (sharded)",
                "sharded",
                nl * m.q_lora_rank * m.num_heads * qk / tp,
                f"model.layers.{L1}.self_attn.q_b_proj",
            )
        else:
            add(
                "attention kv_a (replicated)",
                "replicated",
                nl * H * (kvr + rope),
                f"model.layers.{L1}.self_attn.kv_a_proj_with_mqa",
            )
            add(
                "attention q (sharded)",
                "sharded",
                nl * H * m.num_heads * qk / tp,
                f"model.layers.{L1}.self_attn.q_proj",
            )
        add(
            "attention kv_b (sharded)",
            "sharded",
            nl * kvr * m.num_heads * (nope + v) / tp,
            f"model.layers.{L1}.self_attn.kv_b_proj",
        )
        add(
            "attention o_proj (sharded)",
            "sharded",
            nl * m.num_heads * v * H / tp,
            f"model.layers.{L1}.self_attn.o_proj",
        )
    else:
        kv_local = max(1, m.num_kv_heads // tp)
        add(
            "attention qkv (sharded)",
            "sharded",
            nl * H * (m.num_heads // tp + 2 * kv_local) * m.head_dim,
            f"model.layers.{L1}.self_attn.qkv_proj",
            "KV heads replicated when tp > num_kv_heads" if tp > m.num_kv_heads else "",
        )
        add(
            "attention o_proj (sharded)",
            "sharded",
            nl * m.num_heads * m.head_dim * H / tp,
            f"model.layers.{L1}.self_attn.o_proj",
        )
    n_dense, n_moe = len(m.dense_layers), len(m.moe_layers)
    if n_dense and m.intermediate_size:
        add(
            "dense MLP (sharded)",
            "sharded",
            n_dense * 3 * H * m.intermediate_size / tp,
            f"model.layers.{m.dense_layers[0]}.mlp.down_proj",
        )
    if n_moe:
        Lm = m.moe_layers[0]
        add(
            "MoE router (replicated)",
            "replicated",
            n_moe * H * m.n_routed_experts,
            f"model.layers.{Lm}.mlp.gate",
            linear=False,
        )
        if m.n_shared_experts:
            add(
                "shared experts (sharded)",
                "sharded",
                n_moe * 3 * H * m.moe_intermediate_size * m.n_shared_experts / tp,
                f"model.layers.{Lm}.mlp.shared_experts.down_proj",
            )
        touched = expected_experts(m.n_routed_experts, m.num_experts_per_tok, batch)
        per_expert = 3 * H * m.moe_intermediate_size
        if lay.ep:
            # Each EP rank holds E/ep whole experts; on average it reads touched/ep of them.
            params, note = (
                n_moe * touched * per_expert / lay.ep_size,
                f"{touched:.1f} of {m.n_routed_experts} experts touched per step, whole experts over EP {lay.ep_size} (average rank)",
            )
        else:
            params, note = (
                n_moe * touched * per_expert / tp,
                f"{touched:.1f} of {m.n_routed_experts} experts touched per step, each sharded over TP {tp}",
            )
        add("routed experts", "expert", params, f"model.layers.{Lm}.mlp.experts.0.down_proj", note)
    add("lm_head (sharded)", "sharded", padded_vocab(m.vocab_size) * H / tp, "lm_head")
    rows = min(batch, padded_vocab(m.vocab_size) // tp)  # never more rows than the shard holds
    add(
        "embedding rows",
        "sharded",
        rows * H,
        "model.embed_tokens",
        "B rows of the local vocab shard (upper bound)",
        linear=False,
    )
    return comps


def weight_bytes_per_gpu(m: ModelSpec, lay: Layout, batch: int = 1) -> float:
    """Bytes read per decode step on one GPU, summed over the pipeline (the single-token critical path)."""
    return sum(c.bytes_per_gpu for c in weight_components(m, lay, batch)) / lay.pp


def kv_bytes_per_token(m: ModelSpec, lay: Layout, kv_dtype_bytes: int | None = None) -> dict:
    """KV-cache bytes per context token per GPU (all layers of one stage), and how it is laid out."""
    b = kv_dtype_bytes or m.dtype_bytes
    layers = m.num_layers / lay.pp
    if m.attention == "mla":
        per_layer = (m.kv_lora_rank + m.qk_rope_head_dim) * b
        per_gpu = layers * per_layer / lay.dcp
        how = f"MLA latent ({m.kv_lora_rank}+{m.qk_rope_head_dim}) x {b} B per layer, replicated on every TP rank" + (
            f", tokens split over DCP {lay.dcp}" if lay.dcp > 1 else ""
        )
    else:
        kv_local = max(1, m.num_kv_heads // lay.tp)
        per_layer = 2 * kv_local * m.head_dim * b
        per_gpu = layers * per_layer
        how = f"K and V, {kv_local} KV head(s) x {m.head_dim} x {b} B per layer per rank"
    return {"bytes_per_token_per_gpu": per_gpu, "bytes_per_token_per_layer": per_layer, "dtype_bytes": b, "layout": how}
