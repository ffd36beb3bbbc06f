"""Collective latency as a range: low, central and high, each with its source, for the all-reduce kernel the
engine would pick.

Which kernel: vLLM (>= 0.4) and SGLang run their own custom all-reduce where it is eligible (P2P between all
ranks over NVLink, or exactly 2 PCIe GPUs with P2P: vLLM's custom_all_reduce.py refuses more than two PCIe-only
GPUs, and needs P2P), else NCCL (PyNccl inside the CUDA graph). Message sizes past the custom all-reduce's
buffer go to NCCL too.

- custom all-reduce: central = the system's own in-graph vLLM table at this world size (tables.py) where one
  exists, else the same kernel measured on a reference system (collective_tables.json custom_ar_reference);
  low/high from the reference tables' spread.
- NCCL: central = the system's in-graph vLLM (PyNccl) table, else its nccl-tests table (labelled a back-to-back
  average), else NCCL's tuning model (latency.py); low = the lower of NCCL's model (a floor: the cost model
  NCCL uses to pick an algorithm, not a measurement) and the central value; high = the highest public
  measurement for the link type and world size (tables.py), never below the central value.
A probe run (`--probe`) or a value given with `--allreduce-us` replaces all three: it is this hardware's own
number (an imported nccl-tests table only where the engine would use NCCL: see probe_fit.py). Ops other than
all-reduce have no public table: their NCCL model is scaled by the all-reduce's level/model ratio at the same
bytes (assumption).

`basis="reference"` puts a what-if on the same footing as its baseline: custom all-reduce from the reference
tables, NCCL from its model, on both sides (whatif.py, TP what-ifs).

Units: bytes per rank per call, time_us microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpcomm.predict import tables
from tpcomm.predict.latency import NO_P2P_HOP_HIGH_US, LatencySource, make_source, nccl_model_us

LEVELS = ("low", "central", "high")
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024  # vLLM CustomAllreduce(max_size=8192 * 1024)


@dataclass
class LatencyRange:
    low: LatencySource
    central: LatencySource
    high: LatencySource
    kind: str  # probe | user | table | reference | nccl-model | model | zero ...
    descriptions: dict  # level -> where its value comes from
    kernel: str = ""  # custom-ar | nccl | "" (not an all-reduce choice)

    def level(self, name: str) -> LatencySource:
        return {"low": self.low, "central": self.central, "high": self.high}[name]

    @property
    def fixed(self) -> bool:
        return self.kind in ("probe", "user") or self.low is self.high


def custom_ar_eligible(link: dict, n: int, engine=None) -> bool:
    """Would the engine run its own custom all-reduce for n ranks on this link (decode-size messages)?"""
    if engine is not None and not engine.custom_allreduce:
        return False
    if n <= 1 or not link.get("p2p", True):
        return False
    return link["type"] == "nvlink" or (link["type"] == "pcie" and n == 2)


def make_range(
    hw: dict,
    allreduce_us: float | None = None,
    probe_dir: str | Path | None = None,
    n: int = 8,
    nbytes: float = 14336,
    engine=None,
    basis: str | None = None,
) -> LatencyRange:
    """The range for hardware profile `hw` and `engine`; `n` and `nbytes` (the main all-reduce) pick the kernel
    the descriptions name."""
    link = hw["link"]
    if probe_dir is not None or allreduce_us is not None or link["type"] == "shm":
        src = make_source(link, allreduce_us, probe_dir)
        if probe_dir is not None:
            src = _engine_where_probe_is_nccl_tests(src, hw, engine, probe_dir)
        d = {**{lv: src.description + " (measured or given: no range)" for lv in LEVELS}, "short": src.kind}
        return LatencyRange(src, src, src, src.kind, d)
    # A replaced link (--interconnect) is no longer the system the tables measured.
    system = None if hw.get("interconnect_override") else hw.get("collective_tables")
    ltype, p2p = link["type"], link.get("p2p", True)
    bw = link.get("nvlink_GBps") or link["p2p_GBps"]
    nccl_desc = (
        f"NCCL tuning model (tuning.cc) for {ltype.upper()}, {'P2P on' if p2p else 'P2P off: host-staged hops'}, "
        f"busbw {bw} GB/s"
    )

    def beyond(m):  # growth past the tables' largest size: NCCL's bandwidth model for this link
        return lambda b0, b: nccl_model_us("all_reduce", b, m, link)[0] - nccl_model_us("all_reduce", b0, m, link)[0]

    def nccl(b, m):
        return nccl_model_us("all_reduce", b, m, link)[0]

    def choose(m):
        """(kernel, kind, low fn, central fn, high fn, description) of the all-reduce for m ranks."""
        if custom_ar_eligible(link, m, engine):
            own = None if basis == "reference" else tables.find(system, m, kind="vllm-graph")
            if own and tables.is_custom_ar(own):
                c = lambda b, t=own: tables.table_us(t, b, beyond(m))  # noqa: E731
                ref = tables.custom_ar_reference(ltype)
                lo = lambda b: min(c(b), ref.low(b))  # noqa: E731
                hi = lambda b: max(c(b), ref.high(b) / ref.high_factor)  # noqa: E731
                return "custom-ar", "table", lo, c, hi, tables.describe(own)
            ref = tables.custom_ar_reference(ltype)
            return "custom-ar", "reference", ref.low, ref.central, ref.high, ref.description
        if basis != "reference":
            t = tables.find(system, m)
            if t:
                c = lambda b, t=t: tables.table_us(t, b, beyond(m))  # noqa: E731
                return "nccl", "table", lambda b: min(nccl(b, m), c(b)), c, None, tables.describe(t)
        hi = None
        if not p2p:  # host-staged: 2.5 us per ring step (8x RTX 4090 nccl-tests) up to 12 us (one staged copy)
            slow = {**link, "no_p2p_hop_us": NO_P2P_HOP_HIGH_US}
            hi = lambda b: nccl_model_us("all_reduce", b, m, slow)[0]  # noqa: E731
        desc = f"{nccl_desc} (no measured table for this hardware and world size)"
        return "nccl", "nccl-model", lambda b: nccl(b, m), lambda b: nccl(b, m), hi, desc

    def ar(level):
        def fn(b, m):
            kernel, _, lo, c, hi, _ = choose(m)
            if b > CUSTOM_AR_MAX_BYTES and kernel == "custom-ar":
                return nccl(b, m)
            if level == "low":
                return lo(b)
            if level == "central":
                return c(b)
            if hi is not None:
                return hi(b)
            pub = tables.public_high_us(ltype, m, b, beyond(m)) if p2p else None  # public figures: P2P-on boxes
            return max(c(b), pub[0] if pub else 0.0)

        return fn

    def level_fn(level):
        arf = ar(level)

        def fn(op, b, m):
            if m <= 1:
                return 0.0
            if op == "all_reduce":
                return arf(b, m)
            base = nccl(b, m)
            return nccl_model_us(op, b, m, link)[0] * (arf(b, m) / base if base > 0 else 1.0)

        return fn

    kernel, kind, _, _, hi, central_desc = choose(n)
    if kind == "table" and kernel == "nccl":
        central_desc += ", linear in bytes between its sizes, NCCL-model growth beyond 128 KiB"
    pub = tables.public_high_us(ltype, n, nbytes) if p2p else None
    if kernel == "custom-ar":
        low_desc = f"lowest in-graph custom all-reduce table at each size ({tables.custom_ar_reference(ltype).systems})"
        high_desc = (
            "the reference tables' spread (custom all-reduce)"
            if kind == "table"
            else f"{tables.custom_ar_reference(ltype).high_factor:g}x the higher reference table (assumption)"
        )
    elif not p2p and kind == "nccl-model":
        low_desc = f"{nccl_desc}: 2.5 us per ring step, solved from 8x RTX 4090 nccl-tests (42.1 us at 8 B)"
        high_desc = f"the same with {NO_P2P_HOP_HIGH_US:g} us per ring step: one host-staged copy (REFERENCE s3)"
    else:
        low_desc = f"lower bound: {nccl_desc}" + (
            " (or the measured table where that is lower)" if kind == "table" else ""
        )
        high_desc = (
            f"highest public measurement for {ltype.upper()} x{n} at each size (at {nbytes:.0f} B: {pub[0]:.1f} us, {pub[1]})"
            if pub
            else "no public measurement for this link and world size: high = central"
        )
    desc = {"low": low_desc, "central": central_desc, "high": high_desc, "kernel": kernel}
    desc["short"] = f"{'custom all-reduce' if kernel == 'custom-ar' else 'NCCL'}: " + (
        f"measured table {system} x{n}"
        if kind == "table"
        else "reference tables"
        if kind == "reference"
        else "NCCL model (no measured table)"
    )
    return LatencyRange(
        LatencySource("low", desc["low"], level_fn("low")),
        LatencySource(kind, desc["central"], level_fn("central")),
        LatencySource("high", desc["high"], level_fn("high")),
        kind,
        desc,
        kernel,
    )


def _engine_where_probe_is_nccl_tests(src: LatencySource, hw: dict, engine, probe_dir) -> LatencySource:
    """An imported nccl-tests table (back-to-back averages of NCCL) stands only where the engine would use NCCL;
    where it would run its custom all-reduce, the engine's own in-graph table is used instead, and said."""
    from tpcomm.predict.probe_fit import imported_nccl_tests_only

    if not imported_nccl_tests_only(probe_dir):
        return src
    link = hw["link"]
    engine_range = make_range({**hw, "link": link}, engine=engine)  # the profile's tables for the custom AR parts

    def fn(op, b, n):
        if op == "all_reduce" and custom_ar_eligible(link, n, engine) and b <= CUSTOM_AR_MAX_BYTES:
            return engine_range.central(op, b, n)
        return src(op, b, n)

    desc = (
        f"{src.description}; where the engine runs its custom all-reduce (P2P over NVLink, or 2 PCIe GPUs) the "
        f"engine's in-graph figure instead ({engine_range.descriptions['central']})"
    )
    return LatencySource(src.kind, desc, fn)
