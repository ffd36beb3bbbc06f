"""Every model-based number as a range over its uncertain inputs, and a verdict
only where the whole range agrees.

Uncertain inputs: collective latency (latency_range.py), per-kernel overhead
and memory efficiency (a low-central-high triple each, with its source; a value
the user gives is fixed). The step time is monotone in each input (more latency
or overhead: slower; more efficiency: faster), and so are the interconnect's
share of a token and the difference between any two other terms. So every
quantity takes its extremes at the 8 corners of the input box, and a statement
true at all 8 corners holds over the whole box: that is how verdicts are
checked here (and recomputed by the tests).

Units: *_ms milliseconds per step, *_us microseconds, tok/s, shares 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from tpcomm.judge import bottleneck
from tpcomm.predict.latency import LatencySource
from tpcomm.predict.latency_range import LatencyRange
from tpcomm.predict.model import DEFAULT_KERNEL_OVERHEAD_US, DEFAULT_MEMORY_EFFICIENCY, step_time

# Defaults for GPU profiles without their own ranges (assumptions, stated in every output).
KERNEL_OVERHEAD_RANGE_US = (1.0, DEFAULT_KERNEL_OVERHEAD_US, 5.0)
KERNEL_OVERHEAD_SOURCE = (
    "assumption: 1 us = back-to-back kernels replayed from a CUDA graph (launch gap only); 5 us = "
    "decode kernels too small to reach the bandwidth roofline (ramp and tail); not measured for this "
    "hardware: tpcomm attribute measures it"
)
MEMORY_EFFICIENCY_RANGE = (0.7, DEFAULT_MEMORY_EFFICIENCY, 0.85)
MEMORY_EFFICIENCY_SOURCE = "assumption: typical achieved fraction of datasheet bandwidth for large streaming reads"
LAT_SAMPLES = 9  # latencies tried between low and high to see whether measuring latency alone decides


@dataclass
class Input:
    low: float
    central: float
    high: float
    source: str

    def at(self, level: str) -> float:
        return getattr(self, level)

    def as_dict(self) -> dict:
        return {"low": self.low, "central": self.central, "high": self.high, "source": self.source}


@dataclass
class RangeInputs:
    memory_efficiency: Input
    kernel_overhead_us: Input
    latency: LatencyRange

    def as_dict(self) -> dict:
        return {
            "memory_efficiency": self.memory_efficiency.as_dict(),
            "kernel_overhead_us": self.kernel_overhead_us.as_dict(),
            "collective_latency": {"kind": self.latency.kind, **self.latency.descriptions},
        }


def range_inputs(
    hw: dict, memory_efficiency: float | None, kernel_overhead_us: float | None, lat: LatencyRange
) -> RangeInputs:
    """Given values are fixed; otherwise the profile's range (`*_range` keys), else the defaults above."""

    def pick(given, key, default, source, flag):
        if given is not None:
            return Input(given, given, given, f"given ({flag} {given:g}): fixed")
        if f"{key}_range" in hw:
            lo, hi = hw[f"{key}_range"]
            return Input(
                lo, hw.get(key, (lo + hi) / 2), hi, hw.get("sources", {}).get(key, f"hardware profile {hw['profile']}")
            )
        if key in hw:  # a profile's single value is taken as given
            v = hw[key]
            return Input(
                v,
                v,
                v,
                hw.get("sources", {}).get(key, f"hardware profile {hw['profile']}")
                + " (fixed: no range in the profile)",
            )
        return Input(*default, source)

    return RangeInputs(
        pick(
            memory_efficiency,
            "memory_efficiency",
            MEMORY_EFFICIENCY_RANGE,
            MEMORY_EFFICIENCY_SOURCE,
            "--memory-efficiency",
        ),
        pick(
            kernel_overhead_us,
            "kernel_overhead_us",
            KERNEL_OVERHEAD_RANGE_US,
            KERNEL_OVERHEAD_SOURCE,
            "--kernel-overhead-us",
        ),
        lat,
    )


def corners():
    """(latency level, overhead level, efficiency level) at the 8 corners."""
    return list(product(("low", "high"), repeat=3))


def central_knobs(ri: RangeInputs, k):
    return replace(k, memory_efficiency=ri.memory_efficiency.central, kernel_overhead_us=ri.kernel_overhead_us.central)


