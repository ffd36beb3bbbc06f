"""NVIDIA GPUs through NVML (nvidia-ml-py): PCIe link, P2P, NVLink, NUMA/CPU
affinity. `read_gpus()` returns None when there is no driver, with the reason.

PCIe bandwidth per direction for x16 (GB/s): Gen3 ~15.8, Gen4 ~31.5, Gen5 ~63.
"""

from __future__ import annotations

import os
from collections.abc import Callable

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


def visible_indices(
    cvd: str | None, uuids: list[str | None], mig_parent: Callable[[str], int | None] | None = None
) -> tuple[list[int], str | None]:
    """NVML indices of the GPUs CUDA shows under CUDA_VISIBLE_DEVICES `cvd`, in CUDA's order, and a note.

    CUDA's rules as PyTorch mirrors them (torch/cuda/__init__.py `_parse_visible_devices`,
    `_transform_uuid_to_ordinals`, `_device_count_nvml`): the first entry fixes the list's type. A
    list that starts with "GPU-" (or "MIG-") holds UUIDs and ends at the first entry without that
    prefix; each is a case-sensitive prefix of one GPU's UUID, and parsing stops at one that matches
    none or several. Otherwise entries are ordinals read like strtoul ("1gpu2" is 1), parsing stops at
    one that has no leading number, and the list is cut at the first ordinal past the last GPU. A
    repeated entry (or two UUIDs of one GPU) hides every GPU; so does an empty value; unset shows
    all. Ordinals are taken in NVML's (PCI bus) order, which is CUDA's with
    CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs. "MIG-..." entries are mapped to their parent GPU
    through `mig_parent` (NVML; PyTorch does not parse them), several instances of one GPU giving the
    GPU once; one that cannot be mapped ends the list."""
    n = len(uuids)
    if cvd is None:
        return list(range(n)), None
    if not cvd.strip():
        return [], "CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU"
    stop = None
    if cvd.startswith(("GPU-", "MIG-")):
        prefix, entries = cvd[:4], []
        for e in cvd.split(","):
            if e in entries:
                return [], f"CUDA_VISIBLE_DEVICES={cvd!r}: {e!r} is repeated, so CUDA sees no GPU"
            if not e.startswith(prefix):
                stop = f"{e!r} is not a {prefix} UUID like the first entry"
                break
            entries.append(e)
        out: list[int] = []
        for e in entries:
            if prefix == "MIG-":
                idx = mig_parent(e) if mig_parent is not None else None
                if idx is None:
                    stop = f"{e!r} names no MIG instance NVML can map to a GPU"
                    break
                if idx not in out:
                    out.append(idx)
                continue
            hits = [i for i, u in enumerate(uuids) if u and u.startswith(e)]
            if len(hits) != 1:
                stop = f"{e!r} matches {'no' if not hits else 'more than one'} GPU UUID (case-sensitive prefix)"
                break
            if hits[0] in out:
                return [], f"CUDA_VISIBLE_DEVICES={cvd!r}: {e!r} names a GPU already listed, so CUDA sees no GPU"
            out.append(hits[0])
    else:
        out = []
        for e in cvd.split(","):
            x = _strtoul(e.strip())
            if x in out:
                return [], f"CUDA_VISIBLE_DEVICES={cvd!r}: ordinal {x} is repeated, so CUDA sees no GPU"
            if x < 0:
                stop = f"{e!r} does not start with an ordinal"
                break
            out.append(x)
        for i, x in enumerate(out):
            if x >= n:
                out, stop = out[:i], f"ordinal {x} is past the last of {n} GPU(s)"
                break
    note = f"CUDA_VISIBLE_DEVICES={cvd!r}: {stop}; CUDA ignores it and the rest" if stop else None
    return out, note


def _strtoul(s: str) -> int:
    """PyTorch's `_strtoul` (torch/cuda/__init__.py): the number a string starts with, or -1."""
    if not s:
        return -1
    idx = 0
    for idx, c in enumerate(s):
        if not (c.isdigit() or (idx == 0 and c in "+-")):
            break
        if idx + 1 == len(s):
            idx += 1
    try:
        return int(s[:idx]) if idx > 0 else -1
    except ValueError:  # a lone sign
        return -1


def _mig_parent(nv, uuid: str) -> int | None:
    try:
        h = nv.nvmlDeviceGetHandleByUUID(uuid)
        return int(nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)))
    except Exception:  # noqa: BLE001 - no MIG support in this driver/binding: like an unknown UUID
        return None


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
        all_handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        # The GPUs vLLM would get: those CUDA_VISIBLE_DEVICES names, in its order (`index` = CUDA ordinal).
        order, visible_note = visible_indices(
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            [_safe(nv.nvmlDeviceGetUUID, h) for h in all_handles],
            lambda u: _mig_parent(nv, u),
        )
        handles = [all_handles[i] for i in order]
        gpus = []
        for i, h in enumerate(handles):
            cc = _safe(nv.nvmlDeviceGetCudaComputeCapability, h)
            g = {
                "index": i,
                "nvml_index": order[i],
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
            "nvml_gpu_count": n,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "visible_note": visible_note,
        }, None
    finally:
        _safe(nv.nvmlShutdown)
