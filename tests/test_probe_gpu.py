"""The CUDA paths of the probe (NCCL eager and inside a captured CUDA graph, the
CUDA-event timer, vLLM's PyNccl/custom all-reduce or their ineligibility). One
GPU is enough: NCCL runs a one-rank communicator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


pytestmark = [pytest.mark.gpu, pytest.mark.dist, pytest.mark.skipif(_gpus() == 0, reason="needs CUDA")]


def test_nccl_eager_and_graph_on_one_gpu(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpcomm.cli",
            "probe",
            "--gpus",
            "1",
            "--backend",
            "nccl,pynccl,custom-ar",
            "--ops",
            "all_reduce,all_gather",
            "--sizes",
            "1K,1M",
            "--mode",
            "both",
            "--iters",
            "20",
            "--out",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout)
    nccl = [r for r in rows if r["backend"] == "nccl"]
    assert {(r["mode"], r["timing"]) for r in nccl} == {
        (m, t) for m in ("eager", "graph") for t in ("isolated", "pipelined")
    }
    assert all(r["wrong"] == 0 and r["timer"] == "cuda_event" and 0 < r["p50_us"] < 10_000 for r in nccl)
    doc = json.loads((tmp_path / "probe" / "results.json").read_text())
    measured = {r["backend"] for r in doc["results"]}
    explained = {s["backend"] for s in doc["skipped"] if s["reason"]}
    assert {"pynccl", "custom-ar"} <= measured | explained  # each measured or said why not


def test_more_ranks_than_gpus_is_refused_before_launch(tmp_path):
    """One rank more than the visible GPUs: one line naming --gpus and the limit, exit 2, no run directory
    (before: "invalid device ordinal", or NCCL's duplicate-GPU error from the ranks)."""
    n = _gpus() + 1
    for extra in ([], ["--replay"]):
        out = tmp_path / f"run{len(extra)}"
        p = subprocess.run(
            [sys.executable, "-m", "tpcomm.cli", "probe", *extra, "--gpus", str(n), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        line = p.stderr.strip()
        assert p.returncode == 2 and "\n" not in line, p.stderr[-2000:]
        assert f"--gpus {n}" in line and f"at most {n - 1}" in line and "CUDA GPU" in line
        assert not out.exists()


def test_isolated_rows_state_the_device_lineup(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "probe", "--gpus", "1", "--backend", "nccl", "--sizes", "1K"]
        + ["--mode", "both", "--iters", "20", "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    iso = [r for r in json.loads(p.stdout) if r["timing"] == "isolated"]
    assert {r["mode"] for r in iso} == {"eager", "graph"}
    # world size 1: nothing to wait for, so no skew is left
    assert all(r["lineup"] == "tiny nccl all_reduce (device stream)" and r["skew_p50_us"] == 0 for r in iso)
