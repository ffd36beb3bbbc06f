"""Collective latency as a range: low, central and high, each with its source.

- low: the lower of NCCL's tuning model (a floor: the cost model NCCL uses to
  pick an algorithm, not a measurement) and the central value (vLLM's custom
  all-reduce beats NCCL on NVLink, so NCCL's model is not a floor for it).
- central: the measured table of the hardware (tables.py) where the profile
  names one and the world size is in it, else the NCCL model.
- high: the highest public measurement for the link type and world size
  (tables.py), never below the central value.
A probe run (`--probe`, also `tpcomm probe import` of nccl-tests output) or a
value given with `--allreduce-us` replaces all three: it is this hardware's
own number. Ops other than all-reduce have no public table: their NCCL model is
scaled by the all-reduce's level/model ratio at the same bytes (assumption).

Units: bytes per rank per call, time_us microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpcomm.predict import tables
from tpcomm.predict.latency import LatencySource, make_source, nccl_model_us

LEVELS = ("low", "central", "high")


@dataclass
class LatencyRange:
    low: LatencySource
    central: LatencySource
    high: LatencySource
    kind: str  # probe | user | table | nccl-model
    descriptions: dict  # level -> where its value comes from

    def level(self, name: str) -> LatencySource:
        return {"low": self.low, "central": self.central, "high": self.high}[name]

    @property
    def fixed(self) -> bool:
        return self.kind in ("probe", "user")


def make_range(
    hw: dict, allreduce_us: float | None = None, probe_dir: str | Path | None = None, n: int = 8, nbytes: float = 14336
) -> LatencyRange:
    """The range for hardware profile `hw`; `n` and `nbytes` (the main all-reduce) only shape the descriptions."""
    link = hw["link"]
    if probe_dir is not None or allreduce_us is not None or link["type"] == "shm":
        src = make_source(link, allreduce_us, probe_dir)
        d = {**{lv: src.description + " (measured or given: no range)" for lv in LEVELS}, "short": src.kind}
        return LatencyRange(src, src, src, src.kind, d)
    # A replaced link (--interconnect) is no longer the system the tables measured.
    system = None if hw.get("interconnect_override") else hw.get("collective_tables")
    ltype = link["type"]
    p2p = link.get("p2p", True)

    def beyond(m):  # growth past the tables' largest size: NCCL's bandwidth model for this link
        return lambda b0, b: nccl_model_us("all_reduce", b, m, link)[0] - nccl_model_us("all_reduce", b0, m, link)[0]

    def ar_central(b, m):
        t = tables.find(system, m)
        return tables.table_us(t, b, beyond(m)) if t else nccl_model_us("all_reduce", b, m, link)[0]

    def ar_low(b, m):
        return min(nccl_model_us("all_reduce", b, m, link)[0], ar_central(b, m))

    def ar_high(b, m):
        pub = tables.public_high_us(ltype, m, b, beyond(m)) if p2p else None  # public figures are P2P-on boxes
        return max(ar_central(b, m), pub[0] if pub else 0.0)

    def level_fn(ar):
        def fn(op, b, m):
            if m <= 1:
                return 0.0
            if op == "all_reduce":
                return ar(b, m)
            base = nccl_model_us("all_reduce", b, m, link)[0]
            return nccl_model_us(op, b, m, link)[0] * (ar(b, m) / base if base > 0 else 1.0)

        return fn

    t = tables.find(system, n)
    nccl_desc = (
        f"NCCL tuning model (tuning.cc) for {ltype.upper()}, {'P2P on' if p2p else 'P2P off: host-staged hops'}, "
        f"busbw {link.get('nvlink_GBps') or link['p2p_GBps']} GB/s"
    )
    central_desc = (
        (tables.describe(t) + ", linear in bytes between its sizes, NCCL-model growth beyond 128 KiB")
        if t
        else f"{nccl_desc} (no measured table for this hardware and world size)"
    )
    pub = tables.public_high_us(ltype, n, nbytes) if p2p else None
    desc = {
        "low": f"lower bound: {nccl_desc}" + (" (or the measured table where that is lower)" if t else ""),
        "central": central_desc,
        "high": (
            f"highest public measurement for {ltype.upper()} x{n} at each size (at {nbytes:.0f} B: {pub[0]:.1f} us, {pub[1]})"
            if pub
            else "no public measurement for this link and world size: high = central"
        ),
    }
    desc["short"] = f"measured table {system} x{n} ({t['kind']})" if t else "NCCL model (no measured table)"
    kind = "table" if t else "nccl-model"
    return LatencyRange(
        LatencySource("nccl-model", desc["low"], level_fn(ar_low)),
        LatencySource(kind, desc["central"], level_fn(ar_central)),
        LatencySource("public-high", desc["high"], level_fn(ar_high)),
        kind,
        desc,
    )
