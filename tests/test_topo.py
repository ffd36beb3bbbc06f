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
    assert visible_indices("GPU-bbbb", u) == ([1], None)  # a unique UUID prefix
    assert visible_indices("", u)[0] == []
    assert visible_indices("1gpu2,2ampere", u) == ([1, 2], None)  # ordinals read like strtoul
    for cvd, want in (
        ("0,7,1", [0]),  # cut at the first ordinal past the last GPU
        ("GPU-a,1", []),  # an ambiguous prefix stops the list
        ("bbbb,0", []),  # no leading number: stops
        ("1,1,2", []),  # a repeated entry hides every GPU
        ("GPU-bbbb,GPU-bbbb-1", []),  # two UUIDs of one GPU: likewise
        ("GPU-bbbb,3", [1]),  # a UUID list ends at the first entry that is not a UUID
        ("gpu-bbbb", []),  # UUID prefixes are case-sensitive
    ):
        got, note = visible_indices(cvd, u)
        assert got == want and note, cvd
    # MIG instances: mapped to their parent GPU when NVML can tell, never a crash; a MIG list ends at "2"
    assert visible_indices("MIG-x,MIG-y,2", u, lambda s: 1)[0] == [1]
    assert visible_indices("MIG-x,1", u)[0] == []


@pytest.mark.parametrize(
    "cvd",
    [
        "2,0",
        "GPU-bbbb,3",
        "0,7,1",
        "GPU-a,1",
        "1,1,2",
        "bbbb,0",
        "1gpu2,2ampere",
        "gpu-bbbb",
        " 1, 2",
        "-1,2",
        "+1",
        "GPU-bbbb,GPU-bbbb-1",
        "GPU-cccc,GPU-aaaa",
        "3,2,1,0",
        "",
    ],
)
def test_cuda_visible_devices_parsing_matches_the_installed_pytorch(cvd, monkeypatch):
    """PyTorch mirrors CUDA's rules (torch/cuda/__init__.py): its parser, UUID matching and the cut at the
    device count, run on the same UUIDs, give the same GPUs as ours."""
    import torch.cuda as tc

    from tpcomm.topo.nvml import visible_indices

    u = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-abcd-2", "GPU-cccc-3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    want = tc._parse_visible_devices()
    if want and isinstance(want[0], str):
        want = tc._transform_uuid_to_ordinals(want, u)
    else:
        cut = next((i for i, x in enumerate(want) if x >= len(u)), len(want))
        want = want[:cut]
    assert visible_indices(cvd, u)[0] == want


