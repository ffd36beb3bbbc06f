"""config.json -> ModelSpec, per architecture family, every problem of a config collected and reported at once.

Each family reads the fields vLLM 0.32's model file reads (vllm/model_executor/models/<family>.py):
- deepseek_v2 / glm4_moe: MLA or GQA attention, first_k_dense_replace dense layers, routed + shared experts.
- llama / qwen2 / qwen3 / mistral (llama.py): GQA attention and a dense MLP in every layer.
- qwen3_moe / mixtral / qwen2_moe: GQA attention and a MoE block (Qwen2-MoE: one gated shared expert).
- qwen3_5 (Qwen3-Next, Qwen3.5/3.6): `layer_types` linear_attention (Gated DeltaNet, a fixed recurrent state) or
  full_attention (gated: q_proj also emits the output gate); MoE with one shared expert, or a dense MLP.
- gemma3: sliding-window layers (`sliding_window`) and global layers (`layer_types`, else 5 sliding : 1 global).
- gemma4: as gemma3 plus global layers with their own head_dim / KV heads (global_head_dim,
  num_global_key_value_heads) and KV-shared layers (num_kv_shared_layers: no K/V of their own). The MoE block
  and per-layer input embeddings of some Gemma 4 variants are not modelled: refused, naming the field.
- gpt_oss: alternating sliding (128) and full attention, MoE in every layer, MXFP4 experts.
"""

from __future__ import annotations

from tpcomm.errors import InputError
from tpcomm.models.quant import dtype_bits, parse_quantization
from tpcomm.models.spec import FAMILIES, ModelSpec

# Other spellings of the fields read below, per family: the `attribute_map`s of the installed transformers'
# config classes (5.x: DeepseekV2Config num_experts, DeepseekV3Config/Glm4MoeConfig num_local_experts ->
# n_routed_experts; Qwen3MoeConfig/MixtralConfig num_experts <-> num_local_experts) and what vLLM 0.32 reads.
# A config saved by one transformers version uses one name, another version the other: both must plan.
ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "deepseek_v2": {"n_routed_experts": ("num_local_experts", "num_experts")},
    "glm4_moe": {"n_routed_experts": ("num_local_experts", "num_experts")},
    "qwen3_moe": {"num_experts": ("num_local_experts",)},
    "qwen2_moe": {"num_experts": ("num_local_experts",)},
    "qwen3_5": {"num_experts": ("num_local_experts",)},
    "mixtral": {"num_local_experts": ("num_experts",)},
    "gpt_oss": {"num_local_experts": ("num_experts",)},
}


class Problems:
    """Every problem of one config, raised together as one InputError."""

    def __init__(self, where: str, cfg: dict):
        self.where, self.cfg = where, cfg
        self.missing: list[str] = []
        self.other: list[str] = []

    def need(self, *keys: str) -> None:
        self.missing += [k for k in keys if self.cfg.get(k) is None and k not in self.missing]

    def int(self, key: str, default=None, positive: bool = True) -> int:
        v = self.cfg.get(key)
        if v is None:
            v = default
        if v is None:
            if key not in self.missing:
                self.missing.append(key)
            return 0
        try:
            if isinstance(v, bool) or float(v) != int(float(v)):
                raise ValueError
            iv = int(float(v))
        except (TypeError, ValueError):
            self.other.append(f"{key} is {v!r}, a shape field that is not a whole number")
            return 0
        if positive and iv <= 0:
            self.other.append(f"{key} is {iv}, not a positive integer")
        return iv

    def raise_if_any(self) -> None:
        msgs = (["missing config fields: " + ", ".join(self.missing)] if self.missing else []) + self.other
        if msgs:
            raise InputError(self.where, "; ".join(msgs), "the fields vLLM reads for this architecture")


def _canonical(inner: dict, family: str) -> dict:
    out = dict(inner)
    for field, others in ALIASES.get(family, {}).items():
        if out.get(field) is None:
            out[field] = next((inner[o] for o in others if inner.get(o) is not None), None)
    return out


def _eps(v, pr: Problems) -> float | None:
    if v is None:
        return None
    try:
        eps = float(v)
    except (TypeError, ValueError):
        eps = None
    if eps is None or not eps > 0:
        pr.other.append(f"rms_norm_eps is {v!r}, expected a small positive number such as 1e-06")
        return None
    return eps


