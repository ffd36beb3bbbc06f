"""Single-stream what-ifs, each a range over the same uncertain inputs as the
baseline (ranges.py): another link, a one-shot all-reduce, P2P off, free
collectives, another TP size. A what-if's change is computed corner by corner
against the baseline at the same corner, so `delta_pct_range` says whether it
helps over the whole range or only somewhere in it.

Units: tok/s, ms per token, percent.
"""

from __future__ import annotations

from dataclasses import replace

from tpcomm.errors import InputError
from tpcomm.plan import Plan
from tpcomm.predict import plan_for, tables
from tpcomm.predict.hardware import with_interconnect
from tpcomm.predict.latency import LatencySource, oneshot_allreduce_us
from tpcomm.predict.latency_range import LatencyRange, make_range
from tpcomm.predict.model import fits_memory
from tpcomm.predict.ranges import evaluate


def _fixed(src: LatencySource, desc: str, high: LatencySource | None = None) -> LatencyRange:
    h = high or src
    return LatencyRange(src, src, h, src.kind, {"low": desc, "central": desc, "high": h.description, "short": desc})


def what_ifs(model, plan: Plan, hw, k, ri, base: tuple[dict, list[dict]]) -> list[dict]:
    """Each what-if is the baseline's Layout (plan.layout) with one thing changed."""
    out: list[dict] = []
    layout = plan.layout
    base_c, base_cs = base

    def entry(name, desc, plan_, hw_, lat: LatencyRange, **extra):
        c, cs = evaluate(plan_, 1, hw_, ri, k, lat_override=lat)
        deltas = [100 * (x["tok_per_s"] / b["tok_per_s"] - 1) for x, b in zip(cs, base_cs)]
        out.append(
            {
                "name": name,
                "description": desc,
                "tok_per_s": c["tok_per_s"],
                "ms_per_token": c["step_ms"],
                "delta_pct": 100 * (c["tok_per_s"] / base_c["tok_per_s"] - 1),
                "breakdown_ms": c["breakdown_ms"],
                "tok_per_s_range": {
                    "low": min(x["tok_per_s"] for x in cs + [{"tok_per_s": c["tok_per_s"]}]),
                    "central": c["tok_per_s"],
                    "high": max(x["tok_per_s"] for x in cs + [{"tok_per_s": c["tok_per_s"]}]),
                },
                "delta_pct_range": {"low": min(deltas), "high": max(deltas)},
                "collective_latency": lat.descriptions,
                **extra,
            }
        )

    link = hw["link"]
    n = layout.tp
    if link["type"] == "pcie":
        nv = {**with_interconnect(hw, "nvlink4"), "collective_tables": "h100_sxm"}
        nv.pop("interconnect_override", None)  # NVLink4 as measured on 8x H100 SXM: those tables apply
        lat = make_range(nv, n=n)
        entry(
            "nvlink",
            f"NVLink4 (450 GB/s per direction) instead of the current link; all-reduce latency as on 8x H100 SXM: {lat.descriptions['short']}",
            plan,
            nv,
            lat,
        )
    if link["type"] != "shm":
        cen = ri.latency.central

        def oneshot(op, b, m, _l=link):
            return oneshot_allreduce_us(b, m, _l) if op == "all_reduce" else cen(op, b, m)

        pub = tables.data()["oneshot_high_us"]
        low = LatencySource(
            "model",
            "one-shot model: 7.5 us base over PCIe, 10 us over NVLink, + (n-1) x bytes / P2P bandwidth",
            oneshot,
        )
        high = None
        if link["type"] == "pcie":
            high = LatencySource(
                "public-high",
                f"highest public one-shot figure: {pub['pcie_source']}",
                lambda op, b, m: max(oneshot(op, b, m), pub["pcie"] if op == "all_reduce" and m > 1 else 0.0),
            )
        entry(
            "one-shot-allreduce",
            "a one-shot custom all-reduce kernel (P2P reads of all peers; vLLM custom AR / FlashInfer PCIe IPC style)",
            plan,
            hw,
            _fixed(low, low.description, high),
        )
        if link["type"] == "pcie" and link.get("p2p", True):
            off = with_interconnect(hw, "pcie-no-p2p")
            entry(
                "p2p-disabled",
                "if P2P were disabled (NCCL_P2P_DISABLE=1, IOMMU/ACS, or a GeForce driver): host-staged hops, NCCL model",
                plan,
                off,
                make_range(off, n=n),
            )
    # Every link, CPU shared memory included: the same plan with collectives that cost nothing.
    free = LatencySource("zero", "collectives cost nothing", lambda op, b, m: 0.0)
    entry(
        "no-interconnect-cost",
        "collectives cost nothing (the comm-only bound's complement)",
        plan,
        hw,
        _fixed(free, free.description),
    )
    for t in (1, 2, 4, 8):
        if t == layout.tp or link["type"] == "shm":
            continue  # on CPU the only latency is the probe's, at its own world size
        try:
            # DCP is a subgroup of TP: kept where it still divides the new TP size.
            p2 = plan_for(model, replace(layout, tp=t, dcp=layout.dcp if t % layout.dcp == 0 else 1), [1])
        except InputError as e:
            out.append(
                {
                    "name": f"tp{t}",
                    "description": f"TP {t}: not valid for this model ({e})",
                    "tok_per_s": None,
                    "ms_per_token": None,
                    "delta_pct": None,
                }
            )
            continue
        fits, stored = fits_memory(p2.model, p2.layout, hw)
        lat = ri.latency if ri.latency.kind == "user" else make_range(hw, n=t)
        entry(
            f"tp{t}",
            f"TP {t} on the same GPUs and link; all-reduce latency: {lat.descriptions.get('short', lat.kind)}"
            + ("" if fits else f"; does NOT fit: {stored / 1e9:.0f} GB of weights per GPU"),
            p2,
            hw,
            lat,
            fits_memory=fits,
        )
    return out