def _gpu_paths_with(monkeypatch, cc="9.0", n=8, nvlink=True, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return gpu_paths(_gpus(n, nvlink=nvlink, cc=cc), n, vllm_tables(), flashinfer=True, fi_comm=True)


def test_the_standalone_flashinfer_allreduce_needs_only_the_import_the_fusion_needs_usable_kernels():
    """vLLM's FlashInferAllReduce checks that flashinfer.comm imports (fi_ar_available); the fusion pass
    checks has_flashinfer() (kernels it can load or JIT). Installed without cubin or nvcc: the first is
    eligible, the second not, and neither is said to be 'not importable' for the other's reason."""
    t = vllm_tables()
    g = _gpus(8, nvlink=True, cc="9.0")
    paths = gpu_paths(g, 8, t, flashinfer=False, fi_comm=True)
    assert (
        _path(paths, "flashinfer-ar")["eligible"] and "has_flashinfer() says no" in _path(paths, "flashinfer-ar")["why"]
    )
    assert not _path(paths, "flashinfer-fused-ar-rmsnorm")["eligible"]
    gone = _path(gpu_paths(g, 8, t, flashinfer=False, fi_comm=False), "flashinfer-ar")
    assert not gone["eligible"] and "not importable" in gone["why"]


def test_flashinfer_allreduce_is_listed_in_vllms_order_with_its_size(monkeypatch):
    """vLLM 0.32 tries its standalone FlashInfer all-reduce (VLLM_ALLREDUCE_USE_FLASHINFER=1 by default)
    before custom all-reduce, up to FI_ALLREDUCE_FUSION_MAX_SIZE_MB[sm][tp] (or the mnnvl tuned size)."""
    paths = _gpu_paths_with(monkeypatch)
    names = [p["path"] for p in paths]
    assert names == [
        "flashinfer-fused-ar-rmsnorm",
        "nccl-symm-mem",
        "flashinfer-pcie-ipc",
        "flashinfer-ar",
        "custom-ar",
        "torch-symm-mem",
        "pynccl",
    ]
    fi = _path(paths, "flashinfer-ar")
    assert fi["eligible"] and fi["max_bytes"] == 512 * 1024 and "0.5 MiB" in fi["why"]
    assert "declines" in _path(paths, "custom-ar")["why"]  # custom AR gets what FlashInfer does not take
    # SM 10.3 at TP 8 on one node: the mnnvl backend's tuned size (64 MB, exclusive), not the 4 MB table entry
    sm103 = _path(_gpu_paths_with(monkeypatch, cc="10.3"), "flashinfer-ar")
    assert sm103["max_bytes"] == 64 * 1024 * 1024 - 1
    assert "64 MiB is the mnnvl size, 4 MiB if it falls back to trtllm" in sm103["why"], sm103["why"]
    trt = _gpu_paths_with(monkeypatch, cc="10.3", VLLM_FLASHINFER_ALLREDUCE_BACKEND="trtllm")
    assert _path(trt, "flashinfer-ar")["max_bytes"] == 4 * 1024 * 1024
    monkeypatch.delenv("VLLM_FLASHINFER_ALLREDUCE_BACKEND")
    no_size = _path(_gpu_paths_with(monkeypatch, cc="8.9", nvlink=False), "flashinfer-ar")
    assert not no_size["eligible"] and "SM 8.9" in no_size["why"]
    assert not _path(_gpu_paths_with(monkeypatch, n=6), "flashinfer-ar")["eligible"]
    off = _gpu_paths_with(monkeypatch, VLLM_ALLREDUCE_USE_FLASHINFER="0")
    assert not _path(off, "flashinfer-ar")["eligible"] and "declines" not in _path(off, "custom-ar")["why"]
    monkeypatch.delenv("VLLM_ALLREDUCE_USE_FLASHINFER")
    bi = _gpu_paths_with(monkeypatch, VLLM_BATCH_INVARIANT="1")
    assert not _path(bi, "flashinfer-ar")["eligible"] and not _path(bi, "flashinfer-fused-ar-rmsnorm")["eligible"]
    assert not _path(bi, "torch-symm-mem")["eligible"]


def test_flashinfer_ar_size_matches_vllms_own_computation(monkeypatch):
    """Our max_bytes is what FlashInferAllReduce.__init__ computes from the same tables: its helper
    (_get_tuned_standalone_max_size, real) with the device capability and node count it would read."""
    import types

    from vllm.distributed.device_communicators import all_reduce_utils as aru
    from vllm.distributed.device_communicators import flashinfer_all_reduce as far

    from tpcomm.topo.rules import flashinfer_ar_max_bytes

    t = vllm_tables()
    monkeypatch.setattr(far, "_node_count", lambda group: 1)
    checked = 0
    for (sm, tp, nodes), mb in aru.FI_MNNVL_ALLREDUCE_MAX_SIZE_MB.items():
        if nodes == 1 and tp in t["fi_fusion_max_size_mb"].get(sm, {}):
            assert flashinfer_ar_max_bytes(t, f"{sm // 10}.{sm % 10}", tp) == int(mb * 1024 * 1024) - 1
            cap = types.SimpleNamespace(to_int=lambda sm=sm: sm)
            monkeypatch.setattr(far.current_platform, "get_device_capability", lambda cap=cap: cap)
            assert flashinfer_ar_max_bytes(t, f"{sm // 10}.{sm % 10}", tp) == far._get_tuned_standalone_max_size(
                tp, "mnnvl", None
            )
            checked += 1
    assert checked
    assert flashinfer_ar_max_bytes(t, "9.0", 4) == 2 * 1024 * 1024


def test_custom_ar_is_not_eligible_above_eight_gpus(monkeypatch):
    """16 is in CustomAllreduce._SUPPORTED_WORLD_SIZES, but should_custom_ar declines at world size > 8."""
    ca = _path(_gpu_paths_with(monkeypatch, cc="10.0", n=16), "custom-ar")
    assert not ca["eligible"] and "> 8" in ca["why"]


def test_custom_ar_cap_is_said_to_depend_on_multicast(monkeypatch):
    ca = _path(_gpu_paths_with(monkeypatch), "custom-ar")
    assert ca["max_bytes"] == 256 * 1024 and "multicast" in ca["why"] and "8 MiB" in ca["why"]


def test_flashinfer_usable_mirrors_vllms_has_flashinfer(monkeypatch, tmp_path):
    """vLLM's has_flashinfer() (real, uncached call) and ours agree when the package, flashinfer-cubin,
    nvcc and ninja are each there or not."""
    import importlib.util
    import shutil

    import vllm.utils.flashinfer as vfi

    from tpcomm.topo.fusion import flashinfer_usable

    real_find, real_which = importlib.util.find_spec, shutil.which
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.delenv("VLLM_HAS_FLASHINFER_CUBIN", raising=False)
    for fi, cubin, cuda_home, ninja in [
        (False, False, True, True),
        (True, True, False, False),
        (True, False, True, True),
        (True, False, False, True),
        (True, False, True, False),
    ]:
        present = {"flashinfer": fi, "flashinfer_cubin": cubin}
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a, p=present: object() if p.get(name) else (None if name in p else real_find(name, *a)),
        )
        monkeypatch.setattr(
            shutil,
            "which",
            lambda cmd, *a, n=ninja: ("/usr/bin/ninja" if n else None) if cmd == "ninja" else real_which(cmd, *a),
        )
        monkeypatch.setenv("CUDA_HOME", str(tmp_path / ("cuda" if cuda_home else "nowhere")))
        vfi.has_flashinfer_cubin.cache_clear()
        want = vfi.has_flashinfer.__wrapped__()
        assert flashinfer_usable()[0] == want, (fi, cubin, cuda_home, ninja)
    vfi.has_flashinfer_cubin.cache_clear()


