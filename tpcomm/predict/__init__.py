"""`tpcomm predict`: the analytic what-if, no GPU needed.

    >>> from tpcomm.plan.layout import Layout
from tpcomm.plan.weights import weight_components
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
from tpcomm.plan.collectives import EMBED_SITE, LOGITS_SITE, VLLM_VERSION_FOLLOWED
from tpcomm.plan.layout import Layout
from tpcomm.plan.weights import weight_components
from tpcomm.predict import coverage
from tpcomm.predict.engine import resolve_engine
from tpcomm.predict.hardware import load_profile, with_interconnect
from tpcomm.predict.latency_range import make_range
from tpcomm.predict.model import KERNELS, Knobs, fits_memory, kernels_per_step
from tpcomm.predict.ranges import (
    bottleneck_verdict,
    bounds,
    central_knobs,
    evaluate,
    latency_decides,
    no_fit_verdict,
    range_inputs,
    span,
    summarize,
)

__all__ = ["predict", "Knobs", "Layout"]


def plan_for(model, layout: Layout, batches=(1,), engine=None) -> Plan:
    """build_plan for a Layout (build_plan takes the layout's fields one by one); with `engine` (an Engine), the
    plan as that engine runs it (engine_plan)."""
    plan = build_plan(model, batches=batches, **asdict(layout))
    return plan if engine is None else engine_plan(plan, engine)


def engine_plan(plan: Plan, engine) -> Plan:
    """vLLM's plan as `engine` runs it: an engine that replicates the lm_head (Engine.vocab_parallel False:
    gpt-fast) reads all of it on every rank and issues no embedding all-reduce and no logits gather."""
    if engine.vocab_parallel or not plan.vocab_parallel:
        return plan
    keep = [c for c in plan.collectives if c.site not in (EMBED_SITE, LOGITS_SITE)]
    return replace(plan, collectives=keep, vocab_parallel=False)


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
            # a user's profile file may name them with numbers ("name": 5090): text here, as the report prints them
            "profile": None if hw["profile"] is None else str(hw["profile"]),
            "name": None if hw["name"] is None else str(hw["name"]),
            "memory_bandwidth_GBps": hw["memory_bandwidth_GBps"],
            "memory_GB": hw["memory_GB"],
            "bf16_tflops": hw["bf16_tflops"],
            "link": hw["link"],
            "collective_tables": None if hw.get("interconnect_override") else hw.get("collective_tables"),
            "sources": hw.get("sources") or {},
            "notes": hw.get("notes", []),
        },
    }


def load_inputs(model, layout: Layout, gpu, interconnect, batches, engine, knobs: Knobs, allreduce_us):
    """Hardware, plan, engine and knobs, every problem of the inputs reported at once (one InputError)."""
    problems: list[InputError] = []

    def attempt(fn):
        try:
            return fn()
        except InputError as e:
            problems.append(e)
            return None

    attempt(lambda: _check_knobs(knobs, allreduce_us))
    hw = attempt(lambda: with_interconnect(load_profile(gpu), interconnect))
    plan = attempt(lambda: plan_for(model, layout, batches))
    eng = attempt(lambda: resolve_engine(engine))
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InputError(
            f"{len(problems)} problems with the inputs",
            " | ".join(str(e) for e in problems),
        )
    return hw, engine_plan(plan, eng), eng


def predict(
    model,
    layout: Layout | None = None,
    gpu: str | None = None,
    interconnect: str | None = None,
    batches=(1,),
    allreduce_us: float | None = None,
    probe: str | Path | None = None,
    knobs: Knobs | None = None,
    what_if: bool = True,
    fitted_to: dict[int, float] | None = None,
    out: str | None = None,
    engine: str | None = None,
) -> dict:
    """`fitted_to` {batch: measured tok/s}: the points the extra terms (--moe-penalty-us, --moe-bw-factor) were
    fitted to. `gpu`: a profile name or file (required). `engine`: see engine.py (None: the installed vLLM)."""
    layout = layout or Layout()
    k = knobs or Knobs()
    # The points a fit uses are planned too (their collectives), and shown in the batch table, labelled fitted.
    batches = sorted(set([1, *batches, *(fitted_to or {})]))
    hw, plan, eng = load_inputs(model, layout, gpu, interconnect, batches, engine, k, allreduce_us)
    eng = engine_on(eng, hw)
    main = max(plan.for_batch(1), key=lambda c: c.count, default=None)
    lat = make_range(
        hw,
        allreduce_us,
        probe,
        n=main.group_size if main else layout.tp,
        nbytes=main.bytes if main else 0,
        engine=eng,
    )
    ri = range_inputs(hw, k, lat, eng, plan.model, plan.layout.tp)
    fit_method = None
    if fitted_to and not (k.moe_penalty_us or k.moe_bw_factor != 1.0):
        from tpcomm.predict.fit import fit_moe_terms

        pen, fac, fit_method = fit_moe_terms(plan, hw, lat.central, central_knobs(ri, k), fitted_to, eager=ri.eager)
        k = replace(k, moe_penalty_us=pen, moe_bw_factor=fac, moe_layer_us=0.0)
        ri = range_inputs(
            hw, k, lat, eng, plan.model, plan.layout.tp
        )  # the fitted penalty stands in for the per-layer cost
    # The rows that informed the fitted constants in use; an engine none of them ran gets its ranges widened
    # (coverage.py, the one place the rule is defined).
    cov = coverage.coverage(eng, coverage.constants_in_use(hw, eng, ri))
    ri_as_fitted = ri
    ri, cov = coverage.widen_uncovered(ri, cov, coverage.ramp_fits())
    kc = central_knobs(ri, k)
    steps = [evaluate(plan, b, hw, ri, k) for b in batches]
    ss, corners = steps[0]
    bd = ss["breakdown_ms"]
    coll = bd["collectives"]
    non_coll = ss["step_ms"] - coll
    fits, stored = fits_memory(plan.model, layout, hw, plan.vocab_parallel)
    if fits and cov.widened and cov.widened["changed"]:  # by how much: the single-stream range
        # without the widening (none where the weights do not fit: no tok/s)
        c0, cs0 = evaluate(plan, 1, hw, ri_as_fitted, k)
        cov.widened["tok_per_s_from"] = span(c0["tok_per_s"], [c["tok_per_s"] for c in cs0])
        cov.widened["tok_per_s_to"] = span(ss["tok_per_s"], [c["tok_per_s"] for c in corners])
    summary = summarize(ss, corners)
    cmds = decide_commands(model, plan.layout.world_size, hw["profile"], out, engine)
    if fits:
        # A fixed latency (probe, --allreduce-us) leaves only the other inputs: measuring latency again decides nothing.
        rv = bottleneck_verdict(ss, corners, cmds, not lat.fixed and latency_decides(plan, hw, ri, k))
    else:
        rv = no_fit_verdict(stored / 1e9, hw["memory_GB"], layout.tp)
    fitted = _fitted(k, fitted_to or {}, plan.model, fit_method)
    doc = {
        **described(plan, hw),
        "engine": eng.as_dict(),
        "coverage": cov.as_dict(),
        "collective_latency_source": lat.central.description,
        "collective_latency_kind": lat.kind,
        "collective_latency_kernel": lat.kernel or None,
        "single_stream": {
            "ms_per_token": ss["step_ms"],
            "tok_per_s": ss["tok_per_s"],
            "breakdown_ms": bd,
            "bound": ss["bound"],
            "collectives_per_token": sum(c["count"] for c in ss["collectives"]),
            "top_collectives": ss["collectives"][:5],
            "kernel_efficiency": ss["kernel_efficiency"],
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
        "memory": memory_statement(stored, hw["memory_GB"], layout.tp, fits),
        "fitted": fitted,
        "conditions": {
            "phase": "decode",
            "context_tokens": k.context,
            "knobs": asdict(kc),
            "kernels_per_step": kernels_per_step(plan.model),
            "kernels_per_site": KERNELS,
            "engine": eng.describe(),
            "model": "analytic (tpcomm predict): not a measurement",
            "vllm_version_followed": VLLM_VERSION_FOLLOWED,
        },
        "assumptions": _assumptions(ri, kc, plan, fitted, eng),
    }
    if what_if:
        from tpcomm.predict.whatif import what_ifs

        doc["what_if"] = what_ifs(model, plan, hw, k, ri, (ss, corners), eng)
        for w in doc["what_if"]:  # a what-if whose weights do not fit gets no tok/s either
            if w.get("fits_memory") is False:
                w["tok_per_s"] = w["tok_per_s_range"] = w["delta_pct"] = w["delta_pct_range"] = None
                w.pop("baseline_tok_per_s", None)
    if not fits:
        withhold_throughput(doc)
    return doc


HEADROOM_WARN = 0.05  # warn when the weights leave less than this share of the 90% budget


def memory_statement(stored: float, memory_GB: float, tp: int, fits: bool) -> dict:
    """Weights per GPU against 90% of its memory: fits or not, and a warning under 5% headroom."""
    budget = 0.9 * memory_GB * 1e9
    headroom = (budget - stored) / budget
    out = {"weights_stored_per_gpu_GB": stored / 1e9, "fits_90pct": fits, "headroom_pct": 100 * headroom}
    if not fits:
        out["statement"] = (
            f"DOES NOT FIT: {stored / 1e9:.0f} GB of weights per GPU at TP {tp} against 90% of {memory_GB:g} GB "
            f"({budget / 1e9:.1f} GB); no throughput and no verdict are given (exit code {EXIT_DOES_NOT_FIT}); the "
            "per-token terms below are what the model gives if it did."
        )
    elif headroom < HEADROOM_WARN:
        out["statement"] = (
            f"WARNING: the weights fit with {100 * headroom:.1f}% headroom: {stored / 1e9:.1f} GB per GPU of the "
            f"{budget / 1e9:.1f} GB budget (90% of {memory_GB:g} GB), under {100 * HEADROOM_WARN:.0f}%: little room "
            "is left for the KV cache, activations and CUDA graphs."
        )
        out["warning"] = out["statement"]
    else:
        out["statement"] = f"The weights fit: {stored / 1e9:.1f} GB per GPU of {memory_GB:g} GB."
    return out


EXIT_DOES_NOT_FIT = 3  # `tpcomm predict` exit code when the layout's weights do not fit (docs/predict.md)


def withhold_throughput(doc: dict) -> None:
    """A layout whose weights do not fit gets no tok/s: every throughput figure of it is set to None (the
    per-token terms stay, labelled as what the model gives if it did); what-ifs that fit keep their tok/s."""
    doc["single_stream"]["tok_per_s"] = None
    doc["range"]["single_stream"]["tok_per_s"] = None
    for key in ("comm_only_tok_per_s", "compute_only_tok_per_s"):
        doc["ceilings"][key] = None
    b = doc["range"]["bounds"]
    b["tok_per_s"] = b["compute_only_tok_per_s_max"] = b["comm_only_tok_per_s_max"] = None
    b["statement"] = "No throughput bounds: the weights do not fit."
    for x in doc["batches"]:
        x["tok_per_s"] = x["tok_per_s_range"] = None
    for c in doc["range"]["corners"]:
        c["tok_per_s"] = None
    for w in doc.get("what_if", []):  # a change against a throughput not given is not given either
        w["delta_pct"] = w["delta_pct_range"] = None


def engine_on(eng, hw: dict):
    """The engine as it runs on this hardware: vLLM's CPU platform forces async scheduling off."""
    if hw["link"]["type"] == "shm" and eng.runner == "vllm-v1-async":
        sync = resolve_engine(f"vllm-{eng.version}-no-async" if eng.version else "vllm-no-async")
        return replace(sync, name=eng.name, notes=(*eng.notes, "vLLM's CPU platform forces async scheduling off"))
    return eng


