"""Inputs users have (issue 19): Qwen3.5/3.6 hybrid linear attention, Gemma 3/4 sliding window, GPT-OSS, Mistral,
AWQ/GPTQ/MXFP4 checkpoints, model ids from the local Hugging Face cache, every problem of a config at once."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.errors import InputError
from tpcomm.models import load_config, load_model
from tpcomm.plan import build_plan
from tpcomm.plan.layout import Layout
from tpcomm.plan.weights import kv_read_bytes, weight_components


def _per_step(plan):
    return {(c.op, c.site): c.count for c in plan.for_batch(1)}


def test_qwen35_hybrid_collectives_weights_and_state():
    m = load_model("qwen3.5-397b-a17b")
    assert m.family == "qwen3_5" and m.layers_of("linear") == 45 and m.layers_of("full") == 15
    assert m.kind(3) == "full" and m.kind(0) == "linear"  # 3 Gated DeltaNet layers, then 1 gated attention layer
    p = build_plan(m, tp=4)
    # qwen3_5.py: every layer all-reduces its attention output (out_proj or o_proj) and its MoE block once.
    assert _per_step(p) == {
        ("all_reduce", "model.embed_tokens"): 1,
        ("all_reduce", "model.layers.*.self_attn.o_proj"): 60,
        ("all_reduce", "model.layers.*.mlp.experts"): 60,
        ("all_gather", "logits_processor (lm_head vocab shards)"): 1,
    }
    names = {c.component for c in weight_components(m, Layout(tp=4))}
    assert {
        "linear attention in_proj (sharded)",
        "linear attention out_proj (sharded)",
        "shared experts (sharded)",
    } <= names
    # Linear layers keep a fixed recurrent state: only the 15 full layers' reads grow with the context.
    lay = Layout(tp=4)
    grow = kv_read_bytes(m, lay, 2048) - kv_read_bytes(m, lay, 1024)
    assert grow == pytest.approx(1024 * 15 * 2 * 1 * 256 * 2)  # 2 KV heads over TP 4 -> 1 per rank, head 256, bf16
    state = kv_read_bytes(m, lay, 0)
    assert state == pytest.approx(45 * 2 * (64 // 4) * 128 * 128 * 2)  # read + write, bf16 (the KV-cache dtype)
    with pytest.raises(InputError, match="linear_num_key_heads"):
        build_plan(m, tp=32)


def test_gemma3_sliding_window_caps_the_kv_read():
    m = load_model("gemma-3-27b")
    assert m.family == "gemma3" and m.layers_of("sliding") == 52 and m.layers_of("full") == 10
    lay = Layout(tp=2)
    at_window = kv_read_bytes(m, lay, 1024)
    per_token_full = 10 * 2 * 8 * 128 * 2
    assert kv_read_bytes(m, lay, 8192) - at_window == pytest.approx((8192 - 1024) * per_token_full)
    assert build_plan(m, tp=2).to_dict()["model"]["sliding_window"] == 1024
    out = CliRunner().invoke(cli, ["plan", "--model", "gemma-3-27b", "--tp", "2"]).output
    assert "52 sliding" in out and "window 1024" in out


def test_gemma4_global_layers_and_kv_sharing_and_the_moe_block_refused():
    cfg = {
        "architectures": ["Gemma4ForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "global_head_dim": 256,
        "num_global_key_value_heads": 2,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 2,
        "sliding_window": 512,
        "vocab_size": 4096,
    }
    m = load_model(cfg)
    assert m.kind(5) == "full" and m.full_head_dim == 256 and m.full_num_kv_heads == 2 and m.kv_shared_layers == 2
    assert build_plan(m, tp=2).for_batch(1)
    with pytest.raises(InputError, match="num_experts is set: the Gemma 4 MoE block"):
        load_model({**cfg, "num_experts": 8, "top_k_experts": 2})


def test_gpt_oss_mxfp4_experts_only_and_alternating_window():
    m = load_model("gpt-oss-120b")
    assert m.quant.method == "mxfp4" and m.quant.weight_bits == 4.25
    bits = {c.component: c.bits_per_weight for c in weight_components(m, Layout(tp=2))}
    assert bits["routed experts"] == 4.25 and bits["attention qkv (sharded)"] == 16 and bits["lm_head (sharded)"] == 16
    assert m.kind(0) == "sliding" and m.kind(1) == "full" and m.sliding_window == 128
    assert _per_step(build_plan(m, tp=2))[("all_reduce", "model.layers.*.mlp.experts")] == 36


def test_mistral_plans_as_llama():
    m = load_model("mistral-small-24b")
    assert m.family == "llama"
    assert _per_step(build_plan(m, tp=4))[("all_reduce", "model.layers.*.mlp.down_proj")] == 40


@pytest.mark.parametrize(
    "qc,bits,method",
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 4 + 20 / 128, "awq"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, 4 + 20 / 128, "gptq"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, 8 + 24 / 128, "gptq"),
    ],
)
def test_awq_and_gptq_bits_per_weight(qc, bits, method):
    cfg, _, _ = load_config("qwen2.5-72b")
    m = load_model({**cfg, "quantization_config": qc})
    assert m.quant.method == method and m.quant.weight_bits == pytest.approx(bits)
    b = {c.component: c.bits_per_weight for c in weight_components(m, Layout(tp=2))}
    assert b["dense MLP (sharded)"] == pytest.approx(bits) and b["lm_head (sharded)"] == 16


def test_model_id_from_the_local_hugging_face_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "models--some-org--Tiny-Llama"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    cfg, _, _ = load_config("mistral-small-24b")
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    m = load_model("some-org/Tiny-Llama")
    assert m.name == "Tiny-Llama" and "Hugging Face cache" in m.source and m.num_layers == 40
    r = CliRunner().invoke(cli, ["plan", "--model", "some-org/Missing", "--tp", "2"])
    assert r.exit_code == 2 and "not in the local Hugging Face cache" in r.output and str(cache) in r.output


def test_every_problem_of_a_config_at_once(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(
        json.dumps(
            {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": "abc", "num_hidden_layers": 0, "vocab_size": 64}
        )
    )
    r = CliRunner().invoke(cli, ["plan", "--model", str(p)])
    assert r.exit_code == 2
    for needle in (
        "missing config fields: num_attention_heads",
        "num_experts",
        "hidden_size is 'abc'",
        "num_hidden_layers is 0",
    ):
        assert needle in r.output, (needle, r.output)
