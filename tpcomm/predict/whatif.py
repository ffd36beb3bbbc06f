"""Single-stream what-ifs, each a range over the same uncertain inputs as the baseline (ranges.py): another
link, a one-shot all-reduce, P2P off, free collectives, another TP size, CUDA graphs or async scheduling for the
engine. A what-if's change is computed corner by corner against the baseline at the same corner, so
`delta_pct_range` says whether it helps over the whole range or only somewhere in it.

Answers a planner can act on:
- `lever` says whether the what-if is something this hardware and engine can do (NVLink on a card without an
  NVLink connector, or a P2P one-shot all-reduce without P2P, is not; P2P off is a risk; free collectives a
  bound). A one-shot all-reduce is not offered without P2P, nor where the engine already runs its own.
- A TP what-if compares latencies of the same kind on both sides: when the baseline's TP has a measured table
  and the other TP has none (or the reverse), both are computed on the reference basis (latency_range.py), and
  the description says so; a probe measured at one world size cannot say anything at another: no number.

Units: tok/s, ms per token, percent.
"""

from __future__ import annotations

from dataclasses import replace

from tpcomm.errors import InputError
from tpcomm.plan import Plan
from tpcomm.predict import plan_for, tables
from tpcomm.predict.engine import HOST
from tpcomm.predict.hardware import with_interconnect
from tpcomm.predict.latency import LatencySource
from tpcomm.predict.latency_range import LatencyRange, custom_ar_eligible, make_range
from tpcomm.predict.model import fits_memory
from tpcomm.predict.ranges import Input, evaluate


def _fixed(src: LatencySource, desc: str, high: LatencySource | None = None, low: LatencySource | None = None):
    h, lo = high or src, low or src
    return LatencyRange(
        lo, src, h, src.kind, {"low": lo.description, "central": desc, "high": h.description, "short": desc}
    )


def what_ifs(model, plan: Plan, hw, k, ri, base: tuple[dict, list[dict]], eng) -> list[dict]:
    """Each what-if is the baseline's Layout (plan.layout) with one thing changed."""
    out: list[dict] = []
    layout = plan.layout
    base_c, base_cs = base

    def entry(name, desc, plan_, hw_, lat: LatencyRange, ri_=None, against=None, lever=True, lever_note="", **extra):
        c, cs = evaluate(plan_, 1, hw_, ri_ or ri, k, lat_override=lat)
        bc, bcs = against or (base_c, base_cs)
        deltas = [100 * (_match(cs, b)["tok_per_s"] / b["tok_per_s"] - 1) for b in bcs]
        toks = [x["tok_per_s"] for x in cs] + [c["tok_per_s"]]
        out.append(
            {
                "name": name,
                "description": desc,
                "tok_per_s": c["tok_per_s"],
                "ms_per_token": c["step_ms"],
                "delta_pct": 100 * (c["tok_per_s"] / bc["tok_per_s"] - 1),
                "breakdown_ms": c["breakdown_ms"],
                "tok_per_s_range": {"low": min(toks), "central": c["tok_per_s"], "high": max(toks)},
                "delta_pct_range": {"low": min(deltas), "high": max(deltas)},
                "collective_latency": lat.descriptions,
                "lever": lever,
                "lever_note": lever_note or None,
                **({"baseline_tok_per_s": bc["tok_per_s"]} if against else {}),
                **extra,
            }
        )

    link = hw["link"]
    n = layout.tp
    if link["type"] == "pcie":
        nv = {**with_interconnect(hw, "nvlink4"), "collective_tables": "h100_sxm"}
        nv.pop("interconnect_override", None)  # NVLink4 as measured on 8x H100 SXM: those tables apply
        lat = make_range(nv, n=n, engine=eng)
        bridge = hw.get("nvlink_bridge") and n == 2
        entry(
            "nvlink",
            f"NVLink4 (450 GB/s per direction) instead of the current link; all-reduce latency as on H100 SXM: "
            f"{lat.descriptions['short']}",
            plan,
            nv,
            lat,
            lever=bool(bridge),
            lever_note=None
            if bridge
            else f"{hw['name']} has no NVLink at TP {n}: a what-if for comparison, not something this hardware can do",
        )
    if link["type"] == "pcie" and link.get("p2p", True) and not custom_ar_eligible(link, n, eng):
        cen = ri.latency.central

        def oneshot(level):
            i = {"low": 0, "central": 1, "high": 2}[level]

            def fn(op, b, m):
                if op != "all_reduce" or m <= 1:
                    return cen(op, b, m)
                t = tables.oneshot_4rank_us(b, m)[i]
                if level == "high" and m == 8:
                    t = max(t, tables.data()["oneshot_high_us"]["pcie"])
                return t

            return fn

        src = {
            lv: LatencySource("oneshot", d, oneshot(lv))
            for lv, d in (
                ("low", "the lower of the two measured 4-rank one-shot figures, scaled to n ranks"),
                (
                    "central",
                    "4x RTX PRO 6000 one-shot kernel, 6.1-9.2 us at 1-32 KB (REFERENCE s5), the part above "
                    "the smallest size scaled by (n-1)/3 peers",
                ),
                (
                    "high",
                    "the higher 4-rank figure scaled (4x V100 in a CUDA graph, REFERENCE s7)"
                    + (f"; at 8 ranks {tables.data()['oneshot_high_us']['pcie_source']}" if n == 8 else ""),
                ),
            )
        }
        entry(
            "one-shot-allreduce",
            "a one-shot P2P all-reduce kernel (FlashInfer PCIe IPC: VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1, or a "
            "custom kernel) instead of NCCL; latency from the measured 4-rank one-shot figures",
            plan,
            hw,
            LatencyRange(
                src["low"], src["central"], src["high"], "oneshot", {lv: s.description for lv, s in src.items()}
            ),
        )
    if link["type"] == "pcie" and link.get("p2p", True):
        off = with_interconnect(hw, "pcie-no-p2p")
        entry(
            "p2p-disabled",
            "if P2P were disabled (NCCL_P2P_DISABLE=1, IOMMU/ACS, or a GeForce driver): host-staged hops, NCCL "
            "(the engine's custom all-reduce needs P2P)",
            plan,
            off,
            make_range(off, n=n, engine=eng),
            lever=False,
            lever_note="a risk to check (tpcomm topo), not a lever",
        )
    # Every link, CPU shared memory included: the same plan with collectives that cost nothing.
    free = LatencySource("zero", "collectives cost nothing", lambda op, b, m: 0.0)
    entry(
        "no-interconnect-cost",
        "collectives cost nothing (the comm-only bound's complement)",
        plan,
        hw,
        _fixed(free, free.description),
        lever=False,
        lever_note="a bound, not an action",
    )
    _engine_what_ifs(entry, plan, hw, ri, eng)
    for t in (1, 2, 4, 8):
        if t == layout.tp or link["type"] == "shm":
            continue  # on CPU the only latency is the probe's, at its own world size
        try:
            # DCP is a subgroup of TP: kept where it still divides the new TP size.
            p2 = plan_for(model, replace(layout, tp=t, dcp=layout.dcp if t % layout.dcp == 0 else 1), [1], eng)
        except InputError as e:
            out.append(_none(f"tp{t}", f"TP {t}: not valid for this model ({e})"))
            continue
        fits, stored = fits_memory(p2.model, p2.layout, hw, p2.vocab_parallel)
        fit_txt = "" if fits else f"; does NOT fit: {stored / 1e9:.0f} GB of weights per GPU"
        if ri.latency.kind == "probe":
            out.append(
                _none(
                    f"tp{t}",
                    f"TP {t}: the collective latency is this hardware's probe at TP {n}; no figure of the same kind "
                    f"for TP {t} (probe at --gpus {t}, or give --allreduce-us for both){fit_txt}",
                    fits_memory=fits,
                )
            )
            continue
        if not p2.for_batch(1):
            lat, against, basis = make_range(hw, n=t, engine=eng), None, "none (no collectives at TP 1)"
        elif ri.latency.kind == "user":
            lat, against, basis = ri.latency, None, "the given latency on both sides"
        else:
            lat = make_range(hw, n=t, engine=eng)
            against, basis = None, f"{lat.descriptions['short']} (TP {n}: {ri.latency.descriptions['short']})"
            if lat.kind != ri.latency.kind and p2.for_batch(1) and plan.for_batch(1):
                # Measured at one TP, modelled or borrowed at the other: compare both on the reference basis.
                lat = make_range(hw, n=t, engine=eng, basis="reference")
                base_ref = make_range(hw, n=n, engine=eng, basis="reference")
                against = evaluate(plan, 1, hw, ri, k, lat_override=base_ref)
                basis = (
                    f"{lat.descriptions['short']} on both sides (one TP has a measured table, the other none: the "
                    f"change is computed against TP {n} on the same basis, {against[0]['tok_per_s']:.1f} tok/s)"
                )
        entry(
            f"tp{t}",
            f"TP {t} on the same GPUs and link; all-reduce latency: {basis}{fit_txt}",
            p2,
            hw,
            lat,
            ri_=_host_at(ri, k, eng, t),
            against=against,
            lever=fits,
            lever_note=None if fits else "does not fit in memory",
            fits_memory=fits,
            latency_basis="same kind" if against is None else "reference on both sides",
        )
    return out


