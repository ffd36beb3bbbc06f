"""The parallel layout and the divisibility rules vLLM enforces for it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpcomm.errors import InputError
from tpcomm.models.spec import ModelSpec

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py)


def padded_vocab(vocab: int) -> int:
    return (vocab + VOCAB_PADDING - 1) // VOCAB_PADDING * VOCAB_PADDING


@dataclass(frozen=True)
class Layout:
    """tp: tensor parallel; ep: expert parallel on (EP size = dp*tp, vLLM's rule);
    dp: data parallel (attention); pp: pipeline stages; dcp: decode context parallel (within TP)."""

    tp: int = 1
    ep: bool = False
    dp: int = 1
    pp: int = 1
    dcp: int = 1

    @property
    def ep_size(self) -> int:
        return self.dp * self.tp if self.ep else 1

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    def to_dict(self) -> dict:
        return {**asdict(self), "ep_size": self.ep_size, "world_size": self.world_size}

    def validate(self, m: ModelSpec) -> None:
        for k in ("tp", "dp", "pp", "dcp"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise InputError(f"--{k} {v}", "is not a positive integer", "an integer >= 1")
        if m.num_heads % self.tp:
            raise InputError(
                f"--tp {self.tp}",
                f"does not divide the {m.num_heads} attention heads of {m.name}",
                "a TP size that divides num_attention_heads",
            )
        if m.attention == "gqa":
            kv = m.num_kv_heads
            if (self.tp >= kv and self.tp % kv) or (self.tp < kv and kv % self.tp):
                raise InputError(
                    f"--tp {self.tp}",
                    f"and the {kv} KV heads of {m.name} do not divide one another",
                    "TP dividing num_key_value_heads, or a multiple of it",
                )
        if m.layers_of("linear"):
            for field, v in (
                ("linear_num_value_heads", m.linear_num_value_heads),
                ("linear_num_key_heads", m.linear_num_key_heads),
            ):
                if v % self.tp:
                    raise InputError(
                        f"--tp {self.tp}",
                        f"does not divide the {v} {field} of {m.name}'s linear-attention layers",
                        "a TP size dividing the Gated DeltaNet head counts (vLLM divides them over TP)",
                    )
        pv = padded_vocab(m.vocab_size)
        if pv % self.tp:
            raise InputError(
                f"--tp {self.tp}",
                f"does not divide the vocabulary ({m.vocab_size}, padded to {pv})",
                "a TP size dividing the padded vocab size",
            )
        if m.is_moe:
            if self.ep:
                if m.n_routed_experts % self.ep_size:
                    raise InputError(
                        f"--ep with EP size {self.ep_size}",
                        f"does not divide the {m.n_routed_experts} routed experts of {m.name}",
                        "an EP size (dp*tp) dividing n_routed_experts",
                    )
            elif m.moe_intermediate_size % self.tp:
                raise InputError(
                    f"--tp {self.tp}",
                    f"does not divide the experts' intermediate size {m.moe_intermediate_size} of {m.name}",
                    "a TP size dividing moe_intermediate_size, or --ep",
                )
            if self.tp > m.n_routed_experts and m.family == "qwen3_moe":
                raise InputError(
                    f"--tp {self.tp}",
                    f"is greater than the {m.n_routed_experts} experts",
                    "tp <= num_experts (vLLM's check)",
                )
        if m.intermediate_size and m.dense_layers and m.intermediate_size % self.tp:
            raise InputError(
                f"--tp {self.tp}",
                f"does not divide the dense MLP intermediate size {m.intermediate_size}",
                "a TP size dividing intermediate_size",
            )
        if self.pp > m.num_layers:
            raise InputError(f"--pp {self.pp}", f"exceeds the {m.num_layers} layers", "pp <= num_hidden_layers")
        if self.dcp > 1:
            if m.attention != "mla":
                raise InputError(
                    f"--dcp {self.dcp}", f"is modelled for MLA models only; {m.name} uses GQA", "--dcp 1 for this model"
                )
            if self.tp % self.dcp:
                raise InputError(
                    f"--dcp {self.dcp}", f"does not divide --tp {self.tp}", "DCP is a subgroup of TP: dcp dividing tp"
                )
        if self.dp > 1 and m.is_moe and not self.ep:
            raise InputError(
                f"--dp {self.dp}",
                "without --ep is not modelled",
                "--ep with --dp > 1 (data-parallel attention + expert parallel MoE)",
            )


def pp_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per stage, as vLLM's get_pp_indices splits them (distributed/utils.py)."""
    per = num_layers // pp
    parts = [per] * pp
    rem = num_layers % pp
    for i in range(2, rem + 2):
        parts[-i] += 1
    return parts
