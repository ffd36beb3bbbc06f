"""CPU topology from Linux sysfs: what the CPU backends (gloo, vLLM's shared-memory
all-reduce) run on. Memory in GiB."""

from __future__ import annotations

import os
import platform
from pathlib import Path

_NODE_DIR = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    out: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numa_nodes(node_dir: Path = _NODE_DIR) -> list[dict]:
    nodes = []
    for d in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = parse_cpulist((d / "cpulist").read_text())
        except OSError:
            continue
        mem = None
        try:
            for line in (d / "meminfo").read_text().splitlines():
                if "MemTotal" in line:
                    mem = round(int(line.split()[-2]) / 1024**2, 1)
        except (OSError, ValueError, IndexError):
            pass
        nodes.append({"node": int(d.name[4:]), "cpus": cpus, "memory_GiB": mem})
    return nodes


def cpu_topology() -> dict:
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    nodes = numa_nodes()
    threads_per_core = 1
    try:
        sib = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text()
        threads_per_core = max(1, len(parse_cpulist(sib)))
    except OSError:
        pass
    return {
        "model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "threads_per_core": threads_per_core,
        "numa_nodes": nodes or [{"node": 0, "cpus": affinity, "memory_GiB": None}],
        "numa_source": "sysfs" if nodes else "none (no /sys/devices/system/node): one node assumed",
    }
