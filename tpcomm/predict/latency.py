"""Collective latency, in order of preference: a probe run directory, a value
the user gives, NCCL's own tuning model (src/graph/tuning.cc) for the link.

Units: time_us (microseconds), bytes per rank per call (plan convention),
bandwidths in GB/s (1e9 B/s).

NCCL model (NCCL's src/graph/tuning.cc; constants in `latency.py` below): time = lat + nBytes / (1000 * algbw);
ring all-reduce lat = base + 2(n-1) * hwLat; all-gather/reduce-scatter
n-1 steps. LL128 only over NVLink; NCCL picks the fastest protocol. Protocol
bandwidth efficiency LL 0.5 (8 of 16 bytes carry data), LL128 120/128,
Simple 1.0, applied to the link's P2P bandwidth as the ring's busbw.
P2P disabled: traffic stages through host memory (NCCL's SHM transport); per ring
step 2.5 us: 8x RTX 4090 (GeForce: no P2P) measured 42.1 us for an 8-byte
all-reduce in nccl-tests (NVIDIA/nccl issue 1530, REFERENCE s7) = 6.6 us base +
14 ring-LL steps x 2.5 us. (A single host-staged copy measured 12-17 us,
REFERENCE s3, but NCCL pipelines the steps of a ring through shared memory: that
figure is the high end of a P2P-off range, NO_P2P_HOP_HIGH_US, in latency_range.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BASE_LAT_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}}
HW_LAT_US = {
    "nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}, "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
    "pcie": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}, "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
}
PROTO_EFF = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
NO_P2P_HOP_US = 2.5
NO_P2P_HOP_HIGH_US = 12.0


def nccl_model_us(op: str, nbytes: float, n: int, link: dict) -> tuple[float, str]:
    """(time_us, protocol/algorithm chosen) for one collective of `nbytes` per rank over n ranks."""
    if n <= 1:
        return 0.0, "none (1 rank)"
    ltype = "nvlink" if link["type"] == "nvlink" else "pcie"
    busbw = float(link.get("nvlink_GBps") or link["p2p_GBps"]) if ltype == "nvlink" else float(link["p2p_GBps"])
    protos = ["LL", "LL128", "Simple"] if ltype == "nvlink" else ["LL", "Simple"]
    best = None
    for algo in ["ring", "tree"] if op == "all_reduce" else ["ring"]:
        for proto in protos:
            hop = HW_LAT_US[ltype][algo][proto]
            if not link.get("p2p", True):
                hop = max(hop, link.get("no_p2p_hop_us", NO_P2P_HOP_US))
            bw = busbw * PROTO_EFF[proto]
            if op == "all_reduce":
                steps = 2 * (n - 1)
                algbw = bw * n / (2 * (n - 1))
                total = nbytes
            elif op in ("all_gather", "reduce_scatter", "gather"):
                steps = n - 1
                algbw = bw * n / (n - 1)
                total = nbytes * n if op != "reduce_scatter" else nbytes
            elif op == "all_to_all":
                steps, algbw, total = n - 1, bw * n / (n - 1), nbytes
            else:  # send_recv: one hop
                steps, algbw, total = 1, bw, nbytes
            t = BASE_LAT_US[algo][proto] + steps * hop + total / (1000.0 * algbw)
            if best is None or t < best[0]:
                best = (t, f"NCCL model {algo}/{proto}")
    return best


@dataclass
class LatencySource:
    """How collective latencies are obtained, and the function that gives them."""

    kind: str  # probe | user | nccl-model
    description: str
    fn: Callable[[str, float, int], float]

    def __call__(self, op: str, nbytes: float, n: int) -> float:
        return self.fn(op, nbytes, n)


def make_source(link: dict, allreduce_us: float | None = None, probe_dir: str | Path | None = None) -> LatencySource:
    if probe_dir is not None:
        from tpcomm.predict.probe_fit import probe_latency

        fn, desc = probe_latency(probe_dir, link)
        return LatencySource("probe", desc, fn)
    if allreduce_us is not None:

        def user(op, nbytes, n):
            if op == "all_reduce":
                return allreduce_us if n > 1 else 0.0
            return nccl_model_us(op, nbytes, n, link)[0]

        return LatencySource(
            "user",
            f"all-reduce {allreduce_us:g} us per call as given (--allreduce-us); other ops from the NCCL model",
            user,
        )
    if link["type"] == "shm":
        from tpcomm.errors import InputError

        raise InputError(
            "--gpu cpu",
            "has no NCCL latency model for shared-memory collectives",
            "--probe RUN_DIR (a tpcomm probe run) or --allreduce-us X",
        )
    hopdesc = "P2P off: host-staged hops" if not link.get("p2p", True) else "P2P on"
    return LatencySource(
        "nccl-model",
        f"NCCL tuning model (tuning.cc) for {link['type'].upper()}, {hopdesc}, busbw {link.get('nvlink_GBps') or link['p2p_GBps']} GB/s",
        lambda op, nbytes, n: nccl_model_us(op, nbytes, n, link)[0],
    )
