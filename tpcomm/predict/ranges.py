"""Every model-based number as a range over its uncertain inputs, and a verdict
only where the whole range agrees.

Uncertain inputs (each a low-central-high triple with its source; a value the
user gives is fixed): collective latency (latency_range.py), memory efficiency,
launch gap per kernel, GEMM ramp per kernel, fixed cost per MoE layer
(kernels.py), the engine's host time per step and, for eager engines, its
launch cost per kernel (engine.py). The step time is monotone in each input
(more latency, gap, ramp, MoE cost, host or launch time: slower; more
efficiency: faster), and so are the interconnect's share of a token and the
difference between any two other terms. So every quantity takes its extremes
at the corners of the input box (2^n for the n inputs that are not fixed),
and a statement true at every corner holds over the whole box: that is how
verdicts are checked here (and recomputed by the tests).

Units: *_ms milliseconds per step, *_us microseconds, tok/s, shares 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product

from tpcomm.judge import bottleneck
from tpcomm.predict import kernels
from tpcomm.predict.latency import LatencySource
from tpcomm.predict.latency_range import LatencyRange
from tpcomm.predict.model import DEFAULT_MEMORY_EFFICIENCY, step_time

# Defaults for GPU profiles without their own ranges (assumptions, stated in every output).
KERNEL_OVERHEAD_RANGE_US = kernels.LAUNCH_GAP_US[:3]
KERNEL_OVERHEAD_SOURCE = kernels.LAUNCH_GAP_US[3]
MEMORY_EFFICIENCY_RANGE = (0.7, DEFAULT_MEMORY_EFFICIENCY, 0.85)
MEMORY_EFFICIENCY_SOURCE = "assumption: typical achieved fraction of datasheet bandwidth for large streaming reads"
LAT_SAMPLES = 9  # latencies tried between low and high to see whether measuring latency alone decides
# Knob name of each scalar input (the order of RangeInputs.scalars).
SCALARS = (
    "memory_efficiency",
    "kv_efficiency",
    "kernel_overhead_us",
    "ramp_us",
    "host_ms",
    "moe_layer_us",
    "launch_us",
    "quant_kernel_factor",
)


@dataclass
class Input:
    low: float
    central: float
    high: float
    source: str

    def at(self, level: str) -> float:
        return getattr(self, level)

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def as_dict(self) -> dict:
        return {"low": self.low, "central": self.central, "high": self.high, "source": self.source}


@dataclass
class RangeInputs:
    memory_efficiency: Input
    kernel_overhead_us: Input
    latency: LatencyRange
    ramp_us: Input = field(default_factory=lambda: Input(*kernels.RAMP_US))
    kv_efficiency: Input = field(default_factory=lambda: Input(*kernels.KV_EFFICIENCY))
    host_ms: Input = field(default_factory=lambda: Input(0.0, 0.0, 0.0, "no host term"))
    moe_layer_us: Input | None = None  # None: not a MoE model
    launch_us: Input | None = None  # None: a CUDA-graph engine
    quant_kernel_factor: Input | None = None  # None: quantized GEMMs stream like the others
    moe_backend: str = ""
    eager: bool = False

    def scalars(self) -> dict[str, Input]:
        out = {name: getattr(self, name) for name in SCALARS}
        return {k: v for k, v in out.items() if v is not None}

    def axes(self) -> list[str]:
        """Inputs that vary over the range (a fixed one adds no corner)."""
        ax = [] if self.latency.fixed else ["collective_latency"]
        return ax + [k for k, v in self.scalars().items() if not v.fixed]

    def as_dict(self) -> dict:
        out = {k: v.as_dict() for k, v in self.scalars().items()}
        out["collective_latency"] = {"kind": self.latency.kind, **self.latency.descriptions}
        if self.moe_backend:
            out["moe_layer_us"]["backend"] = self.moe_backend
            if self.moe_layer_us is not None and not self.moe_layer_us.source.startswith("given"):
                rows = kernels.MOE_ROWS.get(self.moe_backend, [])
                out["moe_layer_us"]["informed_by"] = rows
                out["moe_layer_us"]["covered_by_a_measurement"] = bool(rows)
        return out


def engine_ramp(given, hw: dict, engine) -> Input | None:
    """The GEMM ramp fitted for this engine on this GPU (kernels.ENGINE_RAMP_US), where one is and none is given."""
    from tpcomm.predict.coverage import gpu_group

    key = (getattr(engine, "family", None), gpu_group(hw))
    if given is not None or key not in kernels.ENGINE_RAMP_US:
        return None
    return Input(*kernels.ENGINE_RAMP_US[key])


def range_inputs(hw: dict, k, lat: LatencyRange, engine=None, model=None, world: int = 1) -> RangeInputs:
    """Given values are fixed; otherwise the profile's range (`*_range` keys), the engine's and the kernel
    tables' (kernels.py, engine.py), else the defaults above. `world`: the TP world size (the engine's host term
    grows with it, engine.HOST_TP; a given --host-ms is the whole term)."""

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

    ri = RangeInputs(
        pick(
            k.memory_efficiency,
            "memory_efficiency",
            MEMORY_EFFICIENCY_RANGE,
            MEMORY_EFFICIENCY_SOURCE,
            "--memory-efficiency",
        ),
        pick(
            k.kernel_overhead_us,
            "kernel_overhead_us",
            KERNEL_OVERHEAD_RANGE_US,
            KERNEL_OVERHEAD_SOURCE,
            "--kernel-overhead-us",
        ),
        lat,
        ramp_us=engine_ramp(k.ramp_us, hw, engine)
        or pick(k.ramp_us, "ramp_us", kernels.RAMP_US[:3], kernels.RAMP_US[3], "--ramp-us"),
        kv_efficiency=pick(
            k.kv_efficiency, "kv_efficiency", kernels.KV_EFFICIENCY[:3], kernels.KV_EFFICIENCY[3], "--kv-efficiency"
        ),
    )
    if engine is not None:
        ri.host_ms = pick(k.host_ms, "host_ms", *engine.host_at(world), "--host-ms")
        if engine.eager:
            ri.eager = True
            ri.launch_us = pick(k.launch_us, "launch_us", engine.launch_us, engine.launch_source, "--launch-us")
    elif k.host_ms is not None:
        ri.host_ms = Input(k.host_ms, k.host_ms, k.host_ms, f"given (--host-ms {k.host_ms:g}): fixed")
    wk = kernels.weight_kernel(model, engine) if model is not None else ""
    if wk:
        lo, c, hi, src = kernels.WEIGHT_KERNEL[wk]
        ri.quant_kernel_factor = Input(lo, c, hi, f"{wk}: {src}")
    if model is not None and model.is_moe:
        ri.moe_backend = kernels.moe_backend(model, engine, hw) if engine is not None else "default"
        lo, c, hi, src = kernels.MOE_LAYER_US[ri.moe_backend]
        ri.moe_layer_us = pick(k.moe_layer_us, "moe_layer_us", (lo, c, hi), src, "--moe-layer-us")
    return ri


def corners(ri: RangeInputs | None = None) -> list[dict[str, str]]:
    """The corners of the input box: {input: "low" | "high"} for every varying input (others central)."""
    axes = ri.axes() if ri is not None else ["collective_latency", "kernel_overhead_us", "memory_efficiency"]
    return [dict(zip(axes, levels)) for levels in product(("low", "high"), repeat=len(axes))] or [{}]


def knobs_at(ri: RangeInputs, k, levels: dict[str, str]):
    """Knobs with every scalar input at its level in `levels` (central where absent)."""
    vals = {name: inp.at(levels.get(name, "central")) for name, inp in ri.scalars().items()}
    return replace(k, **vals)


def central_knobs(ri: RangeInputs, k):
    return knobs_at(ri, k, {})


def evaluate(
    plan, batch: int, hw: dict, ri: RangeInputs, k, lat_override: LatencyRange | None = None
) -> tuple[dict, list[dict]]:
    """The central step and the step at each corner of the input box."""
    lat = lat_override or ri.latency
    central = step_time(plan, batch, hw, lat.central, central_knobs(ri, k), eager=ri.eager)
    out = []
    for levels in corners(ri):
        st = step_time(
            plan,
            batch,
            hw,
            lat.level(levels.get("collective_latency", "central")),
            knobs_at(ri, k, levels),
            eager=ri.eager,
        )
        inputs = {name: levels.get(name, "fixed") for name in ["collective_latency", *ri.scalars()]}
        out.append(
            {
                "inputs": inputs,
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
    others = [c for c in corners(ri) if c.get("collective_latency", "low") == "low"]
    for i in range(LAT_SAMPLES):
        t = i / (LAT_SAMPLES - 1)
        src = LatencySource("mix", "", lambda op, b, n, t=t: (1 - t) * lo(op, b, n) + t * hi(op, b, n))
        verdicts = {
            classify(step_time(plan, 1, hw, src, knobs_at(ri, k, c), eager=ri.eager)["breakdown_ms"])["bottleneck"]
            for c in others
        }
        if len(verdicts) > 1:
            return False
    return True


def bottleneck_verdict(central: dict, cs: list[dict], commands: dict, latency_alone_decides: bool) -> dict:
    """The model-based verdict: a statement only where every corner agrees, else 'cannot decide' and the
    measurement that decides it: tpcomm/judge/bottleneck.py's over_range, the one rule attribute and the report
    use too. `commands`: 'probe' and 'attribute' command lines."""
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


def no_fit_verdict(stored_GB: float, memory_GB: float, tp: int) -> dict:
    """No bottleneck verdict for a configuration whose weights do not fit: its speed is not a question."""
    return {
        "share": None,
        "decided": False,
        "interconnect_is_bottleneck": None,
        "main_other": None,
        "decides": None,
        "fits_memory": False,
        "statement": (
            f"No verdict: the weights do not fit ({stored_GB:.0f} GB per GPU at TP {tp} against 90% of "
            f"{memory_GB:g} GB); the times above are what the model gives if they did."
        ),
    }
