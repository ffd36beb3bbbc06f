"""`tpcomm compare RUN_A RUN_B`: parse, hand off to compare_runs, print (rich tables or JSON), write the report."""

from __future__ import annotations

import json
import sys

import click


@click.command("compare")
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for compare.json, compare.pdf and compare.md (created; default: print only).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the comparison as JSON (numbers as numbers) instead of tables."
)
@click.option(
    "--fail-if-slower",
    "fail_if_slower",
    type=click.FloatRange(min=0),
    default=None,
    metavar="PCT",
    help="Exit 1 when B is slower per token than A by more than PCT percent at any level and the change is "
    "resolved (its interval excludes 0): a deployment gate.",
)
@click.option(
    "--again",
    "run_again",
    type=click.Path(file_okay=False),
    default=None,
    metavar="RUN_A2",
    help="A run of RUN_A's configuration made after RUN_B (A, B, A again): what it differs from RUN_A by is the "
    "drift between runs on this host (minutes apart, a restart between), and a difference of B within it is not "
    "called a change.",
)
@click.option(
    "--allow-different-models",
    is_flag=True,
    help="Compare runs of different models (other shapes or architecture); another checkpoint of one model needs no flag.",
)
def compare(
    run_a: str,
    run_b: str,
    out: str | None,
    as_json: bool,
    fail_if_slower: float | None,
    run_again: str | None,
    allow_different_models: bool,
) -> None:
    """What changed between two runs (A before, B after a change), term by term, and whether it is real.

    Per concurrency level both runs measured: the per-token time and tok/s, B - A of every term (compute,
    collective transfer, collective wait, host gap; they add up to the per-token time's B - A) and the
    client's delivery, each with an interval from the runs' own spread; the collective sites side by side;
    what differs in the runs' conditions; their predictions (model-based) when both have predict.json.
    """
    from tpcomm.compare.analysis import compare_runs
    from tpcomm.rundir import contract as C

    cmp = compare_runs(
        run_a,
        run_b,
        allow_different_models=allow_different_models,
        fail_if_slower=fail_if_slower,
        run_again=run_again,
    )
    written = []
    if out:
        from tpcomm.compare.page import render_comparison
        from tpcomm.report.output import check_target
        from tpcomm.rundir.layout import RunDir

        rd = RunDir(out)
        target = check_target(rd / C.COMPARE_PDF)
        check_target(rd / C.COMPARE_MD, option="the Markdown twin")
        rd.record_command("compare")
        written.append(str(rd.write_json(C.COMPARE_JSON, cmp.to_json())))
        written += [str(p) for p in render_comparison(cmp, target) if p]
    if as_json:
        click.echo(json.dumps(cmp.to_json(), indent=2))
    else:
        from tpcomm.compare.show import render

        render(cmp)
        if written:
            click.echo("wrote " + ", ".join(written))
    if cmp.gate is not None and cmp.gate.tripped:
        click.echo(f"--fail-if-slower {cmp.gate.pct:g}: {cmp.gate.statement}", err=True)
        sys.exit(1)