def _layer_kinds(inner: dict, n: int, family: str, pr: Problems) -> tuple[str, ...]:
    """Per-layer attention kind from `layer_types` (HF spelling), or the family's default pattern."""
    names = {
        "full_attention": "full",
        "attention": "full",
        "sliding_attention": "sliding",
        "linear_attention": "linear",
    }
    lt = inner.get("layer_types")
    if lt is None:
        if family == "qwen3_5":
            every = int(inner.get("full_attention_interval") or 4)  # Qwen3-Next/3.5: 3 linear : 1 full
            return tuple("full" if (i + 1) % every == 0 else "linear" for i in range(n))
        if family in ("gemma3", "gemma4"):
            every = int(inner.get("sliding_window_pattern") or 6)  # transformers' Gemma3/4 default: 5 : 1
            return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n))
        if family == "gpt_oss":
            return tuple("sliding" if i % 2 == 0 else "full" for i in range(n))  # vLLM gpt_oss.py: even layers
        return ()
    if not isinstance(lt, list) or len(lt) != n or any(t not in names for t in lt):
        pr.other.append(
            f"layer_types has {len(lt) if isinstance(lt, list) else type(lt).__name__} entries "
            f"({sorted(set(map(str, lt)) - set(names)) if isinstance(lt, list) else lt!r}), expected "
            f"{n} of {', '.join(names)}"
        )
        return ()
    kinds = [names[t] for t in lt]
    return tuple(kinds) if any(k != "full" for k in kinds) else ()