def _host_at(ri, k, eng, world: int):
    """The range inputs with the engine's host term at another TP world size (a given --host-ms stays as given)."""
    if eng is None or k.host_ms is not None:
        return ri
    return replace(ri, host_ms=Input(*eng.host_at(world)[0], eng.host_at(world)[1]))


def _engine_what_ifs(entry, plan, hw, ri, eng) -> None:
    """Levers of the engine itself: CUDA graphs for an eager engine, async scheduling for a synchronous vLLM."""
    if eng is None or hw["link"]["type"] == "shm":
        return
    if eng.eager:
        graphs = replace(ri, eager=False, launch_us=None)
        entry(
            "cuda-graphs",
            f"the same engine with CUDA graphs (drop --enforce-eager): kernels replayed from a graph, no longer "
            f"launched one by one from Python ({eng.name} runs eager)",
            plan,
            hw,
            ri.latency,
            ri_=graphs,
        )
    if eng.runner in ("vllm-v0", "vllm-v1"):
        lo, c, hi, src = HOST["vllm-v1-async"]
        fast = replace(ri, host_ms=Input(lo, c, hi, src))
        entry(
            "async-scheduling",
            f"vLLM V1 with async scheduling (vLLM >= 0.14, the default there) instead of {eng.runner}: host time per "
            f"step {lo:g}-{hi:g} ms",
            plan,
            hw,
            ri.latency,
            ri_=fast,
        )


def _match(cs: list[dict], b: dict) -> dict:
    """The what-if corner at the baseline corner `b`'s levels (inputs the what-if does not vary match any)."""
    for x in cs:
        if all(v == "fixed" or b["inputs"].get(name, v) == v for name, v in x["inputs"].items()):
            return x
    return cs[0]


def _none(name: str, desc: str, **extra) -> dict:
    return {
        "name": name,
        "description": desc,
        "tok_per_s": None,
        "ms_per_token": None,
        "delta_pct": None,
        "lever": False,
        **extra,
    }