def test_fusion_batch_invariant_comes_from_the_server_when_known(monkeypatch):
    from tpcomm.topo.fusion import allreduce_fusion

    t = vllm_tables()
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # this shell's value; the server says off
    served = allreduce_fusion("9.0", 8, True, t, server_batch_invariant=False)
    assert served["enabled"] and "hook status" in served["batch_invariant_from"] and "assumed" not in served["why"]
    local = allreduce_fusion("9.0", 8, True, t)
    assert not local["enabled"] and "assumed" in local["why"]
    monkeypatch.delenv("VLLM_BATCH_INVARIANT")
    assert "assumed the server's" in allreduce_fusion("9.0", 8, True, t)["why"]
    assert not allreduce_fusion("9.0", 8, True, t, server_batch_invariant=True)["enabled"]


def test_network_reads_nics_and_rdma_ports_from_sysfs(tmp_path, monkeypatch):
    """A sysfs tree as a RoCE host has it (files as the kernel lays them out): NICs with speed, RDMA ports with
    state, rate and link layer; loopback left out; the inter-node settings named."""
    from tpcomm.topo import network as N

    net, ib = tmp_path / "net", tmp_path / "infiniband"
    for name, typ, speed in (("lo", "772", None), ("ens1f0", "1", "100000"), ("veth0", "1", "-1")):
        d = net / name
        d.mkdir(parents=True)
        (d / "type").write_text(typ + "\n")
        (d / "operstate").write_text("up\n")
        (d / "mtu").write_text("9000\n")
        if speed:
            (d / "speed").write_text(speed + "\n")
    port = ib / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
    (port / "link_layer").write_text("Ethernet\n")
    nics = N.nics(net)
    assert [n["name"] for n in nics] == ["ens1f0", "veth0"]
    assert nics[0]["speed_Mbps"] == 100000 and nics[1]["speed_Mbps"] is None and nics[0]["mtu"] == 9000
    assert N.rdma(ib) == [
        {
            "name": "mlx5_0",
            "ports": [{"port": "1", "state": "4: ACTIVE", "rate": "100 Gb/sec (4X EDR)", "link_layer": "Ethernet"}],
        }
    ]
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ens1f0")
    monkeypatch.setattr(N, "SYS_NET", net)
    monkeypatch.setattr(N, "SYS_IB", ib)
    doc = N.network()
    text = "\n".join(N.format_network({**doc, "nics": N.nics(net), "rdma": N.rdma(ib)}))
    assert "NIC ens1f0: up, 100 Gb/s" in text and "RDMA mlx5_0: port 1 4: ACTIVE" in text
    assert "NCCL_SOCKET_IFNAME=ens1f0" in text
    assert N.nics(tmp_path / "absent") == [] and N.rdma(tmp_path / "absent") == []
