"""`tpcomm probe --replay` on real ranks: Kimi-K2.5's step at TP 8 on 8 CPU ranks
(gloo), a known skew on one rank read back as wait on the other (vLLM's shm
all-reduce), a dead rank, and the report / predict reading the replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tpcomm.tinymodel import TINY_CONFIG

pytestmark = pytest.mark.dist
TPCOMM = [sys.executable, "-m", "tpcomm.cli"]
SKEW_US = 400.0


def _replay(args, env=None, timeout=300):
    t0 = time.monotonic()
    p = subprocess.run(
        TPCOMM + ["probe", "--replay", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return p, time.monotonic() - t0


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("tinycfg") / "config.json"
    p.write_text(json.dumps(TINY_CONFIG))
    return p


@pytest.fixture(scope="module")
def skewed_run(tiny_config, tmp_path_factory) -> Path:
    """The tiny DeepSeek-V3-style model at TP 2 on gloo and shm, rank 1 delayed before every collective."""
    run = tmp_path_factory.mktemp("skew") / "run"
    p, wall = _replay(
        [
            "--gpus",
            "2",
            "--model",
            str(tiny_config),
            "--backend",
            "gloo,shm",
            "--context",
            "64",
            "--skew-us",
            str(SKEW_US),
            "--skew-rank",
            "1",
            "--steps",
            "20",
            "--warmup",
            "3",
            "--out",
            str(run),
        ]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "skew 400 us before each collective on rank 1" in p.stdout
    print(f"tiny TP-2 replay wall time: {wall:.1f} s")
    return run


def test_kimi_tp8_on_eight_gloo_ranks(tmp_path):
    run = tmp_path / "run"
    p, wall = _replay(
        [
            "--gpus",
            "8",
            "--oversubscribe",  # 8 ranks on a 2-core machine: asked for
            "--model",
            "kimi-k2.5",
            "--backend",
            "gloo",
            "--work-scale",
            "1e-4",
            "--context",
            "256",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--timeout",
            "120",
            "--out",
            str(run),
        ],
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    print(f"Kimi-K2.5 TP-8 replay on 8 gloo ranks, {os.cpu_count()} cores: {wall:.1f} s wall")
    doc = json.loads((run / "probe" / "replay.json").read_text())
    assert doc["state"] == "complete" and doc["wrong"] == 0
    assert doc["schedule"]["counts"] == {"all_reduce": 123, "all_gather": 1}
    coll = pd.read_parquet(run / "probe" / "replay_collectives.parquet")
    full = coll[coll["timing"] == "full"]
    per = full.groupby(["rank", "step", "op"]).size().unstack("op")
    assert len(per) == 8 * 3 and (per["all_reduce"] == 123).all() and (per["all_gather"] == 1).all()
    assert full["complete"].all() and (full["wait_us"] >= 0).all()
    steps = pd.read_parquet(run / "probe" / "replay_steps.parquet")
    assert sorted(steps["timing"].unique()) == ["comm", "compute", "full"] and (steps["ranks"] == 8).all()
    assert ((steps["compute_us"] + steps["transfer_us"] + steps["wait_us"] - steps["step_us"]).abs() < 1e-6).all()
    (e,) = doc["results"]
    assert e["full_step_split_us"]["collectives_per_step"] == 124 and e["timings"]["full"]["steps"] == 3


def test_skew_on_one_rank_is_wait_on_the_other(skewed_run, shm_kernels):
    coll = pd.read_parquet(skewed_run / "probe" / "replay_collectives.parquet")
    shm = coll[(coll["backend"] == "shm") & (coll["timing"] == "full")]
    waited = shm[shm["rank"] == 0]["wait_us"].mean()
    skewed = shm[shm["rank"] == 1]["wait_us"].mean()
    doc = json.loads((skewed_run / "probe" / "replay.json").read_text())
    e = next(x for x in doc["results"] if x["backend"] == "shm")
    full = e["timings"]["full"]
    print(
        f"shm wait: rank 0 {waited:.0f} us, rank 1 {skewed:.0f} us; {full['preempted_steps']}/{full['steps']} preempted"
    )
    # Per call, on the steps where no rank waited long for a CPU (the replay's own flag): the skew is rank 0's
    # wait, and rank 1 waits for nobody. Medians: a host hiccup of a few ms in one call moves a mean by 30%.
    st = pd.read_parquet(skewed_run / "probe" / "replay_steps.parquet")
    st = st[(st["backend"] == "shm") & (st["timing"] == "full")]
    calm = shm[shm["step"].isin(st.loc[~st["preempted"], "step"])]
    if calm["step"].nunique() >= 3:
        assert calm[calm["rank"] == 0]["wait_us"].median() == pytest.approx(SKEW_US, rel=0.2)
        assert calm[calm["rank"] == 1]["wait_us"].median() < 0.2 * SKEW_US
    else:  # nearly every step preempted: a busy host, and the replay says so
        assert 2 * full["preempted_steps"] > full["steps"], (waited, skewed, full)
    if abs(waited - SKEW_US) > 0.2 * SKEW_US:
        # A busy host (a third process on the 2 cores: 1468 us against 400 on 2026-12-02; 528 with 6 of 20 steps
        # preempted on 2026-12-06): the scheduler's slices are in the mean wait, and the replay flags them.
        assert full["preempted_steps"] >= 1, (waited, skewed, full)
        return
    assert skewed < 0.2 * SKEW_US
    # Collectives only: the skew is work, and the work is removed.
    comm = coll[(coll["backend"] == "shm") & (coll["timing"] == "comm")]
    assert comm["wait_us"].mean() < 0.2 * SKEW_US
    # 10 collectives per step each wait ~SKEW_US on rank 0: half of that is the mean over the two ranks
    assert e["full_step_split_us"]["wait_us"] == pytest.approx(10 * SKEW_US / 2, rel=0.2)
    assert e["timings"]["compute"]["p50_us"] > 0 and e["timings"]["comm"]["p50_us"] > 0


def test_report_and_predict_read_the_replay(skewed_run, tmp_path, shm_kernels):
    from tpcomm.report.analysis import analyze

    rep = analyze(skewed_run)
    sec = rep["replay"]
    assert sec.available and {r.backend for r in sec.data.rows} == {"gloo", "shm"}
    assert "work scale 1" in sec.conditions and "TP 2" in sec.conditions
    p = subprocess.run(TPCOMM + ["report", str(skewed_run)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    md = (skewed_run / "report.md").read_text()
    assert "## The decode step replayed" in md and "| shm | eager |" in md
    from pypdf import PdfReader

    text = "".join(pg.extract_text() for pg in PdfReader(str(skewed_run / "report.pdf")).pages)
    assert "The decode step replayed" in text
    from tpcomm.predict.probe_fit import probe_latency

    fn, desc = probe_latency(skewed_run, {"type": "shm"})
    doc = json.loads((skewed_run / "probe" / "replay.json").read_text())
    shm = next(x for x in doc["results"] if x["backend"] == "shm")
    ar = next(o for o in shm["ops"] if o["timing"] == "full" and o["op"] == "all_reduce")
    assert fn("all_reduce", ar["bytes"], 2) == ar["duration_us_p50"] and "replay" in desc


def test_dead_rank_keeps_the_finished_timings(tiny_config, tmp_path):
    run = tmp_path / "run"
    p, _ = _replay(
        [
            "--gpus",
            "2",
            "--model",
            str(tiny_config),
            "--backend",
            "gloo",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--out",
            str(run),
        ],
        env={"TPCOMM_PROBE_FAULT": "die:1:*:*"},
        timeout=240,
    )
    assert p.returncode == 1
    assert "rank 1 died (exit code 17)" in p.stderr and "decode-step replay (comm)" in p.stderr, p.stderr[-2000:]
    doc = json.loads((run / "probe" / "replay.json").read_text())
    assert doc["state"] == "failed" and "rank 1" in doc["error"]
    (e,) = doc["results"]
    assert set(e["timings"]) == {"full", "compute"}
    assert json.loads((run / "status.json").read_text())["replay"]["state"] == "failed"


def test_world_size_one_runs_each_collective_as_a_one_rank_call(tiny_config, tmp_path):
    run = tmp_path / "run"
    p, _ = _replay(
        [
            "--gpus",
            "1",
            "--model",
            str(tiny_config),
            "--backend",
            "gloo",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--out",
            str(run),
        ]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((run / "probe" / "replay.json").read_text())
    assert doc["schedule"]["counts"] == {"all_reduce": 9, "all_gather": 1} and doc["wrong"] == 0
    assert doc["results"][0]["host_syncs_per_step"] == 0  # the host clock never waits on a device
    coll = pd.read_parquet(run / "probe" / "replay_collectives.parquet")
    assert (coll["wait_us"] == 0).all() and (coll["transfer_us"] == coll["duration_us"]).all()


def test_joined_torchrun_launch(tiny_config, tmp_path):
    from tpcomm.probe.launcher import free_port

    run = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    p = subprocess.run(
        [
            str(torchrun),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "tpcomm.cli",
            "probe",
            "--replay",
            "--model",
            str(tiny_config),
            "--backend",
            "gloo",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--out",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((run / "probe" / "replay.json").read_text())
    assert doc["conditions"]["launch"] == "joined" and doc["conditions"]["world_size"] == 2
    (e,) = doc["results"]
    assert set(e["timings"]) == {"full", "compute", "comm"} and e["full_step_split_us"]["collectives_per_step"] == 10
