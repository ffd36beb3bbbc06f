"""`tpcomm topo`: parse and hand off to tpcomm.topo.collect."""

from __future__ import annotations

import json

import click

from tpcomm.rundir import contract as C


@click.command("topo")
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=None,
    help="TP size to judge vLLM's all-reduce paths for (default: every visible GPU; 2 on CPU).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the topo.json document instead of text.")
@click.option(
    "--out", "-o", type=click.Path(file_okay=False), default=None, help="Run directory: writes RUN_DIR/topo.json."
)
def topo(tp, as_json, out):
    """GPUs, PCIe links (current vs max), P2P and NVLink, NUMA and CPU affinity,
    the NCCL/vLLM environment, and which vLLM all-reduce paths this allows.
    Without an NVIDIA driver: says so and shows the CPU topology."""
    from tpcomm.topo.collect import collect_topology, format_topology

    doc = collect_topology(tp=tp)
    if out:
        from tpcomm.rundir.layout import RunDir

        run = RunDir(out)
        run.write_json(C.TOPO, doc)
        run.record_command("topo")
    click.echo(json.dumps(doc, indent=2) if as_json else format_topology(doc))
