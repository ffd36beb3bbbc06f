"""`tpcomm trace`: parse options, run the import (trace/importer.py), print the split."""

from __future__ import annotations

import json
import sys
import time

import click

from tpcomm.errors import InputError


class _UserError(click.ClickException):
    """A user mistake: one line, exit 2, also under click's CliRunner."""

    exit_code = 2


@click.command("trace")
@click.argument("source", type=click.Path())
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Run directory to write trace/ into (default: runs/trace-<time>; with --from-hook: SOURCE itself).",
)
@click.option(
    "--model-config",
    type=click.Path(exists=True),
    default=None,
    help="The model's config.json or folder: collectives per decode step are checked against `tpcomm plan`.",
)
@click.option(
    "--subset",
    is_flag=True,
    help="Analyse the ranks present when the traces are only some ranks of the world (wait is relative to them).",
)
@click.option(
    "--from-hook",
    is_flag=True,
    help="SOURCE is a run directory of `tpcomm attribute`: export its hook records to trace/hook_perfetto.json.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary document as JSON instead of tables.")
def trace(source, out, model_config, subset, from_hook, as_json):
    """Read torch-profiler (Kineto) traces, one per rank, from the folder SOURCE into the same
    per-token split as the tpcomm hook: compute, collective transfer, collective wait, host gap.

    \b
    vLLM writes them with --profiler-config '{"profiler":"torch","torch_profiler_dir":DIR}'
    and POST /start_profile, /stop_profile. Writes RUN_DIR/trace/ (records as the hook's tables,
    steps_by_rank, summary.json, perfetto.json for ui.perfetto.dev).
    """
    from tpcomm.trace import importer

    try:
        if from_hook:
            path = importer.export_hook(out or source)
            click.echo(f"Perfetto trace of the hook's aligned records: {path}")
            return
        out = out or f"runs/trace-{time.strftime('%Y%m%d-%H%M%S')}"
        doc = importer.import_traces(source, out, model_config, subset, argv=sys.argv)
    except InputError as e:
        raise _UserError(str(e)) from None
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    from tpcomm.trace.summary import split_lines

    click.echo("\n".join(split_lines(doc)))
    click.echo(f"Run directory: {out} (trace/summary.json, trace/perfetto.json for ui.perfetto.dev)")
