"""`tpcomm predict`: parse options, run the analytic model, print it."""

from __future__ import annotations

import json

import click

from tpcomm.cli_common import IntList, batch_option, layout_options, model_option, out_option
from tpcomm.predict.engine import FORMS
from tpcomm.predict.hardware import INTERCONNECTS, profile_names
from tpcomm.predict.kernels import RAMP_US
from tpcomm.predict.model import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_CONTEXT,
    DEFAULT_KERNEL_OVERHEAD_US,
    DEFAULT_MEMORY_EFFICIENCY,
)
from tpcomm.predict.ranges import KERNEL_OVERHEAD_RANGE_US, MEMORY_EFFICIENCY_RANGE
from tpcomm.rundir import contract as C

GPU_HELP = (
    "Hardware profile (required): "
    + ", ".join(profile_names())
    + ", or a JSON profile file (memory_bandwidth_GBps, memory_GB, bf16_tflops, link {type, p2p, p2p_GBps}). "
    "An ambiguous name (a100, h100) is refused with the choices."
)


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


class FittedPoints(click.ParamType):
    """batch:tok/s pairs: "1:61.3,32:464"."""

    name = "points"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        out = {}
        for tok in str(value).replace(",", " ").split():
            b, _, v = tok.partition(":")
            try:
                b, v = int(b), float(v)
            except ValueError:
                self.fail(f"{tok!r} is not batch:tok/s (expected e.g. 1:61.3,32:464)", param, ctx)
            if b < 1 or not (0 < v < float("inf")):
                self.fail(f"{tok!r} needs a batch >= 1 and tok/s > 0 (expected e.g. 1:61.3,32:464)", param, ctx)
            out[b] = v
        return out


