"""NVIDIA GPUs through NVML (nvidia-ml-py): PCIe link, P2P, NVLink, NUMA/CPU
affinity. `read_gpus()` returns None when there is no driver, with the reason.

PCIe bandwidth per direction for x16 (GB/s): Gen3 ~15.8, Gen4 ~31.5, Gen5 ~63.
"""

from __future__ import annotations

# nvmlDeviceGetTopologyCommonAncestor levels, as `nvidia-smi topo -m` names them
_TOPO_NAMES = {
    0: "internal",
    10: "PIX (same PCIe switch)",
    20: "PXB (several PCIe switches)",
    30: "PHB (same host bridge)",
    40: "NODE (same NUMA node, across host bridges)",
    50: "SYS (across NUMA nodes / SMP interconnect)",
}


def _safe(fn, *a, default=None):
    """An NVML query that may be unsupported on this GPU/driver: its NVMLError -> default. Any other
    exception (a wrong argument type, a bug here) propagates: swallowing it once made every P2P cell False."""
    import pynvml as nv

    try:
        v = fn(*a)
    except nv.NVMLError:
        return default
    return v.decode() if isinstance(v, bytes) else v


def caps_index(name: str) -> int:
    """nvidia-ml-py defines some NVML_P2P_CAPS_INDEX_* as 1-tuples, e.g. `NVML_P2P_CAPS_INDEX_READ = 0,`;
    nvmlDeviceGetP2PStatus needs the integer."""
    import pynvml as nv

    v = getattr(nv, f"NVML_P2P_CAPS_INDEX_{name}")
    return int(v[0] if isinstance(v, tuple) else v)


def _affinity_cpus(nv, h, ncpus: int) -> list[int] | None:
    words = (ncpus + 63) // 64
    masks = _safe(nv.nvmlDeviceGetCpuAffinity, h, words)
    if masks is None:
        return None
    return [w * 64 + b for w, m in enumerate(masks) for b in range(64) if (m >> b) & 1 and w * 64 + b < ncpus]


def read_gpus(ncpus: int = 1) -> tuple[dict | None, str | None]:
    """({driver, gpus, p2p, nvlink_p2p, topology}, None) or (None, why not)."""
    try:
        import pynvml as nv
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001
        return None, f"no NVIDIA driver (NVML init failed: {e})"
    # Everything below touches only NVML (driver-level): no CUDA context, safe before vLLM forks.
    try:
        n = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        gpus = []
        for i, h in enumerate(handles):
            cc = _safe(nv.nvmlDeviceGetCudaComputeCapability, h)
            g = {
                "index": i,
                "name": _safe(nv.nvmlDeviceGetName, h),
                "uuid": _safe(nv.nvmlDeviceGetUUID, h),
                "pci_bus_id": _safe(lambda x: nv.nvmlDeviceGetPciInfo(x).busId, h),
                "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
                "memory_GiB": _safe(lambda x: round(nv.nvmlDeviceGetMemoryInfo(x).total / 1024**3, 1), h),
                "pcie": {
                    "gen_current": _safe(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    "gen_max": _safe(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                    "width_current": _safe(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
                    "width_max": _safe(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
                },
                "numa_node": _safe(getattr(nv, "nvmlDeviceGetNumaNodeId", lambda x: None), h),
                "cpu_affinity": _affinity_cpus(nv, h, ncpus),
                "nvlinks_up": sum(
                    1
                    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
                    if _safe(nv.nvmlDeviceGetNvLinkState, h, link) == 1
                ),
            }
            p = g["pcie"]
            flags = []
            if p["width_current"] and p["width_max"] and p["width_current"] < p["width_max"]:
                flags.append(f"PCIe link trained down to x{p['width_current']} (max x{p['width_max']})")
            if p["gen_current"] and p["gen_max"] and p["gen_current"] < p["gen_max"]:
                flags.append(
                    f"PCIe Gen{p['gen_current']} now, Gen{p['gen_max']} max (idle GPUs drop the link speed; "
                    "recheck under load)"
                )
            g["flags"] = flags
            gpus.append(g)
        ok = getattr(nv, "NVML_P2P_STATUS_OK", 0)
        read, nvlink = caps_index("READ"), caps_index("NVLINK")
        p2p = [
            [i == j or _safe(nv.nvmlDeviceGetP2PStatus, a, b, read) == ok for j, b in enumerate(handles)]
            for i, a in enumerate(handles)
        ]
        nvl = [
            [i == j or _safe(nv.nvmlDeviceGetP2PStatus, a, b, nvlink) == ok for j, b in enumerate(handles)]
            for i, a in enumerate(handles)
        ]
        topo = [
            [
                _TOPO_NAMES.get(_safe(nv.nvmlDeviceGetTopologyCommonAncestor, a, b), "?") if i != j else "X"
                for j, b in enumerate(handles)
            ]
            for i, a in enumerate(handles)
        ]
        return {
            "driver": _safe(nv.nvmlSystemGetDriverVersion),
            "gpus": gpus,
            "p2p_read": p2p,
            "nvlink_p2p": nvl,
            "topology": topo,
        }, None
    finally:
        _safe(nv.nvmlShutdown)
