"""`tpcomm topo` as a library: collect_topology() -> the topo.json document,
format_topology(doc) -> text."""

from __future__ import annotations

import importlib.util
import os

from tpcomm import backends
from tpcomm.topo.cpu import cpu_topology
from tpcomm.topo.nvml import read_gpus
from tpcomm.topo.rules import cpu_paths, gpu_paths, vllm_tables

# Environment that changes NCCL's or vLLM's choice of path.
NCCL_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_PROTO",
    "NCCL_ALGO",
    "NCCL_SHM_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_TOPO_FILE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_NVLS_ENABLE",
    "NCCL_CUMEM_ENABLE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
)
# Besides each all-reduce backend's own switches (tpcomm/backends/*.json "switches").
VLLM_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "VLLM_SKIP_P2P_CHECK",
    "VLLM_BATCH_INVARIANT",
    "VLLM_HAS_FLASHINFER_CUBIN",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_KVCACHE_SPACE",
    "OMP_NUM_THREADS",
) + backends.switches()


from tpcomm.topo.network import format_network, network  # noqa: E402


def environment() -> dict:
    env = {k: os.environ.get(k) for k in NCCL_ENV + VLLM_ENV}
    env.update({k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    return env


def collect_topology(tp: int | None = None) -> dict:
    """Everything `tpcomm topo` knows; GPU parts are None without an NVIDIA driver."""
    cpu = cpu_topology()
    gpu, why_not = read_gpus(cpu["logical_cpus"] or 1)
    vllm_installed = importlib.util.find_spec("vllm") is not None
    doc = {
        "cpu": cpu,
        "gpu": gpu,
        "gpu_absent_reason": why_not,
        "env": environment(),
        "vllm_installed": vllm_installed,
        "network": network(),
    }
    if gpu and gpu["gpus"]:
        n = tp or len(gpu["gpus"])
        tables = vllm_tables()
        doc["vllm"] = {
            "tp": n,
            "platform": "cuda",
            "allreduce_paths": gpu_paths(gpu, n, tables),
            "tables_source": tables["source"],
        }
        names = sorted({g["name"] for g in gpu["gpus"]})
        link = "NVLink" if all(all(r) for r in gpu["nvlink_p2p"]) else "PCIe"
        doc["summary"] = f"{len(gpu['gpus'])}x {', '.join(names)} ({link}), driver {gpu['driver']}"
    else:
        n = tp or 2
        doc["vllm"] = {"tp": n, "platform": "cpu", "allreduce_paths": cpu_paths(n, vllm_installed)}
        doc["summary"] = (
            f"CPU only: {cpu['model']}, {cpu['logical_cpus']} logical CPUs, {len(cpu['numa_nodes'])} NUMA node(s)"
        )
    return doc


def _cpus(c: list[int] | None) -> str:
    if not c:
        return "?"
    runs, start = [], c[0]
    for a, b in zip(c, c[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ",".join(runs)


def _nvml_tag(g: dict) -> str:
    n = g.get("nvml_index", g["index"])
    return "" if n == g["index"] else f" [{n}]"


def format_topology(doc: dict) -> str:
    out = [f"# {doc['summary']}"]
    cpu = doc["cpu"]
    if doc["gpu"] is None:
        out.append(
            f"No NVIDIA GPU: {doc['gpu_absent_reason']}. The CPU backends (gloo, vLLM's shared-memory all-reduce) run on:"
        )
    out.append(
        f"CPU  {cpu['model']}: {cpu['logical_cpus']} logical CPUs ({cpu['threads_per_core']} per core), "
        f"usable {_cpus(cpu['usable_cpus'])}"
    )
    for nd in cpu["numa_nodes"]:
        mem = f", {nd['memory_GiB']} GiB" if nd.get("memory_GiB") is not None else ""
        out.append(f"  NUMA node {nd['node']}: CPUs {_cpus(nd['cpus'])}{mem}")
    gpu = doc["gpu"]
    if gpu:
        out.append(f"GPUs (driver {gpu['driver']}):")
        if gpu.get("cuda_visible_devices") is not None:
            out.append(
                f"  CUDA_VISIBLE_DEVICES={gpu['cuda_visible_devices']}: {len(gpu['gpus'])} of "
                f"{gpu.get('nvml_gpu_count')} GPUs, numbered as CUDA numbers them (NVML index in brackets)"
            )
        if gpu.get("visible_note"):
            out.append(f"  ! {gpu['visible_note']}")
        for g in gpu["gpus"]:
            p = g["pcie"]
            out.append(
                f"  GPU{g['index']}{_nvml_tag(g)} {g['name']} SM {g['compute_capability']} {g['memory_GiB']} GiB  {g['pci_bus_id']}  "
                f"PCIe Gen{p['gen_current']}/{p['gen_max']} x{p['width_current']}/{p['width_max']} (now/max)  "
                f"NVLinks up {g['nvlinks_up']}  NUMA {g['numa_node']}  CPUs {_cpus(g['cpu_affinity'])}"
            )
            for f in g["flags"]:
                out.append(f"    ! {f}")
        n = len(gpu["gpus"])
        out.append("Link between GPUs (NVML common ancestor; * = NVLink P2P, - = no P2P):")
        out.append("        " + " ".join(f"GPU{j:<4}" for j in range(n)))
        for i in range(n):
            cells = []
            for j in range(n):
                t = gpu["topology"][i][j].split(" ")[0]
                mark = (
                    "*" if i != j and gpu["nvlink_p2p"][i][j] else ("-" if i != j and not gpu["p2p_read"][i][j] else "")
                )
                cells.append(f"{t + mark:<8}")
            out.append(f"  GPU{i:<3} " + " ".join(cells))
    v = doc["vllm"]
    out.append(f"What vLLM would use for all-reduce at TP={v['tp']} ({v['platform']}; in vLLM's order):")
    for p in v["allreduce_paths"]:
        out.append(
            f"  {'yes' if p['eligible'] else 'no ':3} {p['path']:<20} {p['why']}"
            + (f"  [lever: {p['lever']}]" if p.get("lever") else "")
        )
    if doc.get("network"):
        out += format_network(doc["network"])
    set_env = {k: val for k, val in doc["env"].items() if val is not None}
    out.append(
        "Environment that changes NCCL/vLLM choices: "
        + (", ".join(f"{k}={val}" for k, val in set_env.items()) or "none set (defaults)")
    )
    return "\n".join(out)
