"""A model's shapes, normalised across architectures (what plan and predict need).

Units: sizes are element counts (hidden size, heads, ...); `dtype_bytes` is the
activation/weight dtype size in bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tpcomm.models.quant import QuantScheme

# architecture (config.json "architectures"[0]) -> vLLM model file it follows
FAMILIES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v2",
    "KimiK25ForConditionalGeneration": "deepseek_v2",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "Glm4MoeForCausalLM": "glm4_moe",
    # Added for issue 19; each follows its vLLM 0.32 model file (tpcomm/plan/collectives.py lists the sites).
    "MistralForCausalLM": "llama",  # vLLM's mistral.py subclasses llama.py: same layers and collectives
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3NextForCausalLM": "qwen3_5",  # hybrid: Gated DeltaNet linear attention + gated full attention
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "GptOssForCausalLM": "gpt_oss",
}

# Per-layer attention kinds: "full" (KV grows with the context), "sliding" (KV read up to the window),
# "linear" (a fixed recurrent state, Gated DeltaNet).
LAYER_KINDS = ("full", "sliding", "linear")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # where the config came from (path or preset + its source)
    architecture: str
    family: str  # vLLM model file the derivation follows (model_executor/models/<family>.py)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP
    vocab_size: int
    dtype: str = "bfloat16"
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False
    attention: str = "gqa"  # "mla" or "gqa"
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    moe_layers: tuple[int, ...] = ()
    quant: QuantScheme = field(default_factory=QuantScheme)
    rms_norm_eps: float | None = None  # config.json's; None when it does not say
    # Hybrid and windowed attention (empty layer_kinds: every layer "full").
    layer_kinds: tuple[str, ...] = ()
    sliding_window: int = 0
    full_head_dim: int = 0  # Gemma 4 global layers (0: head_dim)
    full_num_kv_heads: int = 0  # Gemma 4 global layers (0: num_kv_heads)
    attn_output_gate: bool = False  # Qwen3-Next / Qwen3.5: q_proj also emits the output gate
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    shared_expert_intermediate_size: int = 0  # one gated shared expert (Qwen2-MoE, Qwen3-Next, Qwen3.5)
    kv_shared_layers: int = 0  # Gemma 4: the last N layers reuse an earlier layer's K/V (no K/V weights/cache)

    def kind(self, layer: int) -> str:
        return self.layer_kinds[layer] if self.layer_kinds else "full"

    def layers_of(self, kind: str) -> int:
        return sum(1 for i in range(self.num_layers) if self.kind(i) == kind)

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def dense_layers(self) -> tuple[int, ...]:
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.num_layers) if i not in moe)

    def summary(self) -> dict:
        d = asdict(self)
        d["quant"] = {
            "method": self.quant.method,
            "description": self.quant.description,
            "weight_bits": self.quant.weight_bits,
            "activations": self.quant.activations,
        }
        d["moe_layers"] = len(self.moe_layers)
        d["dense_layers"] = len(self.dense_layers)
        return d