def decide_commands(model, world: int, gpu: str, out: str | None, engine: str | None = None) -> dict:
    run = out or "RUN_DIR"
    eng = f" --engine {engine}" if engine else ""
    return {
        "probe": f"tpcomm probe --gpus {world} --model {model} --out {run}, then tpcomm predict --model {model} --tp {world} "
        f"--gpu {gpu}{eng} --probe {run}",
        "attribute": f"tpcomm attribute --server-url URL --out {run} (server started with VLLM_PLUGINS=tpcomm), then "
        f"tpcomm predict --model {model} --tp {world} --gpu {gpu}{eng} --attribution {run}",
    }


def _fitted(k: Knobs, fitted_to: dict[int, float], m, method: str | None = None) -> list[dict]:
    """The extra terms and what they were fitted to; a term given without --fitted-to is labelled as given."""
    pts = ", ".join(f"{v:g} tok/s at batch {b}" for b, v in sorted(fitted_to.items()))
    how = (
        f"fitted to measured {pts}" + (f" ({method})" if method and method != "exact" else "")
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


def _assumptions(ri, kc: Knobs, plan, fitted: list[dict], eng) -> list[str]:
    me, ko, rp, ho = ri.memory_efficiency, ri.kernel_overhead_us, ri.ramp_us, ri.host_ms
    n_k = kernels_per_step(plan.model)
    n_gemm = sum(c.kernels for c in weight_components(plan.model, plan.layout, 1, plan.vocab_parallel))
    out = [
        f"engine {eng.describe()} ({ho.source})",
        f"memory efficiency {me.low:g}-{me.high:g} of datasheet bandwidth, central {me.central:g} ({me.source})",
        f"GEMM ramp {rp.low:g}-{rp.high:g} us, central {rp.central:g} us, x {n_gemm:.0f} weight kernels per step: "
        f"kernel efficiency falls as TP shrinks each kernel ({rp.source})",
        f"launch gap {ko.low:g}-{ko.high:g} us, central {ko.central:g} us, x {n_k:.0f} kernels per step ({ko.source})",
    ]
    kv = ri.kv_efficiency
    out.append(
        f"KV efficiency {kv.low:g}-{kv.high:g} of datasheet bandwidth for decode attention, central {kv.central:g} ({kv.source})"
    )
    if ri.quant_kernel_factor is not None:
        q = ri.quant_kernel_factor
        out.append(
            f"quantized GEMMs at {q.low:g}-{q.high:g} x the memory efficiency, central {q.central:g} ({q.source})"
        )
    if ri.moe_layer_us is not None:
        mo = ri.moe_layer_us
        out.append(
            f"MoE fixed cost {mo.low:g}-{mo.high:g} us per MoE layer, central {mo.central:g} "
            f"(kernel backend {ri.moe_backend}: {mo.source})"
        )
    if ri.launch_us is not None:
        la = ri.launch_us
        out.append(
            f"eager launch {la.low:g}-{la.high:g} us per kernel, central {la.central:g}; a step is host + max(launch, "
            f"GPU) ({la.source})"
        )
    return out + [
        f"collective latency low: {ri.latency.descriptions['low']}",
        f"collective latency central: {ri.latency.descriptions['central']}",
        f"collective latency high: {ri.latency.descriptions['high']}",
        f"KV read at {kc.context} context tokens per sequence",
        "routed experts: uniform routing, E*(1-(1-k/E)^B) distinct experts per step",
        *[f["text"] for f in fitted],
    ]


def _check_knobs(k: Knobs, allreduce_us):
    """Every bad knob at once."""
    bad: list[str] = []
    checks = {
        "--memory-efficiency": (k.memory_efficiency, 0, 1),
        "--kv-efficiency": (k.kv_efficiency, 0, 1),
        "--compute-efficiency": (k.compute_efficiency, 0, 1),
    }
    for name, (v, lo, hi) in checks.items():
        if v is not None and not (lo < v <= hi):
            bad.append(f"{name} {v} is out of range (expected a fraction in ({lo}, {hi}])")
    for name, v in (
        ("--kernel-overhead-us", k.kernel_overhead_us),
        ("--ramp-us", k.ramp_us),
        ("--host-ms", k.host_ms),
        ("--moe-layer-us", k.moe_layer_us),
        ("--launch-us", k.launch_us),
        ("--moe-penalty-us", k.moe_penalty_us),
        ("--context", k.context),
    ):
        if v is not None and v < 0:
            bad.append(f"{name} {v} is negative (expected a value >= 0)")
    if k.moe_bw_factor < 1:
        bad.append(f"--moe-bw-factor {k.moe_bw_factor} is below 1 (expected a factor >= 1, 1 = roofline)")
    if allreduce_us is not None and allreduce_us <= 0:
        bad.append(f"--allreduce-us {allreduce_us} is not positive (expected microseconds > 0)")
    if len(bad) == 1:
        what, _, rest = bad[0].partition(" is ")
        problem, _, expected = rest.partition(" (expected ")
        raise InputError(what, "is " + problem, expected.rstrip(")"))
    if bad:
        raise InputError("options", "; ".join(bad))
