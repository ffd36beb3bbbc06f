"""Model configs: a config.json path, a folder holding one, or a built-in preset.

`load_model(arg)` returns a `ModelSpec`. Presets are config files in
`presets/`, each naming its source in `_tpcomm_source`.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.models.quant import dtype_bits, parse_quantization
from tpcomm.models.spec import FAMILIES, ModelSpec

__all__ = ["load_model", "load_config", "preset_names", "ModelSpec", "FAMILIES"]


def preset_names() -> list[str]:
    return sorted(
        p.name[:-5] for p in resources.files("tpcomm.models").joinpath("presets").iterdir() if p.name.endswith(".json")
    )


def load_config(arg: str | Path | dict) -> tuple[dict, str, str]:
    """(config dict, display name, source) for a path, folder, preset name or dict."""
    if isinstance(arg, dict):
        return arg, str(arg.get("_name_or_path") or arg.get("model_type") or "config"), "dict"
    s = str(arg)
    if s in preset_names():
        text = resources.files("tpcomm.models").joinpath("presets", s + ".json").read_text()
        cfg = json.loads(text)
        return cfg, s, f"preset {s}: {cfg.get('_tpcomm_source', 'no source recorded')}"
    p = Path(s).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise InputError(f"--model {s}", "folder has no config.json", "a model snapshot folder holding config.json")
        p = p / "config.json"
    if not p.exists():
        raise InputError(
            f"--model {s}",
            "is neither a file, a folder, nor a preset",
            "a config.json path, a folder holding one, or one of the presets: " + ", ".join(preset_names()),
        )
    try:
        cfg = json.loads(p.read_text())
    except UnicodeDecodeError:
        raise InputError(str(p), "is not a text file", "a JSON config.json") from None
    except OSError as e:
        raise InputError(str(p), f"cannot be read ({e.strerror})", "a readable config.json") from None
    except json.JSONDecodeError as e:
        raise InputError(
            str(p), f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", "a JSON config.json"
        ) from None
    if not isinstance(cfg, dict):
        raise InputError(str(p), "holds JSON but not an object", "a config.json object")
    name = p.parent.name if p.name == "config.json" else p.stem
    return cfg, name, str(p)


def _need(cfg: dict, where: str, *keys: str) -> None:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise InputError(
            where, "missing config fields: " + ", ".join(missing), "the fields vLLM reads for this architecture"
        )


def load_model(arg: str | Path | dict) -> ModelSpec:
    cfg, name, source = load_config(arg)
    where = f"model config {source.split(':')[0]}"
    try:
        return _spec(cfg, name, source, where)
    except (TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(
            where, f"a shape field has a value that is not a whole number ({e})", "integers for sizes and counts"
        ) from None


# Other spellings of the fields read below, per family: the `attribute_map`s of the installed transformers'
# config classes (5.x: DeepseekV2Config num_experts, DeepseekV3Config/Glm4MoeConfig num_local_experts ->
# n_routed_experts; Qwen3MoeConfig/MixtralConfig num_experts <-> num_local_experts) and what vLLM 0.32 reads.
# A config saved by one transformers version uses one name, another version the other: both must plan.
ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "deepseek_v2": {"n_routed_experts": ("num_local_experts", "num_experts")},
    "glm4_moe": {"n_routed_experts": ("num_local_experts", "num_experts")},
    "qwen3_moe": {"num_experts": ("num_local_experts",)},
    "mixtral": {"num_local_experts": ("num_experts",)},
}


def _canonical(inner: dict, family: str) -> dict:
    out = dict(inner)
    for field, others in ALIASES.get(family, {}).items():
        if out.get(field) is None:
            out[field] = next((inner[o] for o in others if inner.get(o) is not None), None)
    return out


def _eps(v, where: str) -> float | None:
    if v is None:
        return None
    try:
        eps = float(v)
    except (TypeError, ValueError):
        eps = None
    if eps is None or not eps > 0:
        raise InputError(where, f"rms_norm_eps is {v!r}", "a small positive number such as 1e-06")
    return eps


def _spec(cfg: dict, name: str, source: str, where: str) -> ModelSpec:
    top_arch = (cfg.get("architectures") or [None])[0]
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    inner = text or cfg
    arch = top_arch or (inner.get("architectures") or [None])[0]
    if arch not in FAMILIES:
        raise InputError(where, f"unsupported architecture {arch!r}", "one of " + ", ".join(sorted(FAMILIES)))
    family = FAMILIES[arch]
    inner = _canonical(inner, family)
    # Quantization sits at the top level for multimodal wrappers (Kimi K2.5), in the text config otherwise.
    qc = cfg.get("quantization_config") or inner.get("quantization_config")
    dtype = str(inner.get("torch_dtype") or inner.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    dbytes = dtype_bits(dtype) // 8
    _need(inner, where, "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    H, L, nh = int(inner["hidden_size"]), int(inner["num_hidden_layers"]), int(inner["num_attention_heads"])
    for k, v in (
        ("hidden_size", H),
        ("num_hidden_layers", L),
        ("num_attention_heads", nh),
        ("vocab_size", inner["vocab_size"]),
    ):
        if int(v) <= 0:
            raise InputError(where, f"{k} is {v}", "a positive integer")
    common = dict(
        name=name,
        source=source,
        architecture=arch,
        family=family,
        hidden_size=H,
        num_layers=L,
        num_heads=nh,
        vocab_size=int(inner["vocab_size"]),
        dtype=dtype,
        dtype_bytes=dbytes,
        tie_word_embeddings=bool(inner.get("tie_word_embeddings", False)),
        quant=parse_quantization(qc, dtype_bits(dtype), where),
        rms_norm_eps=_eps(inner.get("rms_norm_eps"), where),
    )
    if family in ("deepseek_v2", "glm4_moe"):
        _need(inner, where, "intermediate_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok")
        first_dense = int(inner.get("first_k_dense_replace", 0))
        freq = int(inner.get("moe_layer_freq", 1))
        moe = tuple(i for i in range(L) if i >= first_dense and i % freq == 0)
        moe_kw = dict(
            n_routed_experts=int(inner["n_routed_experts"]),
            num_experts_per_tok=int(inner["num_experts_per_tok"]),
            moe_intermediate_size=int(inner["moe_intermediate_size"]),
            n_shared_experts=int(inner.get("n_shared_experts") or 0),
            moe_layers=moe,
            intermediate_size=int(inner["intermediate_size"]),
        )
        if family == "deepseek_v2":
            _need(inner, where, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            return ModelSpec(
                **common,
                **moe_kw,
                attention="mla",
                num_kv_heads=nh,
                head_dim=int(inner["qk_nope_head_dim"]) + int(inner["qk_rope_head_dim"]),
                q_lora_rank=inner.get("q_lora_rank"),
                kv_lora_rank=int(inner["kv_lora_rank"]),
                qk_nope_head_dim=int(inner["qk_nope_head_dim"]),
                qk_rope_head_dim=int(inner["qk_rope_head_dim"]),
                v_head_dim=int(inner["v_head_dim"]),
            )
        return ModelSpec(
            **common,
            **moe_kw,
            num_kv_heads=int(inner.get("num_key_value_heads") or nh),
            head_dim=int(inner.get("head_dim") or H // nh),
        )
    # GQA families
    nkv = int(inner.get("num_key_value_heads") or nh)
    hd = int(inner.get("head_dim") or H // nh)
    if family == "qwen3_moe":
        _need(inner, where, "moe_intermediate_size", "num_experts", "num_experts_per_tok")
        step = int(inner.get("decoder_sparse_step", 1)) or 1
        mlp_only = set(inner.get("mlp_only_layers") or [])
        moe = tuple(i for i in range(L) if i not in mlp_only and int(inner["num_experts"]) > 0 and (i + 1) % step == 0)
        return ModelSpec(
            **common,
            num_kv_heads=nkv,
            head_dim=hd,
            intermediate_size=int(inner.get("intermediate_size") or 0),
            n_routed_experts=int(inner["num_experts"]),
            num_experts_per_tok=int(inner["num_experts_per_tok"]),
            moe_intermediate_size=int(inner["moe_intermediate_size"]),
            moe_layers=moe,
        )
    if family == "mixtral":
        _need(inner, where, "intermediate_size", "num_local_experts", "num_experts_per_tok")
        return ModelSpec(
            **common,
            num_kv_heads=nkv,
            head_dim=hd,
            intermediate_size=0,
            n_routed_experts=int(inner["num_local_experts"]),
            num_experts_per_tok=int(inner["num_experts_per_tok"]),
            moe_intermediate_size=int(inner["intermediate_size"]),
            moe_layers=tuple(range(L)),
        )
    _need(inner, where, "intermediate_size")
    return ModelSpec(**common, num_kv_heads=nkv, head_dim=hd, intermediate_size=int(inner["intermediate_size"]))
