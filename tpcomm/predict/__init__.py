"""`tpcomm predict`: the analytic what-if, no GPU needed.

    >>> from tpcomm.predict import predict
    >>> doc = predict("kimi-k2.5", tp=8, gpu="rtx-pro-6000")
    >>> doc["single_stream"]["tok_per_s"]

See model.py for the formula and the sources of every default.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.plan import build_plan
from tpcomm.predict.hardware import load_profile, with_interconnect
from tpcomm.predict.latency import make_source, oneshot_allreduce_us
from tpcomm.predict.model import KERNELS, Knobs, fits_memory, kernels_per_step, step_time

__all__ = ["predict", "Knobs"]


def predict(model, tp: int = 1, gpu: str = "rtx-pro-6000", interconnect: str | None = None, ep: bool = False, dp: int = 1,
            pp: int = 1, dcp: int = 1, batches=(1,), allreduce_us: float | None = None, probe: str | Path | None = None,
            knobs: Knobs | None = None, what_if: bool = True) -> dict:
    k = knobs or Knobs()
    _check_knobs(k, allreduce_us)
    hw = with_interconnect(load_profile(gpu), interconnect)
    if "kernel_overhead_us" in hw and knobs is None:
        k.kernel_overhead_us = hw["kernel_overhead_us"]
    if "memory_efficiency" in hw and knobs is None:
        k.memory_efficiency = hw["memory_efficiency"]
    batches = sorted(set([1, *batches]))
    plan = build_plan(model, tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp, batches=batches)
    lat = make_source(hw["link"], allreduce_us, probe)
    steps = [step_time(plan, b, hw, lat, k) for b in batches]
    ss = steps[0]
    bd = ss["breakdown_ms"]
    coll = bd["collectives"]
    non_coll = ss["step_ms"] - coll
    fits, stored = fits_memory(plan.model, tp, hw, ep)
    doc = {
        "model": {"name": plan.model.name, "source": plan.model.source, "architecture": plan.model.architecture,
                  "quantization": plan.model.quant.description},
        "layout": plan.layout.to_dict(),
        "hardware": {"profile": hw["profile"], "name": hw["name"], "memory_bandwidth_GBps": hw["memory_bandwidth_GBps"],
                     "memory_GB": hw["memory_GB"], "bf16_tflops": hw["bf16_tflops"], "link": hw["link"],
                     "sources": hw.get("sources", {}), "notes": hw.get("notes", [])},
        "collective_latency_source": lat.description,
        "collective_latency_kind": lat.kind,
        "single_stream": {"ms_per_token": ss["step_ms"], "tok_per_s": ss["tok_per_s"], "breakdown_ms": bd, "bound": ss["bound"],
                          "collectives_per_token": sum(c["count"] for c in ss["collectives"]),
                          "top_collectives": ss["collectives"][:5]},
        "ceilings": {"comm_only_tok_per_s": (1e3 / coll) if coll > 0 else None,
                     "compute_only_tok_per_s": 1e3 / non_coll if non_coll > 0 else None,
                     "interconnect_share_of_token": coll / ss["step_ms"]},
        "batches": [{k2: s[k2] for k2 in ("batch", "step_ms", "tok_per_s", "bound", "breakdown_ms")} for s in steps],
        "memory": {"weights_stored_per_gpu_GB": stored / 1e9, "fits_90pct": fits},
        "conditions": {"phase": "decode", "context_tokens": k.context, "knobs": asdict(k),
                       "kernels_per_step": kernels_per_step(plan.model), "kernels_per_site": KERNELS,
                       "model": "analytic (tpcomm predict): not a measurement", "vllm_version_followed": "0.32.0"},
        "assumptions": [
            f"memory efficiency {k.memory_efficiency:g} of datasheet bandwidth (assumption)",
            f"per-kernel overhead {k.kernel_overhead_us:g} us x {kernels_per_step(plan.model):.0f} kernels per step (assumption; measure with tpcomm attribute)",
            f"KV read at {k.context} context tokens per sequence",
            "routed experts: uniform routing, E*(1-(1-k/E)^B) distinct experts per step",
            f"collective latency: {lat.description}",
        ],
    }
    if what_if:
        doc["what_if"] = _what_ifs(model, tp, hw, ep, dp, pp, dcp, k, plan, ss)
    return doc


def _check_knobs(k: Knobs, allreduce_us):
    checks = {"--memory-efficiency": (k.memory_efficiency, 0, 1), "--compute-efficiency": (k.compute_efficiency, 0, 1)}
    for name, (v, lo, hi) in checks.items():
        if not (lo < v <= hi):
            raise InputError(f"{name} {v}", "is out of range", f"a fraction in ({lo}, {hi}]")
    for name, v in (("--kernel-overhead-us", k.kernel_overhead_us), ("--moe-penalty-us", k.moe_penalty_us), ("--context", k.context)):
        if v < 0:
            raise InputError(f"{name} {v}", "is negative", "a value >= 0")
    if k.moe_bw_factor < 1:
        raise InputError(f"--moe-bw-factor {k.moe_bw_factor}", "is below 1", "a factor >= 1 (1 = roofline)")
    if allreduce_us is not None and allreduce_us <= 0:
        raise InputError(f"--allreduce-us {allreduce_us}", "is not positive", "microseconds > 0")


def _what_ifs(model, tp, hw, ep, dp, pp, dcp, k, plan, base) -> list[dict]:
    from tpcomm.predict.latency import LatencySource, nccl_model_us

    out = []
    base_tps = base["tok_per_s"]

    def entry(name, desc, st, **extra):
        out.append({"name": name, "description": desc, "tok_per_s": st["tok_per_s"], "ms_per_token": st["step_ms"],
                    "delta_pct": 100 * (st["tok_per_s"] / base_tps - 1), "breakdown_ms": st["breakdown_ms"], **extra})

    link = hw["link"]
    if link["type"] == "pcie":
        nv = with_interconnect(hw, "nvlink4")
        src = LatencySource("nccl-model", "NCCL model, NVLink4", lambda op, b, n: nccl_model_us(op, b, n, nv["link"])[0])
        entry("nvlink", "NVLink4 (450 GB/s per direction) instead of the current link, NCCL model", step_time(plan, 1, nv, src, k))
    if link["type"] != "shm":
        def oneshot(op, b, n, _l=link):
            return oneshot_allreduce_us(b, n, _l) if op == "all_reduce" else nccl_model_us(op, b, n, _l)[0]
        entry("one-shot-allreduce", "a one-shot custom all-reduce kernel (P2P reads of all peers; vLLM custom AR / FlashInfer PCIe IPC style)",
              step_time(plan, 1, hw, LatencySource("model", "one-shot", oneshot), k))
        if link["type"] == "pcie" and link.get("p2p", True):
            off = with_interconnect(hw, "pcie-no-p2p")
            src = LatencySource("nccl-model", "NCCL model, P2P off", lambda op, b, n: nccl_model_us(op, b, n, off["link"])[0])
            entry("p2p-disabled", "if P2P were disabled (NCCL_P2P_DISABLE=1, IOMMU/ACS, or a GeForce driver): host-staged hops",
                  step_time(plan, 1, off, src, k))
        no_comm = LatencySource("zero", "free", lambda op, b, n: 0.0)
        entry("no-interconnect-cost", "collectives cost nothing (the comm-only bound's complement)", step_time(plan, 1, hw, no_comm, k))
    for t in (1, 2, 4, 8):
        if t == tp:
            continue
        try:
            p2 = build_plan(model, tp=t, ep=ep, dp=dp, pp=pp, dcp=dcp if t % dcp == 0 else 1, batches=[1])
        except InputError as e:
            out.append({"name": f"tp{t}", "description": f"TP {t}: not valid for this model ({e})", "tok_per_s": None, "ms_per_token": None, "delta_pct": None})
            continue
        fits, stored = fits_memory(p2.model, t, hw, ep)
        if link["type"] == "shm":
            continue
        src = LatencySource("nccl-model", "NCCL model", lambda op, b, n: nccl_model_us(op, b, n, link)[0])
        st = step_time(p2, 1, hw, src, k)
        entry(f"tp{t}", f"TP {t} on the same GPUs and link (NCCL model)" + ("" if fits else f"; does NOT fit: {stored / 1e9:.0f} GB of weights per GPU"),
              st, fits_memory=fits)
    return out
