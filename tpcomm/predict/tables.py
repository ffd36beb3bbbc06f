"""Measured all-reduce latency tables shipped as data (data/collective_tables.json).

The tables (each entry names its source in data/collective_tables.json):
nccl-tests and vLLM's own all-reduce inside a CUDA graph, per system and world
size, from NVIDIA's AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0),
plus single public measurements (nccl-tests issues, sglang and vLLM PRs). They give the central
collective latency of a hardware profile that names a system
(`collective_tables` in the profile) and the high end for its link type and
world size.

Interpolation over message size is linear in bytes between measured sizes: a
piecewise latency + bytes/bandwidth model, the same shape as the probe's fit.
Below the smallest size the first value holds (latency-bound). Above the
largest (128 KiB: batch > 9 at hidden 7168) the caller's `beyond(b_last, b)`
adds the growth of a bandwidth model (latency_range.py: NCCL's model for the
link), because the last measured segment often spans a protocol switch
(LL -> Simple) and its slope would overstate large messages several times.

Units: bytes per rank per call, time_us microseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

# vLLM decode replays collectives inside CUDA graphs: its own in-graph measurement is the better central value.
KIND_PREFERENCE = ("vllm-graph", "nccl-tests")


@lru_cache(maxsize=1)
def data() -> dict:
    return json.loads(resources.files("tpcomm.predict").joinpath("data", "collective_tables.json").read_text())


def interpolate(sizes: list[float], times: list[float], nbytes: float) -> float:
    """Piecewise-linear in bytes; flat below the first size, last slope beyond the last."""
    if nbytes <= sizes[0]:
        return float(times[0])
    for (b0, t0), (b1, t1) in zip(zip(sizes, times), zip(sizes[1:], times[1:])):
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = (sizes[-2], times[-2]), (sizes[-1], times[-1])
    return t1 + max(t1 - t0, 0.0) * (nbytes - b1) / (b1 - b0)


def find(system: str | None, world_size: int, kind: str | None = None) -> dict | None:
    """The measured table for `system` at `world_size` (vLLM in-graph first unless `kind` is given)."""
    if not system:
        return None
    tabs = [t for t in data()["tables"] if t["system"] == system and t["world_size"] == world_size]
    for k in [kind] if kind else KIND_PREFERENCE:
        for t in tabs:
            if t["kind"] == k:
                return t
    return None


def table_us(table: dict, nbytes: float, beyond=None) -> float:
    sizes = data()["sizes_bytes"]
    if beyond is not None and nbytes > sizes[-1]:
        return float(table["time_us"][-1]) + beyond(sizes[-1], nbytes)
    return interpolate(sizes, table["time_us"], nbytes)


def describe(table: dict) -> str:
    what = {
        "vllm-graph": "vLLM all-reduce inside a CUDA graph",
        "nccl-tests": "nccl-tests all_reduce_perf, a back-to-back average per call (pipelined, not an isolated call)",
    }[table["kind"]]
    return f"measured table {table['system']} x{table['world_size']}: {what}, {table['version']} (AIConfigurator, REFERENCE s7)"


def is_custom_ar(table: dict) -> bool:
    return table["kind"] == "vllm-graph" and "custom all-reduce" in table["version"]


@dataclass
class Reference:
    """vLLM's custom all-reduce measured on reference systems, standing for the same kernel elsewhere."""

    systems: str
    high_factor: float
    description: str
    tabs: list

    def _at(self, b: float) -> list[float]:
        return [table_us(t, b) for t in self.tabs]

    def low(self, b: float) -> float:
        return min(self._at(b))

    def central(self, b: float) -> float:
        return self._at(b)[0]

    def high(self, b: float) -> float:
        return self.high_factor * max(self._at(b))


def custom_ar_reference(link_type: str) -> Reference:
    ref = data()["custom_ar_reference"]["nvlink" if link_type == "nvlink" else "pcie"]
    tabs = [find(s, ref["world_size"], kind="vllm-graph") for s in ref["systems"]]
    systems = ", ".join(f"{s} x{ref['world_size']}" for s in ref["systems"])
    return Reference(
        systems, ref["high_factor"], f"no custom all-reduce table for this system and world size: {ref['note']}", tabs
    )


def oneshot_4rank_us(nbytes: float, n: int) -> tuple[float, float, float]:
    """A one-shot P2P all-reduce over PCIe from the measured 4-rank figures (low, central, high): each rank reads
    its n-1 peers, so the part above the smallest size's time scales by (n-1)/3 from the 4-rank measurement.
    Central: 4x RTX PRO 6000; low/high: the lower/higher of it and 4x V100 (collective_tables.json)."""
    vals = []
    for f in data()["oneshot_4rank"]:
        t4 = interpolate(f["bytes"], f["time_us"], nbytes)
        base = f["time_us"][0]
        vals.append(base + (t4 - base) * (n - 1) / 3)
    return min(vals), vals[0], max(vals)


def public_high_us(link_type: str, world_size: int, nbytes: float, beyond=None) -> tuple[float, str] | None:
    """The highest public all-reduce measurement for this link type and world size at `nbytes`.

    Every table of that link and world size counts (interpolated); a single public point counts for
    sizes within `point_span` x of its own. None when nothing public covers it."""
    d = data()
    best: tuple[float, str] | None = None
    for t in d["tables"]:
        if t["link"] == link_type and t["world_size"] == world_size:
            v = table_us(t, nbytes, beyond)
            if best is None or v > best[0]:
                best = (v, f"{t['system']} x{t['world_size']} {t['kind']} ({t['version']})")
    span = d["point_span"]
    for p in d["public_points"]:
        if (
            p["link"] == link_type
            and p["world_size"] == world_size
            and p["bytes"] / span <= nbytes <= p["bytes"] * span
        ):
            if best is None or p["time_us"] > best[0]:
                best = (p["time_us"], f"{p['source']}: {p['time_us']:g} us at {p['bytes']} B")
    return best
