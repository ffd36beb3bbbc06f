"""topo.json (written by `tpcomm topo`) as the report's tables and findings.

A finding with a `lever` becomes a row of the verdict's lever table; `what_if`
names the `tpcomm predict` what-if that sizes its effect.
"""

from __future__ import annotations

from typing import Any

from tpcomm.judge.levers import ONE_SHOT_PATHS
from tpcomm.rundir.documents import Topo


def topo_summary(topo: Topo | None) -> dict[str, Any]:
    """topo.json (tpcomm topo) as tables and findings: GPUs, P2P, NCCL/vLLM settings, vLLM's all-reduce paths."""
    if not topo:
        return {}
    gpu = topo.gpu or {}
    cpu = topo.cpu or {}
    gpus, findings = [], []
    for g in gpu.get("gpus") or []:
        p = g.get("pcie") or {}
        gpus.append(
            {
                "index": g.get("index"),
                "name": g.get("name"),
                "cc": g.get("compute_capability"),
                "pci_bus_id": g.get("pci_bus_id"),
                "numa_node": g.get("numa_node"),
                "pcie": f"Gen{p.get('gen_current')} x{p.get('width_current')} (max Gen{p.get('gen_max')} x{p.get('width_max')})"
                if p
                else "",
                "nvlinks_up": g.get("nvlinks_up"),
            }
        )
        findings += [{"text": f"GPU {g.get('index')}: {f}", "severity": "warning"} for f in g.get("flags") or []]
    p2p = gpu.get("p2p_read")
    if p2p:
        bad = [(i, j) for i, row in enumerate(p2p) for j, ok in enumerate(row) if i < j and not ok]
        if bad:
            findings.append(
                {
                    "text": f"GPU P2P read unavailable for {len(bad)} GPU pair(s), e.g. {bad[0][0]}-{bad[0][1]}: NCCL stages "
                    "through host memory and vLLM's custom all-reduce is off",
                    "severity": "problem",
                    "lever": "enable P2P (IOMMU/ACS settings, driver), then rerun tpcomm topo",
                    "what_if": "p2p-disabled",
                }
            )
    paths = (topo.vllm or {}).get("allreduce_paths") or []
    for pth in paths:
        if pth.get("lever") and not pth.get("eligible"):
            findings.append(
                {
                    "text": f"vLLM all-reduce path {pth['path']}: {pth.get('why', '')}",
                    "severity": "opt-in",
                    "lever": pth["lever"],
                    "what_if": "one-shot-allreduce" if pth["path"] in ONE_SHOT_PATHS else None,
                }
            )
    env = {k: v for k, v in (topo.env or {}).items() if v is not None}
    scalars = {"summary": topo.summary}
    if topo.gpu_absent_reason:
        scalars["GPUs"] = topo.gpu_absent_reason
    if cpu:
        scalars["CPU"] = (
            f"{cpu.get('model')}, {cpu.get('logical_cpus')} logical CPUs, {len(cpu.get('numa_nodes') or [])} NUMA node(s)"
        )
    if gpu.get("driver"):
        scalars["driver"] = gpu["driver"]
    return {
        "gpus": gpus,
        "findings": findings,
        "paths": paths,
        "topology": gpu.get("topology"),
        "p2p_read": p2p,
        "nccl_env": env,
        "scalars": {k: v for k, v in scalars.items() if v},
        "platform": (topo.vllm or {}).get("platform"),
    }