@click.command("predict")
@model_option
@layout_options
@click.option("--gpu", default=None, help=GPU_HELP)
@click.option(
    "--engine",
    default=None,
    metavar="ENGINE",
    help=f"Serving engine and version: {FORMS}. Sets the host time per step, eager launch costs and the all-reduce "
    "kernel [default: the installed vLLM, else the version tpcomm's plan follows].",
)
@click.option(
    "--interconnect",
    type=click.Choice(list(INTERCONNECTS)),
    default=None,
    help="Replace the profile's GPU-GPU link.",
)
@click.option(
    "--allreduce-us", type=float, default=None, help="All-reduce latency per call in us (overrides the NCCL model)."
)
@click.option(
    "--probe",
    "probe_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="A tpcomm probe run directory: collective latency from its fitted model (preferred over everything).",
)
@batch_option
@click.option(
    "--context",
    type=int,
    default=DEFAULT_CONTEXT,
    show_default=True,
    help="Context tokens per sequence (KV-cache reads).",
)
@click.option(
    "--memory-efficiency",
    type=float,
    default=None,
    help=f"Fraction of datasheet memory bandwidth reached by weight streaming, fixed [default: the range "
    f"{MEMORY_EFFICIENCY_RANGE[0]:g}-{MEMORY_EFFICIENCY_RANGE[2]:g}, central {DEFAULT_MEMORY_EFFICIENCY:g} (assumption), "
    "or the profile's range].",
)
@click.option(
    "--kernel-overhead-us",
    type=float,
    default=None,
    help=f"Launch gap per kernel (CUDA-graph replay), fixed [default: the range {KERNEL_OVERHEAD_RANGE_US[0]:g}-"
    f"{KERNEL_OVERHEAD_RANGE_US[2]:g} us, central {DEFAULT_KERNEL_OVERHEAD_US:g} us on GPUs (assumption), the profile's "
    "range on cpu; tpcomm attribute measures the whole step].",
)
@click.option(
    "--ramp-us",
    type=float,
    default=None,
    help=f"Fixed ramp per weight GEMM (kernel efficiency falls with bytes per kernel), fixed [default: {RAMP_US[0]:g}-"
    f"{RAMP_US[2]:g} us, central {RAMP_US[1]:g} (assumption)].",
)
@click.option(
    "--kv-efficiency",
    type=float,
    default=None,
    help="Fraction of datasheet bandwidth decode attention reads the KV cache at, fixed [default: the fitted range].",
)
@click.option(
    "--host-ms", type=float, default=None, help="Engine host time per decode step, fixed [default: the engine's range]."
)
@click.option(
    "--moe-layer-us",
    type=float,
    default=None,
    help="Fixed MoE-kernel cost per MoE layer, fixed [default: the range for the checkpoint's kernel backend and dtype].",
)
@click.option(
    "--launch-us",
    type=float,
    default=None,
    help="Eager engines: host launch cost per kernel, fixed [default: the engine's range].",
)
@click.option(
    "--compute-efficiency",
    type=float,
    default=DEFAULT_COMPUTE_EFFICIENCY,
    show_default=True,
    help="Fraction of dense BF16 peak reached by decode GEMMs (assumption).",
)
@click.option(
    "--moe-penalty-us",
    type=float,
    default=0.0,
    show_default=True,
    help="Extra term: us per MoE layer per step (a slow MoE kernel path, e.g. W4A4 FP4).",
)
@click.option(
    "--moe-bw-factor",
    type=float,
    default=1.0,
    show_default=True,
    help="Extra term: routed-expert weight streaming takes this many times its roofline time.",
)
@click.option(
    "--fitted-to",
    type=FittedPoints(),
    default=None,
    metavar="B:TOK_S,...",
    help="Measured points as batch:tok/s (e.g. 1:61.3,32:464) that the MoE extra terms are fitted to: without "
    "--moe-penalty-us/--moe-bw-factor tpcomm fits them (2 points: both, 1 point: the penalty); with them, they are "
    "labelled as fitted to these points. Either way the output says 'fitted to' and never calls them predictions.",
)
@click.option(
    "--attribution",
    "attribution_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="A tpcomm attribute run directory: anchor the model on its measured per-token compute, collective and host "
    "terms and answer the what-ifs from them.",
)
@click.option(
    "--compare-model", default=None, metavar="MODEL", help="A second checkpoint to compare with (same layout)."
)
@click.option(
    "--measured", type=FloatList(), default=None, help="Measured tok/s of --model and --compare-model, e.g. 82,61.3."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@out_option
def predict(
    model,
    tp,
    ep,
    dp,
    pp,
    dcp,
    gpu,
    engine,
    interconnect,
    allreduce_us,
    probe_dir,
    batch,
    context,
    memory_efficiency,
    kernel_overhead_us,
    ramp_us,
    kv_efficiency,
    host_ms,
    moe_layer_us,
    launch_us,
    compute_efficiency,
    moe_penalty_us,
    moe_bw_factor,
    fitted_to,
    attribution_dir,
    compare_model,
    measured,
    as_json,
    out,
):
    """Analytic per-token decode time: the engine's host time per step + weight
    bytes / (efficiency x bandwidth) with a fixed ramp per GEMM (kernel efficiency
    falls as TP shrinks each kernel) + KV reads + collectives x the latency of the
    all-reduce kernel the engine picks + launch gaps + a fixed cost per MoE layer
    by kernel backend and dtype (eager engines: host + max(launch, GPU)). Every
    model-based number is a range over the uncertain inputs, each with its public
    source, and a verdict is given only where the whole range agrees; a layout that
    does not fit says so first and gets none. --probe or --allreduce-us replace the
    latency range with this hardware's own number; --attribution anchors the model
    on a measured run. Every input and its source is listed in `assumptions`;
    docs/predict.md has the validation table against public measurements."""
    from tpcomm.plan.layout import Layout
    from tpcomm.predict import Knobs
    from tpcomm.predict import predict as run
    from tpcomm.predict.format import format_predict

    k = Knobs(
        memory_efficiency=memory_efficiency,
        compute_efficiency=compute_efficiency,
        context=context,
        kernel_overhead_us=kernel_overhead_us,
        ramp_us=ramp_us,
        kv_efficiency=kv_efficiency,
        host_ms=host_ms,
        moe_layer_us=moe_layer_us,
        launch_us=launch_us,
        moe_penalty_us=moe_penalty_us,
        moe_bw_factor=moe_bw_factor,
    )
    lay = Layout(tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp)
    if attribution_dir:
        from tpcomm.predict.calibrate import predict_calibrated
        from tpcomm.predict.format import format_calibrated

        if compare_model or measured or probe_dir:
            raise click.UsageError("--attribution answers from a measured run: drop --compare-model/--measured/--probe")
        doc = predict_calibrated(model, attribution_dir, lay, gpu=gpu, batches=batch, knobs=k, engine=engine)
        _write(out, doc)
        click.echo(json.dumps(doc, indent=2) if as_json else format_calibrated(doc))
        return
    doc = run(
        model,
        lay,
        gpu=gpu,
        interconnect=interconnect,
        batches=batch,
        allreduce_us=allreduce_us,
        probe=probe_dir,
        knobs=k,
        fitted_to=fitted_to,
        out=out,
        engine=engine,
    )
    if measured and not compare_model:
        raise click.UsageError("--measured needs --compare-model (two values: --model's tok/s, then --compare-model's)")
    if measured and len(measured) != 2:
        raise click.UsageError(
            f"--measured takes two values (got {len(measured)}): tok/s of --model, then of --compare-model"
        )
    if compare_model:
        from dataclasses import replace

        from tpcomm.predict.compare import compare_models

        # Both checkpoints without extra terms: those belong to one checkpoint (and may be fitted to it).
        plain = replace(k, moe_penalty_us=0.0, moe_bw_factor=1.0)
        same = dict(
            layout=lay,
            gpu=gpu,
            interconnect=interconnect,
            batches=batch,
            allreduce_us=allreduce_us,
            probe=probe_dir,
            knobs=plain,
            what_if=False,
            engine=engine,
        )
        base = run(model, **same) if doc.get("fitted") else doc
        doc["compare"] = compare_models(
            model, compare_model, base, run(compare_model, **same), lay, measured, engine=engine
        )
    _write(out, doc)
    click.echo(json.dumps(doc, indent=2) if as_json else format_predict(doc))
    if doc["memory"]["fits_90pct"] is False:
        from tpcomm.predict import EXIT_DOES_NOT_FIT

        click.get_current_context().exit(EXIT_DOES_NOT_FIT)  # the layout does not fit: no tok/s (docs/predict.md)


def _write(out, doc):
    if out:
        from tpcomm.rundir.layout import RunDir

        rd = RunDir(out)
        rd.record_command("predict")
        rd.write_json(C.PREDICT, doc)
        from tpcomm.analysis import levers

        levers.store(rd)  # the levers follow the newest of their inputs
