"""`tpcomm plan`: parse options, build the plan, print it (table or JSON)."""

from __future__ import annotations

import json
import re

import click

from tpcomm.cli_common import batch_option, layout_options, model_option, out_option
from tpcomm.rundir import contract as C


@click.command("plan")
@model_option
@layout_options
@batch_option
@click.option(
    "--sm",
    default=None,
    metavar="X.Y",
    help="Compute capability of the target GPU (9.0 H100/H200, 10.0 B200, 12.0 RTX PRO 6000): judges vLLM's "
    "FlashInfer all-reduce + RMSNorm fusion (SM 9.0/10.x). Omitted: not judged.",
)
@click.option(
    "--flashinfer/--no-flashinfer",
    default=None,
    help="Whether FlashInfer is usable in the server (vLLM's has_flashinfer(): installed, with flashinfer-cubin "
    "or nvcc and ninja); the fusion needs it. Omitted: not known, judged as if usable and said so.",
)
@click.option(
    "--nnodes",
    type=click.IntRange(min=1),
    default=None,
    help="Nodes the layout spans (vLLM's --nnodes: world size / N consecutive ranks per node): marks the "
    "collectives that cross the inter-node network.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@out_option
def plan(model, tp, ep, dp, pp, dcp, batch, sm, flashinfer, nnodes, as_json, out):
    """The exact collectives vLLM issues per decode step (op, group, bytes at
    batch B, count, site), the weight bytes each GPU reads per token, and the
    KV-cache bytes per context token. Derived from vLLM 0.32's model code."""
    from tpcomm.plan import build_plan
    from tpcomm.plan.format import format_plan

    if sm is not None and not re.fullmatch(r"\d{1,2}\.\d", sm):
        raise click.UsageError(f"--sm {sm!r} is not a compute capability such as 9.0 or 12.0")
    p = build_plan(model, tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp, batches=list(batch), sm=sm, flashinfer=flashinfer)
    doc = p.to_dict()
    if nnodes:
        from tpcomm.plan.nodes import annotate

        annotate(doc, p.layout, nnodes)
    if out:
        from tpcomm.rundir.layout import RunDir

        rd = RunDir(out)
        rd.record_command("plan")
        rd.write_json(C.PLAN, doc)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    from tpcomm.plan.nodes import format_nodes

    click.echo("\n".join([format_plan(doc), *format_nodes(doc)]))
