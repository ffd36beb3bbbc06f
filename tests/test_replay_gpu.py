"""The replay's CUDA paths: world size 1 on one GPU (NCCL eager and the whole step
captured in one CUDA graph, CUDA-event timers in and around the graph, the
read-reduce work kernel, vLLM's PyNccl / custom AR / FlashInfer PCIe IPC
ineligible at world size 1 with their reasons), and the skew split on two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


pytestmark = [pytest.mark.gpu, pytest.mark.dist, pytest.mark.skipif(_gpus() == 0, reason="needs CUDA")]


def _replay(args, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "probe", "--replay", *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((tmp_path / "probe" / "replay.json").read_text())


def test_world_size_one_eager_and_whole_step_graph(tmp_path):
    doc = _replay(
        [
            "--gpus",
            "1",
            "--model",
            "kimi-k2.5",
            "--backend",
            "nccl,pynccl,custom-ar,flashinfer-ipc",
            "--mode",
            "both",
            "--work-scale",
            "0.05",
            "--context",
            "1024",
            "--steps",
            "10",
        ],
        tmp_path,
    )
    got = {(e["backend"], e["mode"]): e for e in doc["results"]}
    assert set(got) == {("nccl", "eager"), ("nccl", "graph")}
    skipped = {s["backend"] for s in doc["skipped"]}
    assert {"pynccl", "custom-ar", "flashinfer-ipc"} <= skipped and all(s["reason"] for s in doc["skipped"])
    assert got[("nccl", "eager")]["timer"] == "cuda_event" and got[("nccl", "graph")]["timer"] == "cuda_event_graph"
    # one host wait per replayed step (its end event), none per collective or per graph piece
    assert got[("nccl", "eager")]["host_syncs_per_step"] == 1 and got[("nccl", "graph")]["host_syncs_per_step"] == 1
    coll = pd.read_parquet(tmp_path / "probe" / "replay_collectives.parquet")
    for mode in ("eager", "graph"):
        e = got[("nccl", mode)]
        assert e["full_step_split_us"]["collectives_per_step"] == 124
        c = coll[(coll["mode"] == mode) & (coll["timing"] == "full")]
        assert (c.groupby("step").size() == 124).all() and (c["duration_us"] > 0).all()
        # the work kernel streams near the memory roofline: bytes per compute-only step over its time
        gbps = doc["schedule"]["work_bytes_per_rank"] / (e["timings"]["compute"]["p50_us"] * 1e-6) / 1e9
        assert 200 < gbps < 20000, gbps
        assert e["timings"]["comm"]["p50_us"] > 0
    # every collective of a graph replay sits inside the step that replayed it
    g = coll[(coll["mode"] == "graph") & (coll["timing"] == "full")]
    steps = pd.read_parquet(tmp_path / "probe" / "replay_steps.parquet")
    gs = steps[(steps["mode"] == "graph") & (steps["timing"] == "full")]
    assert g.groupby("step")["duration_us"].sum().max() <= gs["step_us"].max()


@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs")
def test_skew_on_one_gpu_is_wait_on_the_other(tmp_path):
    skew = 200.0
    _replay(
        [
            "--gpus",
            "2",
            "--model",
            "kimi-k2.5",
            "--tp",
            "2",
            "--backend",
            "nccl",
            "--mode",
            "both",
            "--work-scale",
            "0.01",
            "--skew-us",
            str(skew),
            "--skew-rank",
            "1",
            "--steps",
            "10",
        ],
        tmp_path,
    )
    coll = pd.read_parquet(tmp_path / "probe" / "replay_collectives.parquet")
    for mode in ("eager", "graph"):
        c = coll[(coll["mode"] == mode) & (coll["timing"] == "full")]
        assert abs(c[c["rank"] == 0]["wait_us"].mean() - skew) <= 0.2 * skew
