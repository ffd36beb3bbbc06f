"""The network a multi-node run crosses: this host's NICs (sysfs), its RDMA devices (InfiniBand / RoCE, with
their ports' state and rate) and the settings that choose NCCL's and gloo's inter-node path.

Linux sysfs only, standard library only (`tpcomm topo` runs on a laptop too: without /sys it says so).
Units: speed_Mbps as the kernel reports it (-1 or absent: not reported, e.g. virtual NICs); RDMA rate as its
sysfs text ("200 Gb/sec (4X HDR)").
"""

from __future__ import annotations

import os
from pathlib import Path

SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")
# What picks the inter-node path: NCCL's net plugin, IB/RoCE HCAs, the socket interface; gloo's interface.
NET_ENV = (
    "NCCL_NET",
    "NCCL_NET_PLUGIN",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "NCCL_IB_GID_INDEX",
    "NCCL_SOCKET_IFNAME",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_CROSS_NIC",
    "GLOO_SOCKET_IFNAME",
    "VLLM_HOST_IP",
    "MASTER_ADDR",
)


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def nics(root: Path = SYS_NET) -> list[dict]:
    """Physical and virtual interfaces except loopback: name, state, speed, MTU, driver, PCI address."""
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if _read(d / "type") == "772":  # ARPHRD_LOOPBACK
            continue
        speed = _read(d / "speed")
        dev = d / "device"
        out.append(
            {
                "name": d.name,
                "state": _read(d / "operstate"),
                "speed_Mbps": int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                "mtu": int(_read(d / "mtu") or 0) or None,
                "driver": os.path.basename(os.path.realpath(dev / "driver")) if (dev / "driver").exists() else None,
                "pci": os.path.basename(os.path.realpath(dev)) if dev.exists() else None,
            }
        )
    return out


def rdma(root: Path = SYS_IB) -> list[dict]:
    """RDMA devices (mlx5_0, ...) with each port's state, rate and link layer (InfiniBand or Ethernet = RoCE)."""
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        ports = []
        for p in sorted((d / "ports").iterdir()) if (d / "ports").is_dir() else []:
            ports.append(
                {
                    "port": p.name,
                    "state": _read(p / "state"),
                    "rate": _read(p / "rate"),
                    "link_layer": _read(p / "link_layer"),
                }
            )
        out.append({"name": d.name, "ports": ports})
    return out


def network() -> dict:
    return {
        "nics": nics(),
        "rdma": rdma(),
        "env": {k: os.environ[k] for k in NET_ENV if k in os.environ},
        "note": None if SYS_NET.is_dir() else "no /sys/class/net here: NICs not read",
    }


def format_network(net: dict) -> list[str]:
    out = ["Network (for multi-node runs):"]
    for n in net["nics"]:
        speed = f"{n['speed_Mbps'] / 1000:g} Gb/s" if n["speed_Mbps"] else "speed not reported"
        out.append(f"  NIC {n['name']}: {n['state']}, {speed}, MTU {n['mtu']}, driver {n['driver'] or '-'}")
    for r in net["rdma"]:
        ports = "; ".join(f"port {p['port']} {p['state']} {p['rate']} ({p['link_layer']})" for p in r["ports"])
        out.append(f"  RDMA {r['name']}: {ports or 'no ports'}")
    if not net["rdma"]:
        out.append("  RDMA: none (NCCL's inter-node path would be TCP sockets)")
    env = ", ".join(f"{k}={v}" for k, v in net["env"].items())
    out.append("  inter-node settings: " + (env or "none set (NCCL and gloo pick the interface themselves)"))
    if net.get("note"):
        out.append(f"  ! {net['note']}")
    return out
