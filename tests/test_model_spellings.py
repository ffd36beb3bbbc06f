"""Model configs as they are written today: every spelling of a field that the installed transformers (and
vLLM 0.32) accept plans the same (issue 12, item 9). Configs are saved by transformers' own config classes."""

from __future__ import annotations

import json

import pytest

from tpcomm.models import load_model
from tpcomm.plan import build_plan

SMALL = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=1024,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_experts_per_tok=2,
)

# (transformers config class, architecture, expert-count spellings that must all plan, kwargs for the class)
CASES = [
    ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", ("num_experts", "num_local_experts"), dict(head_dim=64)),
    ("MixtralConfig", "MixtralForCausalLM", ("num_local_experts", "num_experts"), {}),
    (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        ("n_routed_experts", "num_local_experts"),
        dict(
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=64,
            v_head_dim=64,
            q_lora_rank=None,
            first_k_dense_replace=1,
            n_shared_experts=1,
        ),
    ),
    (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        ("n_routed_experts", "num_experts"),
        dict(
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=64,
            v_head_dim=64,
            q_lora_rank=None,
            first_k_dense_replace=1,
            n_shared_experts=1,
        ),
    ),
    (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        ("n_routed_experts", "num_local_experts"),
        dict(first_k_dense_replace=1, n_shared_experts=1, head_dim=64),
    ),
]


def _saved_by_transformers(cls_name: str, arch: str, extra: dict, tmp_path) -> dict:
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, cls_name)
    # The class's own name for the count (whichever spelling this transformers version writes).
    count_key = (
        next(iter(k for k, v in cls.attribute_map.items() if "expert" in k), None) if cls.attribute_map else None
    )
    kw = dict(SMALL, **extra)
    cfg = cls(**kw, **({count_key: 8} if count_key else {}))
    cfg.architectures = [arch]
    cfg.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("cls_name,arch,spellings,extra", CASES, ids=[c[0] for c in CASES])
def test_config_saved_by_installed_transformers_plans(cls_name, arch, spellings, extra, tmp_path):
    saved = _saved_by_transformers(cls_name, arch, extra, tmp_path)
    written = [k for k in spellings if k in saved]
    assert written, f"{cls_name} wrote none of {spellings}: {sorted(saved)}"
    spec = load_model(tmp_path)
    assert spec.n_routed_experts == 8 and spec.architecture == arch
    plan = build_plan(tmp_path, tp=2)
    assert any(c.op == "all_reduce" for c in plan.collectives)


@pytest.mark.parametrize("cls_name,arch,spellings,extra", CASES, ids=[c[0] for c in CASES])
def test_every_spelling_of_the_expert_count_gives_the_same_model(cls_name, arch, spellings, extra, tmp_path):
    saved = _saved_by_transformers(cls_name, arch, extra, tmp_path)
    for k in spellings:
        saved.pop(k, None)
    specs = []
    for k in spellings:
        cfg = dict(saved, **{k: 8})
        specs.append(load_model(cfg))
    assert {s.n_routed_experts for s in specs} == {8}
    assert len({(s.moe_layers, s.moe_intermediate_size) for s in specs}) == 1


def test_missing_expert_count_names_the_field():
    from tpcomm.errors import InputError

    cfg = {"architectures": ["Qwen3MoeForCausalLM"], **SMALL}
    with pytest.raises(InputError, match="missing config fields: num_experts"):
        load_model(cfg)


def test_a_malformed_rms_norm_eps_names_the_field():
    from tpcomm.errors import InputError

    cfg = {"architectures": ["LlamaForCausalLM"], **SMALL, "intermediate_size": 64}
    assert load_model({**cfg, "rms_norm_eps": 1e-05}).rms_norm_eps == 1e-5
    assert load_model(cfg).rms_norm_eps is None  # not said: the fusion does not judge it
    for bad in ("tiny", 0, -1e-6):
        with pytest.raises(InputError, match="rms_norm_eps is"):
            load_model({**cfg, "rms_norm_eps": bad})
