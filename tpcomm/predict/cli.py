"""`tpcomm predict`: parse options, run the analytic model, print it."""

from __future__ import annotations

import json

import click

from tpcomm.cli_common import IntList, batch_option, layout_options, model_option, out_option
from tpcomm.predict.model import (DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_CONTEXT, DEFAULT_KERNEL_OVERHEAD_US,
                                  DEFAULT_MEMORY_EFFICIENCY)

GPU_HELP = ("Hardware profile: rtx-pro-6000, rtx-4090, rtx-5090, l40s, a100-pcie, a100-sxm, h100-pcie, h100-sxm, h200, b200, cpu, "
            "or a JSON profile file (memory_bandwidth_GBps, memory_GB, bf16_tflops, link {type, p2p, p2p_GBps}).")


class FloatList(IntList):
    name = "floats"

    def convert(self, value, param, ctx):
        try:
            vals = [float(t) for t in str(value).replace(",", " ").split()]
        except ValueError:
            self.fail(f"{value!r} is not a list of numbers (expected e.g. 82,61.3)", param, ctx)
        bad = [v for v in vals if not (0 < v < float("inf"))]
        if bad:
            self.fail(f"{bad[0]:g} is not a positive finite number (expected tok/s > 0, e.g. 82,61.3)", param, ctx)
        return vals


@click.command("predict")
@model_option
@layout_options
@click.option("--gpu", default="rtx-pro-6000", show_default=True, help=GPU_HELP)
@click.option("--interconnect", type=click.Choice(["nvlink4", "nvlink5", "pcie4", "pcie5", "pcie-no-p2p"]), default=None,
              help="Replace the profile's GPU-GPU link.")
@click.option("--allreduce-us", type=float, default=None, help="All-reduce latency per call in us (overrides the NCCL model).")
@click.option("--probe", "probe_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="A tpcomm probe run directory: collective latency from its fitted model (preferred over everything).")
@batch_option
@click.option("--context", type=int, default=DEFAULT_CONTEXT, show_default=True, help="Context tokens per sequence (KV-cache reads).")
@click.option("--memory-efficiency", type=float, default=DEFAULT_MEMORY_EFFICIENCY, show_default=True,
              help="Fraction of datasheet memory bandwidth reached by weight streaming (assumption; typical 0.7-0.85).")
@click.option("--kernel-overhead-us", type=float, default=None,
              help=f"Fixed cost per kernel: launch gap + small-kernel ramp [default {DEFAULT_KERNEL_OVERHEAD_US:g} us on GPUs, "
                   "the profile's value on cpu; assumption, measured by tpcomm attribute].")
@click.option("--compute-efficiency", type=float, default=DEFAULT_COMPUTE_EFFICIENCY, show_default=True,
              help="Fraction of dense BF16 peak reached by decode GEMMs (assumption).")
@click.option("--moe-penalty-us", type=float, default=0.0, show_default=True,
              help="Extra term: us per MoE layer per step (a slow MoE kernel path, e.g. W4A4 FP4).")
@click.option("--moe-bw-factor", type=float, default=1.0, show_default=True,
              help="Extra term: routed-expert weight streaming takes this many times its roofline time.")
@click.option("--compare-model", default=None, metavar="MODEL", help="A second checkpoint to compare with (same layout).")
@click.option("--measured", type=FloatList(), default=None, help="Measured tok/s of --model and --compare-model, e.g. 82,61.3.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@out_option
def predict(model, tp, ep, dp, pp, dcp, gpu, interconnect, allreduce_us, probe_dir, batch, context, memory_efficiency,
            kernel_overhead_us, compute_efficiency, moe_penalty_us, moe_bw_factor, compare_model, measured, as_json, out):
    """Analytic per-token decode time: weight bytes / (efficiency x memory
    bandwidth) + collectives x latency + kernels x per-kernel overhead + extra
    terms. Collective latency from --probe, else --allreduce-us, else NCCL's
    own tuning model for the link. Every default and its source is listed in
    the output's `assumptions`."""
    from tpcomm.predict import Knobs, predict as run
    from tpcomm.predict.format import format_predict
    from tpcomm.predict.hardware import load_profile

    prof = load_profile(gpu)
    k = Knobs(memory_efficiency=memory_efficiency, compute_efficiency=compute_efficiency, context=context,
              kernel_overhead_us=kernel_overhead_us if kernel_overhead_us is not None else prof.get("kernel_overhead_us", DEFAULT_KERNEL_OVERHEAD_US),
              moe_penalty_us=moe_penalty_us, moe_bw_factor=moe_bw_factor)
    lay = dict(ep=ep, dp=dp, pp=pp, dcp=dcp)
    doc = run(model, tp=tp, gpu=gpu, interconnect=interconnect, batches=batch, allreduce_us=allreduce_us, probe=probe_dir, knobs=k, **lay)
    if measured and not compare_model:
        raise click.UsageError("--measured needs --compare-model (two values: --model's tok/s, then --compare-model's)")
    if measured and len(measured) != 2:
        raise click.UsageError(f"--measured takes two values (got {len(measured)}): tok/s of --model, then of --compare-model")
    if compare_model:
        from tpcomm.predict.compare import compare_models

        other = run(compare_model, tp=tp, gpu=gpu, interconnect=interconnect, batches=batch, allreduce_us=allreduce_us,
                    probe=probe_dir, knobs=k, what_if=False, **lay)
        doc["compare"] = compare_models(model, compare_model, doc, other, tp, measured, **lay)
    if out:
        from tpcomm.rundir import RunDir

        rd = RunDir(out)
        rd.record_command("predict")
        rd.write_json("predict.json", doc)
    click.echo(json.dumps(doc, indent=2) if as_json else format_predict(doc))
