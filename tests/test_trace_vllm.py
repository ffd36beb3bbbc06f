"""A recorded real vLLM-CPU TP 2 run (tests/data/trace_vllm_cpu_tp2: both workers' torch-profiler traces and the
tpcomm hook's records of the same two requests) read by tpcomm/trace: steps, collectives, the clock, the plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tpcomm.trace import importer, terms

DATA = Path(__file__).parent / "data"
VLLM = DATA / "trace_vllm_cpu_tp2"


@pytest.fixture(scope="module")
def ts():
    return importer.load(importer.find_traces(VLLM))


def test_steps_are_vllms_execute_ranges(ts):
    for t in ts.tables:
        assert t.timeline == "host" and t.step_source == "vllm execute ranges"
        # 66 execute ranges per rank; the 2 that schedule no token are counted, not written (as the hook does)
        assert t.steps["kind"].value_counts().to_dict() == {"decode": 62, "prefill": 2}
        assert t.steps["step"].nunique() == 64 and t.steps["step"].max() <= 65
        s = t.steps.sort_values("step")
        assert (s["t_end_ns"].to_numpy()[:-1] <= s["t_start_ns"].to_numpy()[1:]).all()  # steps do not overlap
        assert (s.loc[s["kind"] == "decode", "num_seqs"] == 1).all()


def test_collectives_equal_the_hooks_records_of_the_same_requests(ts):
    hook = pd.read_parquet(VLLM / "hook_collectives.parquet")
    tr = ts.collectives
    for r in (0, 1):
        h = hook[hook["rank"] == r].sort_values("t_start_ns")
        t = tr[tr["rank"] == r].sort_values("t_start_ns")
        assert (
            t["op"].value_counts().to_dict()
            == h["op"].value_counts().to_dict()
            == {"all_reduce": 576, "all_gather": 64}
        )
        assert t["op"].tolist() == h["op"].tolist()
        # One clock: Kineto's baseTimeNanoseconds + ts is the hook's time.time_ns() (the hook enters first).
        lead_us = (t["t_start_ns"].to_numpy() - h["t_start_ns"].to_numpy()) / 1e3
        assert 0 < np.median(lead_us) < 50 and np.percentile(np.abs(lead_us), 95) < 100
        # The hook's window holds the shm op: never much shorter.
        assert h["duration_us"].sum() >= 0.9 * t["duration_us"].sum()


def test_ranks_align_into_instances_and_the_split_adds_up(ts):
    a = ts.collectives
    assert a["complete"].all() and (a["n_ranks"] == 2).all()
    assert a.groupby("instance")["transfer_us"].nunique().eq(1).all()
    mins = a.groupby("instance")["duration_us"].min()
    assert np.allclose(a["transfer_us"], a["instance"].map(mins)) and (a["wait_us"] >= 0).all()
    sp = terms.split(a, ts.steps)
    assert sp["unit"] == "token" and sp["decode_pairs"] >= 55
    assert sum(sp["per_token_ms"].values()) == pytest.approx(sp["engine_ms_per_token"], rel=1e-9)
    by_rank = terms.by_rank_steps(a, ts.steps)
    assert np.allclose(by_rank["step_us"], by_rank["compute_us"] + by_rank["transfer_us"] + by_rank["wait_us"])


def test_plan_crosscheck_counts_per_decode_step(ts):
    cc = terms.crosscheck(ts.collectives, ts.steps, str(DATA / "attribute_tiny_tp2/model_config.json"))
    assert cc["match"] is True and cc["observed_total"] == 10, cc
    assert "counts only" in cc["detail"]  # this capture ran without record_shapes: no sizes in the trace
    wrong = terms.crosscheck(ts.collectives, ts.steps, {**_config(), "num_hidden_layers": 6})
    assert wrong["match"] is False and "MISMATCH" in wrong["detail"]


def _config() -> dict:
    return json.loads((DATA / "attribute_tiny_tp2/model_config.json").read_text())


def test_a_trace_import_is_a_run_directory_the_report_renders_as_its_split(tmp_path):
    """`tpcomm trace DIR --out RUN` then `tpcomm report RUN`: the traces' split is attribution/summary.json (typed,
    source "trace"), page one says where it came from, and the headline is the split's total."""
    from click.testing import CliRunner

    from tpcomm.cli import cli
    from tpcomm.report.analysis import analyze
    from tpcomm.rundir.results import Attribution

    run = tmp_path / "run"
    r = CliRunner().invoke(cli, ["trace", str(VLLM), "--out", str(run)])
    assert r.exit_code == 0, r.output
    att = Attribution.from_json(json.loads((run / "attribution/summary.json").read_text()))
    lv = att.headline_level()
    assert att.source == "trace" and lv.source == "trace" and lv.clock == "host" and lv.closure is None
    assert lv.per_token_ms.total == pytest.approx(lv.engine_ms_per_token, rel=1e-9)
    assert att.verdict is not None and att.verdict.transfer_share == pytest.approx(
        lv.per_token_ms.transfer / lv.engine_ms_per_token
    )
    v = analyze(run).verdict
    assert v.source == "measured" and "torch-profiler traces" in v.conditions
    assert v.numbers["ms_per_token"] == lv.engine_ms_per_token and "no client timings in traces" in v.sentences[-1]
    r = CliRunner().invoke(cli, ["report", str(run)])
    assert r.exit_code == 0, r.output
