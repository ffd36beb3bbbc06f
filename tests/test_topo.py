"""`tpcomm topo`: the CPU topology of this machine, vLLM's all-reduce eligibility
rules on NVML-shaped topologies, and NVML itself where a GPU exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.topo.collect import collect_topology, format_topology
from tpcomm.topo.cpu import cpu_topology, parse_cpulist
from tpcomm.topo.rules import cpu_paths, gpu_paths, vllm_tables


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def test_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []


def test_cpu_topology_matches_this_machine():
    c = cpu_topology()
    assert c["logical_cpus"] == os.cpu_count()
    assert set(c["usable_cpus"]) == os.sched_getaffinity(0)
    assert sum(len(n["cpus"]) for n in c["numa_nodes"]) >= len(c["usable_cpus"])


@pytest.mark.skipif(_cuda(), reason="checks the no-driver message")
def test_topo_without_gpu_says_so_and_shows_cpu(tmp_path):
    r = CliRunner().invoke(cli, ["topo", "--tp", "2", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "No NVIDIA GPU" in r.output and "NUMA node 0" in r.output and "shm" in r.output
    doc = json.loads((tmp_path / "topo.json").read_text())
    assert doc["gpu"] is None and doc["gpu_absent_reason"] and doc["vllm"]["platform"] == "cpu"


def test_topo_json_shows_nccl_env():
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "topo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NCCL_P2P_DISABLE": "1", "NCCL_PROTO": "LL"},
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (
        doc["env"]["NCCL_P2P_DISABLE"] == "1" and doc["env"]["NCCL_PROTO"] == "LL" and doc["env"]["NCCL_ALGO"] is None
    )
    assert "NCCL_P2P_DISABLE=1" in format_topology(doc)


def _gpus(n, nvlink, p2p=True, cc="12.0"):
    return {
        "driver": "580.00",
        "gpus": [{"index": i, "name": "GPU", "compute_capability": cc} for i in range(n)],
        "p2p_read": [[p2p or i == j for j in range(n)] for i in range(n)],
        "nvlink_p2p": [[nvlink or i == j for j in range(n)] for i in range(n)],
        "topology": [["X" if i == j else "PXB (several PCIe switches)" for j in range(n)] for i in range(n)],
    }


def _path(paths, name):
    return next(p for p in paths if p["path"] == name)


def test_rules_eight_pcie_gpus_like_the_case_study():
    t = vllm_tables()
    paths = gpu_paths(_gpus(8, nvlink=False), 8, t)
    ca = _path(paths, "custom-ar")
    assert not ca["eligible"] and "more than two PCIe-only GPUs" in ca["why"]
    assert not _path(paths, "torch-symm-mem")["eligible"]
    fi = _path(paths, "flashinfer-pcie-ipc")
    assert not fi["eligible"] and "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1" in fi["lever"]
    assert _path(paths, "pynccl")["eligible"]


def test_rules_two_pcie_gpus_with_p2p_allow_custom_ar_but_not_without():
    t = vllm_tables()
    assert _path(gpu_paths(_gpus(2, nvlink=False), 2, t), "custom-ar")["eligible"]
    no_p2p = _path(gpu_paths(_gpus(2, nvlink=False, p2p=False), 2, t), "custom-ar")
    assert not no_p2p["eligible"] and "P2P" in no_p2p["why"]
    odd = _path(gpu_paths(_gpus(3, nvlink=True), 3, t), "custom-ar")
    assert not odd["eligible"] and "world size 3" in odd["why"]


def test_rules_nvlink_h200_symm_mem(monkeypatch):
    t = vllm_tables()
    assert 8 in t["custom_ar_world_sizes"] and "9.0" in t["symm_mem_max_sizes"]
    paths = gpu_paths(_gpus(8, nvlink=True, cc="9.0"), 8, t)
    assert _path(paths, "custom-ar")["eligible"] and _path(paths, "torch-symm-mem")["eligible"]
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    assert not _path(gpu_paths(_gpus(8, nvlink=True, cc="9.0"), 8, t), "torch-symm-mem")["eligible"]


def test_cpu_rules():
    assert _path(cpu_paths(2, True), "shm")["eligible"]
    assert not _path(cpu_paths(2, False), "shm")["eligible"]


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs CUDA")
def test_nvml_reads_every_gpu():
    import torch

    doc = collect_topology()
    assert doc["gpu"] is not None and len(doc["gpu"]["gpus"]) == torch.cuda.device_count()
    g = doc["gpu"]["gpus"][0]
    assert g["pcie"]["width_max"] and g["compute_capability"] and g["name"]
    assert all(doc["gpu"]["p2p_read"][i][i] for i in range(len(doc["gpu"]["gpus"])))
    assert "GPU0" in format_topology(doc)


def test_p2p_caps_index_is_the_integer_nvml_wants():
    """nvidia-ml-py defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,): passed as is, ctypes raised, a broad
    except swallowed it and every off-diagonal pair read "no P2P" (issue 13, item 2)."""
    import pynvml

    from tpcomm.topo.nvml import _safe, caps_index

    assert caps_index("READ") == 0 and type(caps_index("READ")) is int
    assert caps_index("NVLINK") == int(
        getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK")[0]
        if isinstance(pynvml.NVML_P2P_CAPS_INDEX_NVLINK, tuple)
        else pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    )
    # Only NVML's own "not supported here" errors become a default; a wrong call is not hidden.
    with pytest.raises(TypeError):
        _safe(lambda: (_ for _ in ()).throw(TypeError("wrong argument")))
    assert (
        _safe(
            lambda: (_ for _ in ()).throw(pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)), default="n/a"
        )
        == "n/a"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs CUDA")
def test_nvml_p2p_off_diagonal_matches_cuda():
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("one GPU: no off-diagonal P2P pair to read")
    p2p = collect_topology()["gpu"]["p2p_read"]
    for i in range(n):
        for j in range(n):
            if i != j:
                assert p2p[i][j] == torch.cuda.can_device_access_peer(i, j), (i, j, p2p)


def test_rules_allreduce_rms_fusion_on_sm90_and_sm100_not_sm89():
    """vLLM fuses all-reduce + RMSNorm (FlashInfer) only on SM 9.0 / 10.x, TP > 1, FlashInfer installed,
    up to its per-SM, per-world-size size (0.5 MiB at TP 8 on H200, 1 MiB on B200)."""
    t = vllm_tables()
    h200 = _path(gpu_paths(_gpus(8, nvlink=True, cc="9.0"), 8, t, flashinfer=True), "flashinfer-fused-ar-rmsnorm")
    assert h200["eligible"] and h200["max_bytes"] == 512 * 1024 and "0.5 MiB" in h200["why"]
    b200 = _path(gpu_paths(_gpus(8, nvlink=True, cc="10.0"), 8, t, flashinfer=True), "flashinfer-fused-ar-rmsnorm")
    assert b200["eligible"] and b200["max_bytes"] == 1024 * 1024
    assert (
        _path(gpu_paths(_gpus(4, nvlink=True, cc="10.0"), 4, t, flashinfer=True), "flashinfer-fused-ar-rmsnorm")[
            "max_bytes"
        ]
        == 32 * 1024 * 1024
    )
    l40s = _path(gpu_paths(_gpus(8, nvlink=False, cc="8.9"), 8, t, flashinfer=True), "flashinfer-fused-ar-rmsnorm")
    assert not l40s["eligible"] and "SM 8.9" in l40s["why"]
    no_fi = _path(gpu_paths(_gpus(8, nvlink=True, cc="9.0"), 8, t, flashinfer=False), "flashinfer-fused-ar-rmsnorm")
    assert not no_fi["eligible"] and "FlashInfer" in no_fi["why"]
    odd = _path(gpu_paths(_gpus(6, nvlink=True, cc="9.0"), 6, t, flashinfer=True), "flashinfer-fused-ar-rmsnorm")
    assert not odd["eligible"] and "world size 6" in odd["why"]


@pytest.mark.parametrize(
    "cc,tp,nvlink,want",
    [
        ("9.0", 8, True, 256 * 1024),  # CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][8] with symmetric memory on
        ("9.0", 2, True, 8 * 1024 * 1024),  # 64 MiB in the table, capped by CustomAllreduce's 8 MiB default
        ("10.0", 4, True, 2 * 1024 * 1024),
        ("10.0", 8, True, 1024 * 1024),
        ("8.9", 2, False, 8 * 1024 * 1024),  # no symmetric memory on SM 8.9: the default
        ("12.0", 2, False, 8 * 1024 * 1024),
    ],
)
def test_custom_ar_size_limit_per_sm_and_world_size(cc, tp, nvlink, want):
    t = vllm_tables()
    ca = _path(gpu_paths(_gpus(tp, nvlink=nvlink, cc=cc), tp, t, flashinfer=True), "custom-ar")
    assert ca["eligible"] and ca["max_bytes"] == want


def test_custom_ar_size_limit_without_symmetric_memory(monkeypatch):
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    ca = _path(gpu_paths(_gpus(8, nvlink=True, cc="9.0"), 8, vllm_tables(), flashinfer=True), "custom-ar")
    assert ca["max_bytes"] == 8 * 1024 * 1024


def test_cuda_visible_devices_maps_to_nvml_indices_as_cuda_does():
    from tpcomm.topo.nvml import visible_indices

    u = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-abcd-2", "GPU-cccc-3"]
    assert visible_indices(None, u) == ([0, 1, 2, 3], None)
    assert visible_indices("2,0", u) == ([2, 0], None)
    assert visible_indices("GPU-bbbb,3", u) == ([1, 3], None)  # a unique UUID prefix
    assert visible_indices("", u)[0] == []
    for cvd, want in (("0,7,1", [0]), ("GPU-a,1", []), ("1,1,2", [1]), ("bbbb,0", [])):
        got, note = visible_indices(cvd, u)  # CUDA stops at the first entry naming no single GPU
        assert got == want and note, cvd
    # MIG instances: mapped to their parent GPU when NVML can tell, never a crash
    assert visible_indices("MIG-x,MIG-y,2", u, lambda s: 1) == ([1, 2], None)
    assert visible_indices("MIG-x,1", u)[0] == []