def spec_from_config(cfg: dict, name: str, source: str, where: str) -> ModelSpec:
    top_arch = (cfg.get("architectures") or [None])[0]
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    inner = text or cfg
    arch = top_arch or (inner.get("architectures") or [None])[0]
    if arch not in FAMILIES:
        raise InputError(where, f"unsupported architecture {arch!r}", "one of " + ", ".join(sorted(FAMILIES)))
    family = FAMILIES[arch]
    inner = _canonical(inner, family)
    pr = Problems(where, inner)
    # Quantization sits at the top level for multimodal wrappers (Kimi K2.5, Qwen3.5), in the text config otherwise.
    qc = cfg.get("quantization_config") or inner.get("quantization_config")
    dtype = str(inner.get("torch_dtype") or inner.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    H = pr.int("hidden_size")
    L = pr.int("num_hidden_layers")
    nh = pr.int("num_attention_heads")
    vocab = pr.int("vocab_size")
    try:
        quant = parse_quantization(qc, dtype_bits(dtype), where)
    except InputError as e:
        pr.other.append(e.problem + (f" (expected {e.expected})" if e.expected else ""))
        quant = None
    common = dict(
        name=name,
        source=source,
        architecture=arch,
        family=family,
        hidden_size=H,
        num_layers=L,
        num_heads=nh,
        vocab_size=vocab,
        dtype=dtype,
        dtype_bytes=dtype_bits(dtype) // 8,
        tie_word_embeddings=bool(inner.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        rms_norm_eps=_eps(inner.get("rms_norm_eps"), pr),
    )
    kw = _family_fields(family, inner, L, nh, H, pr)
    pr.raise_if_any()
    return ModelSpec(**common, **kw, quant=quant)


def _family_fields(family: str, c: dict, L: int, nh: int, H: int, pr: Problems) -> dict:
    nkv = pr.int("num_key_value_heads", c.get("num_key_value_heads") or nh or 1)
    hd = pr.int("head_dim", c.get("head_dim") or (H // nh if nh else 1))
    gqa = dict(num_kv_heads=nkv, head_dim=hd)
    if family in ("deepseek_v2", "glm4_moe"):
        inter = pr.int("intermediate_size")
        moe_kw = dict(
            n_routed_experts=pr.int("n_routed_experts"),
            num_experts_per_tok=pr.int("num_experts_per_tok"),
            moe_intermediate_size=pr.int("moe_intermediate_size"),
            n_shared_experts=pr.int("n_shared_experts", 0, positive=False),
            intermediate_size=inter,
        )
        first_dense = pr.int("first_k_dense_replace", 0, positive=False)
        freq = pr.int("moe_layer_freq", 1) or 1
        moe_kw["moe_layers"] = tuple(i for i in range(L) if i >= first_dense and i % freq == 0)
        if family == "deepseek_v2":
            nope, rope = pr.int("qk_nope_head_dim"), pr.int("qk_rope_head_dim")
            return dict(
                **moe_kw,
                attention="mla",
                num_kv_heads=nh,
                head_dim=nope + rope,
                q_lora_rank=c.get("q_lora_rank"),
                kv_lora_rank=pr.int("kv_lora_rank"),
                qk_nope_head_dim=nope,
                qk_rope_head_dim=rope,
                v_head_dim=pr.int("v_head_dim"),
            )
        return dict(**moe_kw, **gqa)
    if family in ("qwen3_moe", "qwen2_moe"):
        n_exp = pr.int("num_experts")
        step = pr.int("decoder_sparse_step", 1) or 1
        mlp_only = set(c.get("mlp_only_layers") or [])
        out = dict(
            **gqa,
            intermediate_size=pr.int("intermediate_size", 0, positive=False),
            n_routed_experts=n_exp,
            num_experts_per_tok=pr.int("num_experts_per_tok"),
            moe_intermediate_size=pr.int("moe_intermediate_size"),
            moe_layers=tuple(i for i in range(L) if i not in mlp_only and n_exp > 0 and (i + 1) % step == 0),
        )
        if family == "qwen2_moe":
            out["shared_expert_intermediate_size"] = pr.int("shared_expert_intermediate_size", 0, positive=False)
        return out
    if family == "mixtral":
        return dict(
            **gqa,
            intermediate_size=0,
            n_routed_experts=pr.int("num_local_experts"),
            num_experts_per_tok=pr.int("num_experts_per_tok"),
            moe_intermediate_size=pr.int("intermediate_size"),
            moe_layers=tuple(range(L)),
        )
    if family == "gpt_oss":
        return dict(
            **gqa,
            intermediate_size=0,
            n_routed_experts=pr.int("num_local_experts"),
            num_experts_per_tok=pr.int("num_experts_per_tok"),
            moe_intermediate_size=pr.int("intermediate_size"),
            moe_layers=tuple(range(L)),
            layer_kinds=_layer_kinds(c, L, family, pr),
            sliding_window=pr.int("sliding_window", 128),
        )
    if family == "qwen3_5":
        kinds = _layer_kinds(c, L, family, pr)
        lin = dict(
            layer_kinds=kinds,
            attn_output_gate=bool(c.get("attn_output_gate", True)),  # Qwen3-Next/3.5 gate every full layer
            linear_num_key_heads=pr.int("linear_num_key_heads"),
            linear_num_value_heads=pr.int("linear_num_value_heads"),
            linear_key_head_dim=pr.int("linear_key_head_dim"),
            linear_value_head_dim=pr.int("linear_value_head_dim"),
            linear_conv_kernel=pr.int("linear_conv_kernel_dim", 4),
        )
        if c.get("num_experts"):  # qwen3_5_moe_text / qwen3_next: a sparse MoE block in every layer
            return dict(
                **gqa,
                **lin,
                intermediate_size=0,
                n_routed_experts=pr.int("num_experts"),
                num_experts_per_tok=pr.int("num_experts_per_tok"),
                moe_intermediate_size=pr.int("moe_intermediate_size"),
                shared_expert_intermediate_size=pr.int("shared_expert_intermediate_size", 0, positive=False),
                moe_layers=tuple(range(L)),
            )
        return dict(**gqa, **lin, intermediate_size=pr.int("intermediate_size"))
    if family in ("gemma3", "gemma4"):
        kinds = _layer_kinds(c, L, family, pr)
        out = dict(
            **gqa,
            intermediate_size=pr.int("intermediate_size"),
            layer_kinds=kinds,
            sliding_window=pr.int("sliding_window", 4096),
        )
        if family == "gemma4":
            for field in ("num_experts", "hidden_size_per_layer_input"):
                if c.get(field) and (field != "hidden_size_per_layer_input" or c.get("vocab_size_per_layer_input")):
                    pr.other.append(
                        f"{field} is set: the Gemma 4 MoE block / per-layer input embeddings are not modelled yet"
                    )
            out["full_head_dim"] = pr.int("global_head_dim", c.get("global_head_dim") or hd)
            if c.get("attention_k_eq_v", True) and c.get("num_global_key_value_heads"):
                out["full_num_kv_heads"] = pr.int("num_global_key_value_heads")
            # The last N layers read the K/V of an earlier layer of their kind: no K/V weights or cache of their own.
            out["kv_shared_layers"] = pr.int("num_kv_shared_layers", 0, positive=False)
        return out
    # llama, mistral, qwen2, qwen3: dense
    return dict(**gqa, intermediate_size=pr.int("intermediate_size"))
