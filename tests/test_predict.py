"""`tpcomm predict`: the analytic model, validated against the case study (Kimi-K2.5 on 8x RTX PRO 6000: README, reports/kimi-k2.5-*)."""

import json

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.predict import Layout, predict
from tpcomm.predict.latency import nccl_model_us

# REFERENCE s1: 8x RTX PRO 6000 Blackwell, PCIe Gen5, no NVLink, vLLM TP 8.
INT4_C1 = 82.0
NVFP4_C1 = 61.3
NVFP4_LADDER = {32: 464, 48: 657, 64: 803, 96: 1017, 128: 1238}
# The NVFP4 MoE-kernel extra terms are fitted to the C=1 and C=32 points (README, reports/regenerate.sh).
NVFP4_FIT = {1: NVFP4_C1, 32: NVFP4_LADDER[32]}


def test_kimi_int4_tp8_rtx_pro_6000_range_holds_82():
    d = predict("kimi-k2.5", Layout(tp=8), gpu="rtx-pro-6000")
    r = d["range"]["single_stream"]["tok_per_s"]
    assert r["low"] <= INT4_C1 <= r["high"], r  # the seed case (tpcomm's validation table marks it not held out)
    bd = d["single_stream"]["breakdown_ms"]
    assert sum(bd.values()) == pytest.approx(d["single_stream"]["ms_per_token"])
    assert d["single_stream"]["collectives_per_token"] == 124


def test_nvfp4_ladder_with_fitted_moe_terms_within_30pct():
    d = predict("kimi-k2.5-nvfp4", Layout(tp=8), gpu="rtx-pro-6000", batches=list(NVFP4_LADDER), fitted_to=NVFP4_FIT)
    got = {b["batch"]: b["tok_per_s"] for b in d["batches"]}
    for c, measured in NVFP4_LADDER.items():
        assert got[c] == pytest.approx(measured, rel=0.30), (c, got[c], measured)
    # Fitted, reproduced, labelled as fitted.
    assert got[1] == pytest.approx(NVFP4_C1, rel=0.02) and got[32] == pytest.approx(NVFP4_LADDER[32], rel=0.02)
    assert d["fitted"] and all("fitted to measured" in f["text"] for f in d["fitted"])


