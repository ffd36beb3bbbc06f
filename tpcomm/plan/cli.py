"""`tpcomm plan`: parse options, build the plan, print it (table or JSON)."""

from __future__ import annotations

import json

import click

from tpcomm import contract as C
from tpcomm.cli_common import batch_option, layout_options, model_option, out_option


@click.command("plan")
@model_option
@layout_options
@batch_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@out_option
def plan(model, tp, ep, dp, pp, dcp, batch, as_json, out):
    """The exact collectives vLLM issues per decode step (op, group, bytes at
    batch B, count, site), the weight bytes each GPU reads per token, and the
    KV-cache bytes per context token. Derived from vLLM 0.32's model code."""
    from tpcomm.plan import build_plan
    from tpcomm.plan.format import format_plan

    p = build_plan(model, tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp, batches=list(batch))
    doc = p.to_dict()
    if out:
        from tpcomm.rundir import RunDir

        rd = RunDir(out)
        rd.record_command("plan")
        rd.write_json(C.PLAN, doc)
    click.echo(json.dumps(doc, indent=2) if as_json else format_plan(doc))
