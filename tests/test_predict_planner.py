"""Answers a planner can trust (issue 19): the all-reduce table of the kernel the engine picks, the one-shot PCIe
what-if from a measured 4-rank figure, levers the hardware cannot use not offered, TP what-ifs on one kind of
latency source, a configuration that does not fit said first and given no verdict, imported nccl-tests labelled
and used only where the engine would use NCCL."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.predict import Layout, predict, tables
from tpcomm.predict.engine import resolve_engine
from tpcomm.predict.hardware import load_profile
from tpcomm.predict.latency import nccl_model_us
from tpcomm.predict.latency_range import make_range

VLLM = resolve_engine("vllm-0.32")


def test_custom_allreduce_where_vllm_picks_it_nccl_elsewhere():
    # 8x H100 SXM: vLLM's custom all-reduce in a CUDA graph, ~5.3 us at 14 KB, not nccl-tests' ~17 us.
    h8 = make_range(load_profile("h100-sxm"), n=8, engine=VLLM)
    assert h8.kernel == "custom-ar" and h8.kind == "table" and "custom all-reduce" in h8.descriptions["central"]
    assert h8.central("all_reduce", 14336, 8) == pytest.approx(5.1 + (5.3 - 5.1) * (14336 - 8192) / 8192)
    # 4x H100: no table of its own: the same kernel's reference tables, said so.
    h4 = make_range(load_profile("h100-sxm"), n=4, engine=VLLM)
    assert h4.kind == "reference" and "no custom all-reduce table" in h4.descriptions["central"]
    # PCIe: custom all-reduce at TP 2 (P2P), PyNccl's in-graph table at TP 4.
    p2 = make_range(load_profile("rtx-pro-6000"), n=2, engine=VLLM)
    p4 = make_range(load_profile("rtx-pro-6000"), n=4, engine=VLLM)
    assert (p2.kernel, p4.kernel) == ("custom-ar", "nccl") and "PyNccl" in p4.descriptions["central"]
    # GeForce without P2P: no custom all-reduce, NCCL through host memory (its model: no table).
    g2 = make_range(load_profile("rtx-4090"), n=2, engine=VLLM)
    assert g2.kernel == "nccl" and g2.kind == "nccl-model" and "P2P off" in g2.descriptions["central"]
    # transformers has no custom all-reduce at all.
    t8 = make_range(load_profile("h100-sxm"), n=8, engine=resolve_engine("transformers"))
    assert t8.kernel == "nccl"


def test_nccl_tests_tables_are_labelled_back_to_back_averages():
    t = tables.find("a100_sxm", 8)
    assert t["kind"] == "nccl-tests" and "back-to-back average" in tables.describe(t)
    a8 = make_range(load_profile("a100-sxm"), n=8, engine=resolve_engine("transformers"))
    assert "back-to-back average" in a8.descriptions["central"]


def test_one_shot_what_if_uses_the_measured_four_rank_figure():
    d = predict("llama-3.1-70b", Layout(tp=4), gpu="rtx-pro-6000")
    w = {x["name"]: x for x in d["what_if"]}["one-shot-allreduce"]
    assert "4x RTX PRO 6000 one-shot kernel, 6.1-9.2 us" in w["collective_latency"]["central"]
    # At 4 ranks the figure is the measurement itself, interpolated at the plan's 16 KB all-reduce.
    low, central, high = tables.oneshot_4rank_us(16384, 4)
    assert central == pytest.approx(6.1 + (9.2 - 6.1) * (16384 - 1024) / (32768 - 1024))
    assert low <= central <= high and w["lever"] is True and w["delta_pct"] > 0
    # At 8 ranks each rank reads 7 peers instead of 3: the part above the smallest size scales by 7/3.
    assert tables.oneshot_4rank_us(16384, 8)[1] == pytest.approx(6.1 + (central - 6.1) * 7 / 3)
    w8 = {x["name"]: x for x in predict("llama-3.1-70b", Layout(tp=8), gpu="rtx-pro-6000")["what_if"]}
    assert "8x RTX PRO 6000, 7.5-26 us" in w8["one-shot-allreduce"]["collective_latency"]["high"]
    # Not offered where it cannot run (no P2P) or where the engine already runs its own one-shot kernel.
    for gpu, tp in (("rtx-4090", 4), ("rtx-pro-6000", 2), ("h100-sxm", 8)):
        names = {x["name"] for x in predict("llama-3.1-70b", Layout(tp=tp), gpu=gpu)["what_if"]}
        assert "one-shot-allreduce" not in names, (gpu, tp)


def test_levers_the_hardware_cannot_use_are_marked():
    w = {x["name"]: x for x in predict("llama-3.1-70b", Layout(tp=8), gpu="rtx-pro-6000")["what_if"]}
    assert w["nvlink"]["lever"] is False and "has no NVLink" in w["nvlink"]["lever_note"]
    assert w["p2p-disabled"]["lever"] is False and w["no-interconnect-cost"]["lever"] is False
    bridged = {x["name"]: x for x in predict("qwen2.5-32b", Layout(tp=2), gpu="a100-pcie")["what_if"]}
    assert bridged["nvlink"]["lever"] is True  # an A100 PCIe pair takes an NVLink bridge


def test_tp_what_if_compares_one_kind_of_latency_source():
    d = predict("llama-3.1-70b", Layout(tp=8), gpu="h100-sxm")
    w = {x["name"]: x for x in d["what_if"]}
    # TP 8 has a measured H100 table, TP 4 none: both sides on the reference basis, the baseline it compares to given.
    assert w["tp4"]["latency_basis"] == "reference on both sides" and "on both sides" in w["tp4"]["description"]
    base = w["tp4"]["baseline_tok_per_s"]
    assert w["tp4"]["delta_pct"] == pytest.approx(100 * (w["tp4"]["tok_per_s"] / base - 1))
    # RTX PRO 6000: TP 4 and TP 8 both have measured tables: the same kind as it is.
    w2 = {x["name"]: x for x in predict("llama-3.1-70b", Layout(tp=8), gpu="rtx-pro-6000")["what_if"]}
    assert w2["tp4"]["latency_basis"] == "same kind" and "baseline_tok_per_s" not in w2["tp4"]


def test_configuration_that_does_not_fit_says_so_first_and_gets_no_verdict():
    r = CliRunner().invoke(cli, ["predict", "--model", "qwen2.5-72b", "--tp", "2", "--gpu", "rtx-4090"])
    assert r.exit_code == 3, r.output  # does not fit: its own exit code, no tok/s
    first = r.output.splitlines()[0]
    assert first.startswith("DOES NOT FIT: 73 GB of weights per GPU at TP 2 against 90% of 24 GB")
    assert "verdict (model-based): No verdict: the weights do not fit" in r.output
    d = predict("qwen2.5-72b", Layout(tp=2), gpu="rtx-4090", what_if=False)
    assert d["memory"]["fits_90pct"] is False and d["range"]["verdict"]["decided"] is False
    assert d["range"]["verdict"]["interconnect_is_bottleneck"] is None
    ok = CliRunner().invoke(cli, ["predict", "--model", "qwen2.5-72b", "--tp", "8", "--gpu", "rtx-4090"])
    assert not ok.output.startswith("DOES NOT FIT")


def test_every_problem_of_the_inputs_at_once():
    r = CliRunner().invoke(
        cli,
        [
            "predict",
            "--model",
            "no-such-model",
            "--tp",
            "8",
            "--gpu",
            "a100",
            "--memory-efficiency",
            "2",
            "--engine",
            "x",
        ],
    )
    assert r.exit_code == 2
    for needle in ("4 problems", "--memory-efficiency 2", "--gpu a100", "--model no-such-model", "--engine x"):
        assert needle in r.output, (needle, r.output)


def test_imported_nccl_tests_only_where_the_engine_uses_nccl(tmp_path):
    from test_probe_units import NCCL_TEXT

    f = tmp_path / "all_reduce_perf.txt"
    f.write_text(NCCL_TEXT)
    run = tmp_path / "run"
    assert CliRunner().invoke(cli, ["probe", "import", str(f), "--out", str(run)]).exit_code == 0
    # 4x H100 over NVLink: vLLM runs its custom all-reduce; the imported NCCL averages are not used for it.
    d = predict("llama-3.1-70b", Layout(tp=4), gpu="h100-sxm", probe=str(run), what_if=False)
    src = d["collective_latency_source"]
    assert "nccl-tests back-to-back average per call" in src and "the engine's in-graph figure instead" in src
    ar = [c for c in d["single_stream"]["top_collectives"] if c["op"] == "all_reduce"]
    ref = make_range(load_profile("h100-sxm"), n=4, engine=VLLM).central("all_reduce", ar[0]["bytes"], 4)
    assert ar[0]["latency_us"] == pytest.approx(ref)
    # transformers uses NCCL: the imported table stands (11-12 us around 16 KB).
    t = predict("llama-3.1-70b", Layout(tp=4), gpu="h100-sxm", probe=str(run), engine="transformers", what_if=False)
    art = [c for c in t["single_stream"]["top_collectives"] if c["op"] == "all_reduce"]
    assert 10 < art[0]["latency_us"] < 13 and art[0]["latency_us"] != pytest.approx(ref)
    # A TP what-if cannot use a probe measured at TP 4 elsewhere: no number, and why.
    w = {x["name"]: x for x in predict("llama-3.1-70b", Layout(tp=4), gpu="h100-sxm", probe=str(run))["what_if"]}
    assert w["tp8"]["tok_per_s"] is None and "no figure of the same kind" in w["tp8"]["description"]


def test_p2p_off_hop_is_solved_from_the_public_4090_figure():
    link = {"type": "pcie", "p2p": False, "p2p_GBps": 25}
    # 8x RTX 4090 (no P2P), nccl-tests 8 B: 42.1 us (REFERENCE s7) = ring LL 6.6 + 14 steps x 2.5 us.
    assert nccl_model_us("all_reduce", 8, 8, link)[0] == pytest.approx(6.6 + 14 * 2.5, abs=0.01)
    # The high end: 12 us per step, one host-staged copy (REFERENCE s3).
    r = make_range(load_profile("rtx-4090"), n=8, engine=VLLM)
    assert r.high("all_reduce", 8, 8) == pytest.approx(6.6 + 14 * 12.0, abs=0.01) and "staged" in r.descriptions["high"]


def test_json_what_if_keys():
    r = CliRunner().invoke(cli, ["predict", "--model", "kimi-k2.5", "--tp", "8", "--gpu", "rtx-pro-6000", "--json"])
    d = json.loads(r.output)
    assert d["engine"]["name"] and d["collective_latency_kernel"] == "nccl"
    assert all("lever" in w for w in d["what_if"])
