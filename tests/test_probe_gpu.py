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


def _probe_json(tmp_path, args, env=None):
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "probe", "--gpus", "1", "--backend", "nccl", "--sizes", "1K"]
        + [*args, "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return [r for r in json.loads(p.stdout) if r["timing"] == "isolated"], p.stderr


def test_late_start_and_slack_stay_outside_the_isolated_time(tmp_path):
    """World size 1, a 5 ms sleep kernel after every line-up (TPCOMM_PROBE_FAULT=late) and the slack after it:
    both precede the start event, so the isolated p50 of a 1 KiB all-reduce stays far below 5 ms; the device is
    behind the host by the delay, so no sample overran the slack."""
    iso, _ = _probe_json(tmp_path, ["--mode", "both", "--iters", "20"], {"TPCOMM_PROBE_FAULT": "late:0:*:*:5000"})
    assert {r["mode"] for r in iso} == {"eager", "graph"}
    for r in iso:
        assert r["lineup"] == "tiny nccl all_reduce (device stream)" and r["slack_us"] == 300.0
        assert r["p50_us"] < 500.0 and r["slack_overruns"] <= 2, r


def test_a_slack_shorter_than_the_enqueue_is_counted_and_warned(tmp_path):
    """No slack (TPCOMM_PROBE_SLACK_US=0): the one-rank line-up finishes before ProcessGroupNCCL has queued the
    op, so the start event has fired when it is checked: most eager samples overrun, and the probe says so."""
    iso, err = _probe_json(tmp_path, ["--mode", "eager", "--iters", "20"], {"TPCOMM_PROBE_SLACK_US": "0"})
    (r,) = iso
    assert r["slack_us"] == 0.0 and r["slack_overruns"] > 10, r
    assert "WARNING: slack overrun" in err


_FIRST_SAMPLE = r"""
import datetime, os, torch, torch.distributed as dist
from probes.backends import make_backend
from probes.measure import Timer
from probes.replay_kernels import HostWaits
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
ctrl = dist.new_group(backend="gloo")
b = make_backend("nccl", ctrl, 0)
x = torch.ones(256, device=b.device)
timer = Timer(b)
with HostWaits() as w:
    timer.time_us(lambda: dist.all_reduce(x, group=b.group), lambda: b.lineup(ctrl))
print("waits", w.count, flush=True)
dist.destroy_process_group()
from probes.collectives import leave
leave(0)
"""


def test_first_isolated_sample_waits_once(tmp_path):
    """The slack kernel is calibrated when the Timer is built: the first lined-up sample waits on the device
    once (its end event), not also inside the calibration after the line-up (which would line it up on the
    host)."""
    from tpcomm.probe.launcher import free_port

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    p = subprocess.run([sys.executable, "-c", _FIRST_SAMPLE], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "waits 1" in p.stdout, p.stdout


def _two_ranks(tmp_path, module_args, per_rank_env):
    from tpcomm.probe.launcher import free_port

    port = str(free_port())
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **per_rank_env(r)}
        procs.append(
            subprocess.Popen(
                [sys.executable, *module_args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    return outs


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_custom_ar_is_ineligible_with_one_visible_gpu_per_rank(tmp_path):
    """srun --gpus-per-task=1's layout (each rank sees only its own GPU, as device 0): NCCL runs; vLLM's custom
    all-reduce indexes peers' devices by local rank, so it is reported ineligible with that reason (before: an
    IndexError/AssertionError from vLLM's P2P check crashed the rank)."""
    args = ["probes/collectives.py", "--backend", "nccl,custom-ar", "--sizes", "1K", "--iters", "5"]
    _two_ranks(tmp_path, [*args, "--out", str(tmp_path)], lambda r: {"CUDA_VISIBLE_DEVICES": str(r)})
    recs = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "result" and r["backend"] == "nccl" for r in recs)
    car = [r for r in recs if r.get("backend") == "custom-ar"]
    assert car and all(r["kind"] == "skipped" and "indexes peers" in r["reason"] for r in car), car
    assert all(r.get("visible_gpus_by_rank") == [1, 1] for r in recs if r["kind"] in ("result", "skipped"))


_FI_LINEUP = r"""
import datetime, torch, torch.distributed as dist
from probes.backends import Ineligible
from probes.flashinfer_ipc import FlashInferIpcBackend
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
ctrl = dist.new_group(backend="gloo")
try:
    b = FlashInferIpcBackend(ctrl, dist.get_rank(), hidden=4096, batch=1)
except Ineligible as e:
    print("ineligible:", e)
else:
    for _ in range(3):
        b.lineup(ctrl)
    torch.cuda.synchronize()
    print("lineup ok:", b.lineup_name)
    b.close()
dist.barrier()
dist.destroy_process_group()
from probes.collectives import leave
leave(0)
"""


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_flashinfer_ipc_lines_up_on_its_nccl_group(tmp_path):
    """The FlashInfer backend's line-up is an NCCL all-reduce on the device group it builds (not NcclBackend's,
    which would all-reduce a CUDA tensor on the gloo tune group); ineligible machines say why."""
    (o0, _), _ = _two_ranks(tmp_path, ["-c", _FI_LINEUP], lambda r: {})
    assert "lineup ok: tiny nccl all_reduce on FlashInfer's device group" in o0 or "ineligible:" in o0, o0