def test_nvfp4_vs_int4_conclusion_names_the_kernels():
    r = CliRunner().invoke(
        cli,
        [
            "predict",
            "--model",
            "kimi-k2.5",
            "--tp",
            "8",
            "--gpu",
            "rtx-pro-6000",
            "--compare-model",
            "kimi-k2.5-nvfp4",
            "--measured",
            "82,61.3",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    cmp = json.loads(r.output)["compare"]
    assert cmp["same_collectives"] and cmp["same_weight_bytes"]
    # Same bytes, same collectives: only the MoE kernel backend term tells them apart (W4A16 Marlin vs W4A4 NVFP4).
    assert cmp["moe_kernel_backend"] == ["default", "nvfp4-sm12"]
    assert cmp["predicted_tok_per_s"][0] > cmp["predicted_tok_per_s"][1]
    assert "cannot come from the interconnect" in cmp["conclusion"] and "nvfp4-sm12" in cmp["conclusion"]
    assert cmp["measured_gap_ms_per_token"] == pytest.approx(1e3 / 61.3 - 1e3 / 82)


def test_json_keys_and_ceilings():
    r = CliRunner().invoke(
        cli, ["predict", "--model", "deepseek-v3", "--tp", "8", "--gpu", "h200", "--batch", "1,16", "--json"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ss, ce = d["single_stream"], d["ceilings"]
    assert set(ss["breakdown_ms"]) >= {"weights", "collectives", "overhead"}
    assert ce["comm_only_tok_per_s"] == pytest.approx(1e3 / ss["breakdown_ms"]["collectives"])
    assert ce["compute_only_tok_per_s"] == pytest.approx(1e3 / (ss["ms_per_token"] - ss["breakdown_ms"]["collectives"]))
    assert [b["batch"] for b in d["batches"]] == [1, 16] and d["batches"][1]["tok_per_s"] > ss["tok_per_s"]
    names = {w["name"] for w in d["what_if"]}
    assert "tp4" in names and "nvlink" not in names  # H200 is already NVLink
    assert "one-shot-allreduce" not in names  # vLLM already runs its one-shot custom all-reduce over NVLink
    assert any("assumption" in a for a in d["assumptions"])


def test_what_ifs_move_the_right_way():
    d = predict("kimi-k2.5", Layout(tp=8), gpu="rtx-pro-6000")
    w = {x["name"]: x for x in d["what_if"]}
    base = d["single_stream"]["tok_per_s"]
    assert w["one-shot-allreduce"]["tok_per_s"] > base
    assert w["nvlink"]["tok_per_s"] > base
    assert w["p2p-disabled"]["tok_per_s"] < base
    assert w["no-interconnect-cost"]["tok_per_s"] == pytest.approx(d["ceilings"]["compute_only_tok_per_s"])
    assert w["tp4"]["fits_memory"] is False


def test_json_carries_the_ranges():
    r = CliRunner().invoke(cli, ["predict", "--model", "kimi-k2.5", "--tp", "8", "--gpu", "rtx-pro-6000", "--json"])
    d = json.loads(r.output)
    rg = d["range"]
    axes = [k for k, v in rg["inputs"].items() if k != "collective_latency" and v["low"] != v["high"]]
    assert set(rg) >= {"inputs", "single_stream", "corners", "verdict", "bounds"}
    assert len(rg["corners"]) == 2 ** (len(axes) + 1)  # every varying input, collective latency included
    ss = rg["single_stream"]
    for term, sp in ss["breakdown_ms"].items():
        assert sp["low"] <= d["single_stream"]["breakdown_ms"][term] <= sp["high"]
        assert 0 <= ss["share"][term]["low"] <= ss["share"][term]["high"] <= 1
    assert all(w.get("tok_per_s_range") for w in d["what_if"] if w["tok_per_s"] is not None)


def test_allreduce_us_override_is_used():
    d = predict("kimi-k2.5", Layout(tp=8), gpu="rtx-pro-6000", allreduce_us=25.0, what_if=False)
    ar = sum(c["time_us"] for c in d["single_stream"]["top_collectives"] if c["op"] == "all_reduce")
    assert ar == pytest.approx(123 * 25.0)
    assert d["collective_latency_kind"] == "user"


def test_nccl_model_matches_reference_formula():
    # Ring LL, 8 PCIe ranks: 6.6 + 14 * 1.0 us + bytes / (1000 * algbw)
    link = {"type": "pcie", "p2p": True, "p2p_GBps": 53}
    t, how = nccl_model_us("all_reduce", 14336, 8, link)
    algbw = 53 * 0.5 * 8 / 14
    assert t == pytest.approx(min(6.6 + 14 * 1.0 + 14336 / (1000 * algbw), 6.8 + 14 * 1.0 + 14336 / (1000 * algbw)))
    assert "LL" in how
    big, how_big = nccl_model_us("all_reduce", 64 << 20, 8, link)
    assert "Simple" in how_big and big > 1000


def test_user_profile_file(tmp_path):
    prof = {
        "name": "My GPU",
        "memory_bandwidth_GBps": 1000,
        "memory_GB": 48,
        "bf16_tflops": 100,
        "link": {"type": "pcie", "p2p": True, "p2p_GBps": 20},
    }
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps(prof))
    r = CliRunner().invoke(cli, ["predict", "--model", "qwen3-32b", "--tp", "4", "--gpu", str(p), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["hardware"]["name"] == "My GPU"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpu", "tpu-v9"], "--gpu tpu-v9"),
        (["--gpu", "cpu"], "--probe RUN_DIR"),
        (["--allreduce-us", "-1"], "--allreduce-us -1"),
        (["--memory-efficiency", "1.5"], "--memory-efficiency 1.5"),
        (["--moe-bw-factor", "0.5"], "--moe-bw-factor 0.5"),
        (["--measured", "82,61"], "--measured needs --compare-model"),
        (["--compare-model", "kimi-k2.5-nvfp4", "--measured", "0,61"], "not a positive finite number"),
        (["--gpu", "a100"], "is ambiguous: it could be a100-pcie or a100-sxm"),
        (["--gpu", "h100"], "is ambiguous: it could be h100-pcie or h100-sxm"),
        (["--gpu", "4090"], "did you mean rtx-4090?"),
        (["--engine", "lmdeploy-2"], "--engine lmdeploy-2"),  # TGI is an engine since issue 29
    ],
)
def test_bad_predict_inputs(args, needle):
    gpu = [] if "--gpu" in args else ["--gpu", "rtx-pro-6000"]
    r = CliRunner().invoke(cli, ["predict", "--model", "kimi-k2.5", "--tp", "8", *gpu, *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output


def test_missing_gpu_is_refused_with_the_choices():
    r = CliRunner().invoke(cli, ["predict", "--model", "kimi-k2.5", "--tp", "8"])
    assert r.exit_code == 2 and "--gpu: is required" in r.output and "rtx-pro-6000-server" in r.output


def test_bad_profile_file(tmp_path):
    p = tmp_path / "gpu.json"
    p.write_text('{"name": "x", "memory_GB": 1}')
    r = CliRunner().invoke(cli, ["predict", "--model", "kimi-k2.5", "--tp", "8", "--gpu", str(p)])
    assert r.exit_code == 2 and "missing fields: memory_bandwidth_GBps" in r.output


@pytest.mark.dist
def test_predict_calibrated_by_a_real_probe_run(tmp_path):
    """A real 2-rank shm/gloo probe at the tiny model's sizes feeds predict --probe."""
    from tpcomm.plan import build_plan
    from tpcomm.probe.fit import load_latency_model
    from tpcomm.tinymodel import TINY_CONFIG

    cfg = tmp_path / "model" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY_CONFIG))
    run = tmp_path / "run"
    r = CliRunner().invoke(
        cli, ["probe", "--gpus", "2", "--model", str(cfg.parent), "--iters", "30", "--warmup", "5", "--out", str(run)]
    )
    assert r.exit_code == 0, r.output
    d = predict(str(cfg.parent), Layout(tp=2), gpu="cpu", probe=str(run))
    assert d["collective_latency_kind"] == "probe"
    fit = load_latency_model(run)
    plan = build_plan(str(cfg.parent), tp=2)
    expect = sum(c.count * fit.latency_us(c.op, c.bytes) for c in plan.collectives)
    assert d["single_stream"]["breakdown_ms"]["collectives"] == pytest.approx(expect / 1e3)
    # A layout the probe did not measure is refused, not extrapolated.
    with pytest.raises(Exception, match="world size 2"):
        predict("kimi-k2.5", Layout(tp=8), gpu="cpu", probe=str(run))
    # A CPU probe does not calibrate a GPU profile.
    with pytest.raises(Exception, match="does not match the pcie link"):
        predict(str(cfg.parent), Layout(tp=2), gpu="rtx-pro-6000", probe=str(run))