def evaluate(
    plan, batch: int, hw: dict, ri: RangeInputs, k, lat_override: LatencyRange | None = None
) -> tuple[dict, list[dict]]:
    """The central step and the step at each corner of the input box."""
    lat = lat_override or ri.latency
    central = step_time(plan, batch, hw, lat.central, central_knobs(ri, k))
    out = []
    for lv, ov, ef in corners():
        kk = replace(k, memory_efficiency=ri.memory_efficiency.at(ef), kernel_overhead_us=ri.kernel_overhead_us.at(ov))
        st = step_time(plan, batch, hw, lat.level(lv), kk)
        out.append(
            {
                "inputs": {"collective_latency": lv, "kernel_overhead_us": ov, "memory_efficiency": ef},
                "tok_per_s": st["tok_per_s"],
                "ms_per_token": st["step_ms"],
                "breakdown_ms": st["breakdown_ms"],
            }
        )
    return central, out


def span(central: float, values: list[float]) -> dict:
    return {"low": min(values + [central]), "central": central, "high": max(values + [central])}


def summarize(central: dict, cs: list[dict]) -> dict:
    """tok/s, ms per token, each term (ms) and each term's share: low / central / high over the corners."""
    terms = list(central["breakdown_ms"])
    share = lambda bd, t: bd.get(t, 0.0) / sum(bd.values())
    return {
        "tok_per_s": span(central["tok_per_s"], [c["tok_per_s"] for c in cs]),
        "ms_per_token": span(central["step_ms"], [c["ms_per_token"] for c in cs]),
        "breakdown_ms": {
            t: span(central["breakdown_ms"][t], [c["breakdown_ms"].get(t, 0.0) for c in cs]) for t in terms
        },
        "share": {t: span(share(central["breakdown_ms"], t), [share(c["breakdown_ms"], t) for c in cs]) for t in terms},
    }


def classify(bd: dict) -> dict:
    """What the verdict says for one breakdown: the one rule of tpcomm/judge/bottleneck.py."""
    return bottleneck.classify(bd)


def latency_decides(plan, hw: dict, ri: RangeInputs, k) -> bool:
    """Would measuring collective latency alone settle 'is the interconnect the bottleneck'? True when,
    at every latency between low and high, the other inputs' corners agree."""
    lo, hi = ri.latency.low, ri.latency.high
    for i in range(LAT_SAMPLES):
        t = i / (LAT_SAMPLES - 1)
        src = LatencySource("mix", "", lambda op, b, n, t=t: (1 - t) * lo(op, b, n) + t * hi(op, b, n))
        verdicts = {
            classify(
                step_time(
                    plan,
                    1,
                    hw,
                    src,
                    replace(
                        k,
                        memory_efficiency=ri.memory_efficiency.at(ef),
                        kernel_overhead_us=ri.kernel_overhead_us.at(ov),
                    ),
                )["breakdown_ms"]
            )["bottleneck"]
            for ov, ef in product(("low", "high"), repeat=2)
        }
        if len(verdicts) > 1:
            return False
    return True


def verdict(central: dict, cs: list[dict], commands: dict, latency_alone_decides: bool) -> dict:
    """The model-based verdict: a statement only where every corner agrees, else 'cannot decide' and the
    measurement that decides it (tpcomm/judge/bottleneck.py over_range). `commands`: 'probe' and 'attribute'."""
    return bottleneck.over_range(
        central["breakdown_ms"], [x["breakdown_ms"] for x in cs], commands, latency_alone_decides
    )


def bounds(central: dict, cs: list[dict], summary: dict) -> dict:
    """Ceilings that hold at every corner (the highest value over the range), as plain sentences' numbers."""

    def ceil(bd, keep):
        rest = sum(v for k, v in bd.items() if keep(k))
        return 1e3 / rest if rest > 0 else None

    all_bd = [central["breakdown_ms"]] + [c["breakdown_ms"] for c in cs]
    comp = [ceil(bd, lambda k: k != "collectives") for bd in all_bd]
    comm = [ceil(bd, lambda k: k == "collectives") for bd in all_bd]
    t = summary["tok_per_s"]
    out = {
        "tok_per_s": t,
        "compute_only_tok_per_s_max": max(comp) if None not in comp else None,
        "comm_only_tok_per_s_max": max(comm) if None not in comm else None,
    }
    text = (
        f"Bounds over the whole range of the model's inputs: {t['low']:.1f}-{t['high']:.1f} tok/s single stream "
        f"(central {t['central']:.1f})"
    )
    if out["compute_only_tok_per_s_max"]:
        text += f"; even with a free interconnect, at most {out['compute_only_tok_per_s_max']:.0f} tok/s"
    if out["comm_only_tok_per_s_max"]:
        text += (
            f"; even if everything but the collectives were free, at most {out['comm_only_tok_per_s_max']:.0f} tok/s"
        )
    out["statement"] = text + "."
    return out
