"""`tpcomm predict`: the analytic what-if, no GPU needed.

    >>> from tpcomm.plan.layout import Layout
    >>> from tpcomm.predict import predict
    >>> doc = predict("kimi-k2.5", Layout(tp=8), gpu="rtx-pro-6000")
    >>> doc["single_stream"]["tok_per_s"]          # central value
    >>> doc["range"]["single_stream"]["tok_per_s"]  # {"low", "central", "high"} over the uncertain inputs
    >>> doc["range"]["verdict"]["statement"]        # only what holds over the whole range

See model.py for the formula, ranges.py for the ranges and the verdict rule,
calibrate.py for `--attribution` (a model anchored on a measured run).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.plan import Plan, build_plan
from tpcomm.plan.collectives import VLLM_VERSION_FOLLOWED
from tpcomm.plan.layout import Layout
from tpcomm.predict.hardware import load_profile, with_interconnect
from tpcomm.predict.latency_range import make_range
from tpcomm.predict.model import KERNELS, Knobs, fits_memory, kernels_per_step
from tpcomm.predict.ranges import (
    bounds,
    central_knobs,
    evaluate,
    latency_decides,
    range_inputs,
    span,
    summarize,
    verdict,
)

__all__ = ["predict", "Knobs", "Layout"]


def plan_for(model, layout: Layout, batches=(1,)) -> Plan:
    """build_plan for a Layout (build_plan takes the layout's fields one by one)."""
    return build_plan(model, batches=batches, **asdict(layout))


def described(plan: Plan, hw: dict) -> dict:
    """The model, layout and hardware a prediction is for: the first keys of every predict.json."""
    return {
        "model": {
            "name": plan.model.name,
            "source": plan.model.source,
            "architecture": plan.model.architecture,
            "quantization": plan.model.quant.description,
        },
        "layout": plan.layout.to_dict(),
        "hardware": {
            "profile": hw["profile"],
            "name": hw["name"],
            "memory_bandwidth_GBps": hw["memory_bandwidth_GBps"],
            "memory_GB": hw["memory_GB"],
            "bf16_tflops": hw["bf16_tflops"],
            "link": hw["link"],
            "collective_tables": None if hw.get("interconnect_override") else hw.get("collective_tables"),
            "sources": hw.get("sources", {}),
            "notes": hw.get("notes", []),
        },
    }


def predict(
    model,
    layout: Layout | None = None,
    gpu: str = "rtx-pro-6000",
    interconnect: str | None = None,
    batches=(1,),
    allreduce_us: float | None = None,
    probe: str | Path | None = None,
    knobs: Knobs | None = None,
    what_if: bool = True,
    fitted_to: dict[int, float] | None = None,
    out: str | None = None,
) -> dict:
    """`fitted_to` {batch: measured tok/s}: the points the extra terms (--moe-penalty-us, --moe-bw-factor) were fitted to."""
    layout = layout or Layout()
    k = knobs or Knobs()
    _check_knobs(k, allreduce_us)
    hw = with_interconnect(load_profile(gpu), interconnect)
    batches = sorted(set([1, *batches]))
    plan = plan_for(model, layout, batches)
    main = max(plan.for_batch(1), key=lambda c: c.count, default=None)
    lat = make_range(
        hw, allreduce_us, probe, n=main.group_size if main else layout.tp, nbytes=main.bytes if main else 0
    )
    ri = range_inputs(hw, k.memory_efficiency, k.kernel_overhead_us, lat)
    if fitted_to and not (k.moe_penalty_us or k.moe_bw_factor != 1.0):
        from tpcomm.predict.fit import fit_moe_terms

        pen, fac = fit_moe_terms(plan, hw, lat.central, central_knobs(ri, k), fitted_to)
        k = replace(k, moe_penalty_us=pen, moe_bw_factor=fac)
    kc = central_knobs(ri, k)
    steps = [evaluate(plan, b, hw, ri, k) for b in batches]
    ss, corners = steps[0]
    bd = ss["breakdown_ms"]
    coll = bd["collectives"]
    non_coll = ss["step_ms"] - coll
    fits, stored = fits_memory(plan.model, layout, hw)
    summary = summarize(ss, corners)
    cmds = decide_commands(model, plan.layout.world_size, gpu, out)
    # A fixed latency (probe, --allreduce-us) leaves only the other inputs: measuring latency again decides nothing.
    rv = verdict(ss, corners, cmds, not lat.fixed and latency_decides(plan, hw, ri, k))
    fitted = _fitted(k, fitted_to or {}, plan.model)
    doc = {
        **described(plan, hw),
        "collective_latency_source": lat.central.description,
        "collective_latency_kind": lat.kind,
        "single_stream": {
            "ms_per_token": ss["step_ms"],
            "tok_per_s": ss["tok_per_s"],
            "breakdown_ms": bd,
            "bound": ss["bound"],
            "collectives_per_token": sum(c["count"] for c in ss["collectives"]),
            "top_collectives": ss["collectives"][:5],
            "value": "central",
        },
        "ceilings": {
            "comm_only_tok_per_s": (1e3 / coll) if coll > 0 else None,
            "compute_only_tok_per_s": 1e3 / non_coll if non_coll > 0 else None,
            "interconnect_share_of_token": coll / ss["step_ms"],
        },
        "range": {
            "inputs": ri.as_dict(),
            "single_stream": summary,
            "corners": corners,
            "verdict": rv,
            "bounds": bounds(ss, corners, summary),
            "decide_commands": cmds,
        },
        "batches": [
            {
                **{k2: s[k2] for k2 in ("batch", "step_ms", "tok_per_s", "bound", "breakdown_ms")},
                "tok_per_s_range": span(s["tok_per_s"], [c["tok_per_s"] for c in cs]),
                "step_ms_range": span(s["step_ms"], [c["ms_per_token"] for c in cs]),
                "fitted_to_tok_per_s": (fitted_to or {}).get(s["batch"]) if fitted else None,
            }
            for s, cs in steps
        ],
        "memory": {"weights_stored_per_gpu_GB": stored / 1e9, "fits_90pct": fits},
        "fitted": fitted,
        "conditions": {
            "phase": "decode",
            "context_tokens": k.context,
            "knobs": asdict(kc),
            "kernels_per_step": kernels_per_step(plan.model),
            "kernels_per_site": KERNELS,
            "model": "analytic (tpcomm predict): not a measurement",
            "vllm_version_followed": VLLM_VERSION_FOLLOWED,
        },
        "assumptions": _assumptions(ri, kc, plan, fitted),
    }
    if what_if:
        from tpcomm.predict.whatif import what_ifs

        doc["what_if"] = what_ifs(model, plan, hw, k, ri, (ss, corners))
    return doc


def decide_commands(model, world: int, gpu: str, out: str | None) -> dict:
    run = out or "RUN_DIR"
    return {
        "probe": f"tpcomm probe --gpus {world} --model {model} --out {run}, then tpcomm predict --model {model} --tp {world} "
        f"--gpu {gpu} --probe {run}",
        "attribute": f"tpcomm attribute --server-url URL --out {run} (server started with VLLM_PLUGINS=tpcomm), then "
        f"tpcomm predict --model {model} --tp {world} --gpu {gpu} --attribution {run}",
    }


def _fitted(k: Knobs, fitted_to: dict[int, float], m) -> list[dict]:
    """The extra terms and what they were fitted to; a term given without --fitted-to is labelled as given."""
    pts = ", ".join(f"{v:g} tok/s at batch {b}" for b, v in sorted(fitted_to.items()))
    how = (
        f"fitted to measured {pts}"
        if fitted_to
        else "given by the user (an extra term, not fitted here; --fitted-to fits it)"
    )
    out = []
    if k.moe_penalty_us:
        out.append(
            {
                "term": "moe_kernel_penalty",
                "value": k.moe_penalty_us,
                "unit": "us per MoE layer per step",
                "layers": len(m.moe_layers),
                "fitted_to": fitted_to or None,
                "text": f"MoE-kernel penalty {k.moe_penalty_us:.1f} us per MoE layer: {how}",
            }
        )
    if k.moe_bw_factor != 1.0:
        out.append(
            {
                "term": "moe_kernel_bandwidth",
                "value": k.moe_bw_factor,
                "unit": "x routed-expert roofline time",
                "fitted_to": fitted_to or None,
                "text": f"MoE-kernel bandwidth factor {k.moe_bw_factor:.2f}: {how}",
            }
        )
    return out


def _assumptions(ri, kc: Knobs, plan, fitted: list[dict]) -> list[str]:
    me, ko = ri.memory_efficiency, ri.kernel_overhead_us
    n_k = kernels_per_step(plan.model)
    return [
        f"memory efficiency {me.low:g}-{me.high:g} of datasheet bandwidth, central {me.central:g} ({me.source})",
        f"per-kernel overhead {ko.low:g}-{ko.high:g} us, central {ko.central:g} us, x {n_k:.0f} kernels per step ({ko.source})",
        f"collective latency low: {ri.latency.descriptions['low']}",
        f"collective latency central: {ri.latency.descriptions['central']}",
        f"collective latency high: {ri.latency.descriptions['high']}",
        f"KV read at {kc.context} context tokens per sequence",
        "routed experts: uniform routing, E*(1-(1-k/E)^B) distinct experts per step",
        *[f["text"] for f in fitted],
    ]


def _check_knobs(k: Knobs, allreduce_us):
    checks = {"--memory-efficiency": (k.memory_efficiency, 0, 1), "--compute-efficiency": (k.compute_efficiency, 0, 1)}
    for name, (v, lo, hi) in checks.items():
        if v is not None and not (lo < v <= hi):
            raise InputError(f"{name} {v}", "is out of range", f"a fraction in ({lo}, {hi}]")
    for name, v in (
        ("--kernel-overhead-us", k.kernel_overhead_us),
        ("--moe-penalty-us", k.moe_penalty_us),
        ("--context", k.context),
    ):
        if v is not None and v < 0:
            raise InputError(f"{name} {v}", "is negative", "a value >= 0")
    if k.moe_bw_factor < 1:
        raise InputError(f"--moe-bw-factor {k.moe_bw_factor}", "is below 1", "a factor >= 1 (1 = roofline)")
    if allreduce_us is not None and allreduce_us <= 0:
        raise InputError(f"--allreduce-us {allreduce_us}", "is not positive", "microseconds > 0")
