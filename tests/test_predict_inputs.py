"""predict's handling of its inputs and of layouts that do not fit (issue 29 item 4): Hugging Face ids of presets,
no tok/s and exit code 3 where the weights do not fit, a warning under 5% headroom, and one set of efficiency
ranges per GPU whether it comes from a built-in profile or a user's JSON."""

from __future__ import annotations

import json

import pytest

from tpcomm.cli import main
from tpcomm.errors import InputError
from tpcomm.models import load_config
from tpcomm.predict import EXIT_DOES_NOT_FIT, Layout, memory_statement, predict
from tpcomm.predict.hardware import load_profile


def test_hugging_face_id_of_a_preset_is_the_preset(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: the id is not downloaded here
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg, name, source = load_config("openai/gpt-oss-120b")
    assert name == "gpt-oss-120b" and cfg == load_config("gpt-oss-120b")[0]
    assert "openai/gpt-oss-120b" in source and "preset" in source
    a = predict("openai/gpt-oss-120b", Layout(tp=2), gpu="a100-sxm", what_if=False)
    b = predict("gpt-oss-120b", Layout(tp=2), gpu="a100-sxm", what_if=False)
    assert a["single_stream"]["tok_per_s"] == b["single_stream"]["tok_per_s"]
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        load_config("someone/not-a-preset-32B")


def test_does_not_fit_gives_no_tok_per_s_and_exit_code_3(capsys):
    doc = predict("kimi-k2.5", Layout(tp=4), gpu="rtx-pro-6000")
    assert doc["memory"]["fits_90pct"] is False
    assert doc["single_stream"]["tok_per_s"] is None and doc["range"]["single_stream"]["tok_per_s"] is None
    assert all(b["tok_per_s"] is None and b["tok_per_s_range"] is None for b in doc["batches"])
    assert doc["ceilings"]["compute_only_tok_per_s"] is None
    assert all(c["tok_per_s"] is None for c in doc["range"]["corners"])
    assert doc["single_stream"]["ms_per_token"] > 0  # the terms stay, labelled "if it did"
    tp8 = next(w for w in doc["what_if"] if w["name"] == "tp8")  # a what-if that fits keeps its tok/s
    assert tp8["fits_memory"] and tp8["tok_per_s"] > 0 and tp8["delta_pct"] is None
    with pytest.raises(SystemExit) as e:
        main(["predict", "--model", "kimi-k2.5", "--tp", "4", "--gpu", "rtx-pro-6000", "--json"])
    assert e.value.code == EXIT_DOES_NOT_FIT == 3
    out = json.loads(capsys.readouterr().out)
    assert out["single_stream"]["tok_per_s"] is None
    with pytest.raises(SystemExit) as e:
        main(["predict", "--model", "kimi-k2.5", "--tp", "4", "--gpu", "rtx-pro-6000"])
    text = capsys.readouterr().out
    assert text.startswith("DOES NOT FIT") and "no tok/s" in text and e.value.code == 3
    # a layout that fits exits 0
    rc = main(["predict", "--model", "kimi-k2.5", "--tp", "8", "--gpu", "rtx-pro-6000", "--json"])
    assert rc in (None, 0)
    capsys.readouterr()


def test_under_5pct_headroom_is_warned_with_the_figure():
    m = memory_statement(85.1e9, 96, 8, True)  # 85.1 of the 86.4 GB budget (90% of an H20's 96 GB)
    assert m["headroom_pct"] == pytest.approx(100 * (86.4 - 85.1) / 86.4)
    assert m["warning"].startswith("WARNING") and "1.5% headroom" in m["warning"] and "86.4 GB" in m["warning"]
    assert "warning" not in memory_statement(80e9, 96, 8, True)  # 7.4% headroom: no warning
    assert "warning" not in memory_statement(90e9, 96, 8, False)  # does not fit: its own statement


def test_one_set_of_ranges_per_gpu_builtin_or_user_json(tmp_path):
    builtin = load_profile("h20")
    user = {k: builtin[k] for k in ("name", "memory_GB", "memory_bandwidth_GBps", "bf16_tflops", "link")}
    f = tmp_path / "my-gpu.json"
    f.write_text(json.dumps(user))
    prof = load_profile(str(f))
    for key in ("memory_efficiency", "ramp_us"):
        assert prof[f"{key}_range"] == builtin[f"{key}_range"] and prof[key] == builtin[key]
        assert "built-in profile h20" in prof["sources"][key]
    a = predict("qwen3-32b", Layout(tp=2), gpu="h20", what_if=False)["range"]["inputs"]
    b = predict("qwen3-32b", Layout(tp=2), gpu=str(f), what_if=False)["range"]["inputs"]
    for key in ("memory_efficiency", "ramp_us"):
        assert (a[key]["low"], a[key]["central"], a[key]["high"]) == (b[key]["low"], b[key]["central"], b[key]["high"])
    # a value the user gives stays theirs; a GPU without a built-in profile keeps the generic ranges
    f.write_text(json.dumps({**user, "memory_efficiency": 0.5}))
    assert load_profile(str(f))["memory_efficiency"] == 0.5 and "memory_efficiency_range" not in load_profile(str(f))
    f.write_text(json.dumps({**user, "name": "Some Other GPU"}))
    assert "ramp_us" not in load_profile(str(f))


def test_vllm_before_0_4_1_runs_nccl_not_its_custom_all_reduce():
    from tpcomm.predict.engine import resolve_engine

    assert not resolve_engine("vllm-0.2").custom_allreduce and not resolve_engine("vllm-0.4.0").custom_allreduce
    assert resolve_engine("vllm-0.4.1").custom_allreduce and resolve_engine("vllm-0.32").custom_allreduce
    old, new = (
        predict("llama-3.1-70b", Layout(tp=4), gpu="a100-sxm", engine=e, what_if=False)
        for e in ("vllm-0.2.7", "vllm-0.32")
    )
    assert old["collective_latency_kernel"] == "nccl" and new["collective_latency_kernel"] == "custom-ar"


def test_tgi_is_an_engine_with_nccl_and_a_host_term_stated_as_an_assumption():
    from tpcomm.predict.engine import resolve_engine

    e = resolve_engine("tgi-2.4")
    assert e.family == "tgi" and e.runner == "tgi" and not e.custom_allreduce and e.cuda_graphs
    assert "assumption" in e.host_source and "assumption" in e.host_tp_source
    d2, d4 = (predict("llama-3.1-70b", Layout(tp=t), gpu="a100-sxm", engine="tgi-2.4", what_if=False) for t in (2, 4))
    assert d2["collective_latency_kernel"] == "nccl" and d2["engine"]["family"] == "tgi"
    h2, h4 = (d["single_stream"]["breakdown_ms"]["host"] for d in (d2, d4))
    assert h4 - h2 == pytest.approx(e.host_tp_ms[1])
    assert not resolve_engine("tgi-2.4-eager").cuda_graphs
    with pytest.raises(InputError, match="tgi"):
        resolve_engine("tgx-2")


def test_a_user_profile_named_with_a_number_is_written_to_the_run_directory(tmp_path):
    """predict.json is checked against its dataclass where it is written (rundir/documents.py): a user's
    profile may name the card with a number and leave its sources out; the run directory takes it."""
    from tpcomm.rundir import contract as C
    from tpcomm.rundir.layout import RunDir

    builtin = load_profile("h20")
    user = {k: builtin[k] for k in ("memory_GB", "memory_bandwidth_GBps", "bf16_tflops", "link")}
    f = tmp_path / "5090.json"
    f.write_text(json.dumps({**user, "name": 5090, "sources": None}))
    out = tmp_path / "run"
    rc = main(["predict", "--model", "qwen3-32b", "--tp", "2", "--gpu", str(f), "--out", str(out), "--json"])
    assert rc in (None, 0)
    pred = RunDir(out, create=False).read(C.PREDICT)
    assert pred.hardware.name == "5090" and pred.tok_per_s > 0
