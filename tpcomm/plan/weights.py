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
    # GEMM kernels that read this component per decode step (all layers): the bytes one kernel reads
    # (bytes_per_gpu / kernels) set how close it gets to the bandwidth roofline (predict/model.py).
    kernels: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def expected_experts(n_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts touched by `batch` tokens with top-k of E (uniform routing)."""
    if n_experts <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** batch)


def _attention_layers(m: ModelSpec) -> list[tuple[int, int, int, bool]]:
    """(count, head_dim, kv_heads, has_kv) per group of softmax-attention layers (linear layers excluded)."""
    groups: dict[tuple[int, int, bool], int] = {}
    first_shared = m.num_layers - m.kv_shared_layers
    for i in range(m.num_layers):
        kind = m.kind(i)
        if kind == "linear":
            continue
        full = kind == "full"
        hd = (m.full_head_dim or m.head_dim) if full else m.head_dim
        nkv = (m.full_num_kv_heads or m.num_kv_heads) if full else m.num_kv_heads
        key = (hd, nkv, i < first_shared)
        groups[key] = groups.get(key, 0) + 1
    return [(n, hd, nkv, has_kv) for (hd, nkv, has_kv), n in groups.items()]


def weight_components(m: ModelSpec, lay: Layout, batch: int = 1, vocab_parallel: bool = True) -> list[WeightComponent]:
    """`vocab_parallel`: the engine shards the vocabulary over TP (vLLM's VocabParallelEmbedding and ParallelLMHead,
    SGLang, TGI); False: every rank holds and reads the whole lm_head (gpt-fast's tp.py shards only the layers)."""
    tp, H, q = lay.tp, m.hidden_size, m.quant
    comps: list[WeightComponent] = []
    L1 = 1 if m.num_layers > 1 else 0  # a representative layer index for module names

    def add(name, sharding, params, module, note="", linear=True, kernels=0.0):
        bits = q.bits_for(module, linear)
        comps.append(WeightComponent(name, sharding, params, bits, params * bits / 8, note, kernels))

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
                kernels=nl,
            )
            add(
                "attention q_b (sharded)",
                "sharded",
                nl * m.q_lora_rank * m.num_heads * qk / tp,
                f"model.layers.{L1}.self_attn.q_b_proj",
                kernels=nl,
            )
        else:
            add(
                "attention kv_a (replicated)",
                "replicated",
                nl * H * (kvr + rope),
                f"model.layers.{L1}.self_attn.kv_a_proj_with_mqa",
                kernels=nl,
            )
            add(
                "attention q (sharded)",
                "sharded",
                nl * H * m.num_heads * qk / tp,
                f"model.layers.{L1}.self_attn.q_proj",
                kernels=nl,
            )
        add(
            "attention kv_b (sharded)",
            "sharded",
            nl * kvr * m.num_heads * (nope + v) / tp,
            f"model.layers.{L1}.self_attn.kv_b_proj",
            kernels=2 * nl,  # absorbed into the W_UK and W_UV bmms at decode
        )
        add(
            "attention o_proj (sharded)",
            "sharded",
            nl * m.num_heads * v * H / tp,
            f"model.layers.{L1}.self_attn.o_proj",
            kernels=nl,
        )
    else:
        gate = 2 if m.attn_output_gate else 1  # Qwen3-Next/3.5: q_proj emits q and the output gate
        qkv = o = 0.0
        n_attn = 0
        replicated_kv = False
        for n, hd, nkv, has_kv in _attention_layers(m):
            kv_local = max(1, nkv // tp)
            replicated_kv |= tp > nkv
            qkv += n * H * (gate * m.num_heads // tp + (2 * kv_local if has_kv else 0)) * hd
            o += n * m.num_heads * hd * H / tp
            n_attn += n
        if n_attn:
            add(
                "attention qkv (sharded)",
                "sharded",
                qkv,
                f"model.layers.{L1}.self_attn.qkv_proj",
                "KV heads replicated when tp > num_kv_heads" if replicated_kv else "",
                kernels=n_attn,
            )
            add("attention o_proj (sharded)", "sharded", o, f"model.layers.{L1}.self_attn.o_proj", kernels=n_attn)
        n_lin = m.layers_of("linear")
        if n_lin:
            kd = m.linear_num_key_heads * m.linear_key_head_dim
            vd = m.linear_num_value_heads * m.linear_value_head_dim
            add(
                "linear attention in_proj (sharded)",
                "sharded",
                n_lin * H * (2 * kd + 2 * vd + 2 * m.linear_num_value_heads) / tp,
                f"model.layers.{L1}.linear_attn.in_proj_qkvz",
                "Gated DeltaNet in_proj_qkvz + in_proj_ba",
                kernels=2 * n_lin,
            )
            add(
                "linear attention out_proj (sharded)",
                "sharded",
                n_lin * vd * H / tp,
                f"model.layers.{L1}.linear_attn.out_proj",
                kernels=n_lin,
            )
    n_dense, n_moe = len(m.dense_layers), len(m.moe_layers)
    if n_dense and m.intermediate_size:
        add(
            "dense MLP (sharded)",
            "sharded",
            n_dense * 3 * H * m.intermediate_size / tp,
            f"model.layers.{m.dense_layers[0]}.mlp.down_proj",
            kernels=2 * n_dense,
        )
    if n_moe:
        Lm = m.moe_layers[0]
        add(
            "MoE router (replicated)",
            "replicated",
            n_moe * H * m.n_routed_experts,
            f"model.layers.{Lm}.mlp.gate",
            linear=False,
            kernels=n_moe,
        )
        shared = m.moe_intermediate_size * m.n_shared_experts or m.shared_expert_intermediate_size
        if shared:
            add(
                "shared experts (sharded)",
                "sharded",
                n_moe * 3 * H * shared / tp,
                f"model.layers.{Lm}.mlp.shared_experts.down_proj",
                kernels=2 * n_moe,
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
        # fused_moe reads each touched expert's w13 then w2 (two grouped kernels per layer)
        add("routed experts", "expert", params, f"model.layers.{Lm}.mlp.experts.0.down_proj", note, kernels=2 * n_moe)
    if not vocab_parallel:
        add("lm_head (replicated)", "replicated", m.vocab_size * H, "lm_head", "every rank reads all of it", kernels=1)
        rows = min(batch, m.vocab_size)
        add("embedding rows", "replicated", rows * H, "model.embed_tokens", "B rows of the whole table", linear=False)
        return comps
    add("lm_head (sharded)", "sharded", padded_vocab(m.vocab_size) * H / tp, "lm_head", kernels=1)
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


def weight_bytes_per_gpu(m: ModelSpec, lay: Layout, batch: int = 1, vocab_parallel: bool = True) -> float:
    """Bytes read per decode step on one GPU, summed over the pipeline (the single-token critical path)."""
    return sum(c.bytes_per_gpu for c in weight_components(m, lay, batch, vocab_parallel)) / lay.pp


def kv_bytes_per_token(m: ModelSpec, lay: Layout, kv_dtype_bytes: int | None = None) -> dict:
    """KV-cache bytes per context token per GPU (all softmax-attention layers of one stage that keep a cache),
    and how it is laid out. Sliding-window and linear-attention layers are in kv_read_bytes' accounting."""
    b = kv_dtype_bytes or m.dtype_bytes
    layers = m.num_layers / lay.pp
    if m.attention == "mla":
        per_layer = (m.kv_lora_rank + m.qk_rope_head_dim) * b
        per_gpu = layers * per_layer / lay.dcp
        how = f"MLA latent ({m.kv_lora_rank}+{m.qk_rope_head_dim}) x {b} B per layer, replicated on every TP rank" + (
            f", tokens split over DCP {lay.dcp}" if lay.dcp > 1 else ""
        )
        return {
            "bytes_per_token_per_gpu": per_gpu,
            "bytes_per_token_per_layer": per_layer,
            "dtype_bytes": b,
            "layout": how,
        }
    kv_local = max(1, m.num_kv_heads // lay.tp)
    per_layer = 2 * kv_local * m.head_dim * b
    if not m.layer_kinds and not m.kv_shared_layers:
        how = f"K and V, {kv_local} KV head(s) x {m.head_dim} x {b} B per layer per rank"
        return {
            "bytes_per_token_per_gpu": layers * per_layer,
            "bytes_per_token_per_layer": per_layer,
            "dtype_bytes": b,
            "layout": how,
        }
    per_gpu = 0.0
    for n, hd, nkv, has_kv in _attention_layers(m):
        if has_kv:
            per_gpu += n * 2 * max(1, nkv // lay.tp) * hd * b
    per_gpu /= lay.pp
    kinds = {k: m.layers_of(k) for k in ("full", "sliding", "linear") if m.layers_of(k)}
    how = (
        "K and V per rank of "
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
        + " layers"
        + (f" (sliding window {m.sliding_window} tokens)" if "sliding" in kinds else "")
        + (" (linear layers keep a fixed recurrent state instead)" if "linear" in kinds else "")
        + (f"; the last {m.kv_shared_layers} layers reuse earlier K/V" if m.kv_shared_layers else "")
    )
    return {"bytes_per_token_per_gpu": per_gpu, "bytes_per_token_per_layer": per_layer, "dtype_bytes": b, "layout": how}


def kv_read_bytes(m: ModelSpec, lay: Layout, context: int, kv_dtype_bytes: int | None = None) -> float:
    """Bytes one GPU reads per sequence per decode step for attention state, summed over the pipeline:
    full layers read `context` tokens of K/V, sliding layers at most the window, Gated DeltaNet layers read and
    write their recurrent state (num_v_heads/tp x key_dim x value_dim, the KV-cache dtype: vLLM's
    gated_delta_net_state_dtype with mamba_ssm_cache_dtype auto). KV-shared layers read their source's cache."""
    b = kv_dtype_bytes or m.dtype_bytes
    if m.attention == "mla":
        return m.num_layers * context * (m.kv_lora_rank + m.qk_rope_head_dim) * b / lay.dcp
    total = 0.0
    for i in range(m.num_layers):
        kind = m.kind(i)
        if kind == "linear":
            nv = max(1, m.linear_num_value_heads // lay.tp)
            total += 2 * nv * m.linear_key_head_dim * m.linear_value_head_dim * b
            continue
        full = kind == "full"
        hd = (m.full_head_dim or m.head_dim) if full else m.head_dim
        nkv = (m.full_num_kv_heads or m.num_kv_heads) if full else m.num_kv_heads
        tokens = context if full or not m.sliding_window else min(context, m.sliding_window)
        total += tokens * 2 * max(1, nkv // lay.tp) * hd * b
    return total
