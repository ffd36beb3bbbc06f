"""`tpcomm attribute`: parse options, run `Attribute`, print tables (rich) or JSON."""

from __future__ import annotations

import json
import sys
import time

import click

from tpcomm import redact
from tpcomm.errors import InputError


def _int_list(ctx, param, value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers (e.g. 1,4,16)") from None
    if not out or any(v < 1 for v in out):
        raise click.BadParameter("concurrency levels must be integers >= 1 (e.g. 1,4,16)")
    if twice := sorted({v for v in out if out.count(v) > 1}):
        # a level is named by its concurrency and repeat (sessions, windows, records): --repeat measures again
        raise click.BadParameter(
            f"{value!r} names concurrency {', '.join(map(str, twice))} twice: each level once (--repeat N "
            "measures every level N times)"
        )
    return out


class _UserError(click.ClickException):
    """A user mistake: one line, exit 2, also under click's CliRunner."""

    exit_code = 2


@click.command("attribute")
@click.option(
    "--server-url",
    default=None,
    help="Base URL of the vLLM OpenAI-compatible server, e.g. http://localhost:8000 (required unless --reanalyse).",
)
@click.option(
    "--reanalyse",
    "reanalyse",
    type=click.Path(file_okay=False),
    default=None,
    help="Redo the analysis of an existing run directory from its own records (no server; e.g. after a tpcomm upgrade).",
)
@click.option("--model", default=None, help="Served model name (default: the only model the server serves).")
@click.option(
    "--api-key", default=None, envvar="OPENAI_API_KEY", help="The server's --api-key (also read from OPENAI_API_KEY)."
)
@click.option(
    "--concurrency",
    default="1,4",
    callback=_int_list,
    show_default=True,
    help="Comma-separated concurrency levels (closed loop: C requests in flight).",
)
@click.option(
    "--requests",
    "n_requests",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests per round of each level.",
)
@click.option(
    "--input-len", type=click.IntRange(min=1), default=32, show_default=True, help="Prompt tokens per request."
)
@click.option(
    "--output-len",
    type=click.IntRange(min=2),
    default=64,
    show_default=True,
    help="Output tokens per request (ignore_eos, so every request decodes exactly this many).",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run the whole ladder this many times; repeats of a level that disagree are flagged.",
)
@click.option(
    "--api",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
    help="OpenAI endpoint to drive.",
)
@click.option(
    "--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Warm-up requests (not recorded)."
)
@click.option(
    "--max-rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Rounds a level may run to become steady.",
)
@click.option(
    "--steady-pct",
    type=float,
    default=10.0,
    show_default=True,
    help="A level is steady when its halves agree within this many percent.",
)
@click.option(
    "--spread-pct",
    type=float,
    default=10.0,
    show_default=True,
    help="Repeats of a level differing by more than this many percent are flagged.",
)
@click.option("--profile", is_flag=True, help="Also capture a torch-profiler trace (server needs --profiler-config).")
@click.option(
    "--profile-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The server's torch_profiler_dir (where --profile finds the per-rank traces).",
)
@click.option(
    "--model-config",
    type=click.Path(exists=True),
    default=None,
    help="The model's config.json or folder for the plan cross-check, instead of the config the server reports.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Per-request timeout (s).",
)
@click.option(
    "--ca-cert",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="https: a PEM file with the CA certificate that signed the server's (e.g. a self-signed one). "
    "SSL_CERT_FILE=FILE works too.",
)
@click.option(
    "--insecure", is_flag=True, help="https: do not verify the server's certificate (says so on the terminal)."
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Run directory (default: runs/attribute-<time>).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result document as JSON instead of tables.")
def attribute(
    server_url,
    reanalyse,
    model,
    api_key,
    concurrency,
    n_requests,
    input_len,
    output_len,
    repeat,
    api,
    warmup,
    max_rounds,
    steady_pct,
    spread_pct,
    profile,
    profile_dir,
    model_config,
    timeout_s,
    ca_cert,
    insecure,
    out,
    as_json,
):
    """Drive load on a vLLM server and split each token's latency into compute,
    collective transfer, collective wait (rank skew) and host overhead.

    Needs the tpcomm plugin in the server for the split (TPCOMM_HOOK=1);
    without it the client-side figures are still measured and written.
    """
    from tpcomm.attribute.load import LoadSpec
    from tpcomm.attribute.run import Attribute, AttributeConfig, reanalyse_run_dir
    from tpcomm.attribute.show import RichProgress, render

    if reanalyse:
        if server_url:
            raise click.UsageError("--reanalyse reads a run directory: give it without --server-url")
        try:
            res = reanalyse_run_dir(reanalyse, model_config, argv=sys.argv)
        except InputError as e:
            raise _UserError(redact.text(str(e))) from None
        click.echo(json.dumps(res, indent=2, default=str)) if as_json else render(res)
        return
    if not server_url:
        raise click.UsageError("--server-url is required (or --reanalyse RUN_DIR to redo an existing run's analysis)")

    spec = LoadSpec(
        api=api,
        input_len=input_len,
        output_len=output_len,
        requests=n_requests,
        warmup=warmup,
        max_rounds=max_rounds,
        steady_pct=steady_pct,
        spread_pct=spread_pct,
        timeout_s=timeout_s,
    )
    cfg = AttributeConfig(
        server_url=server_url,
        out=out or f"runs/attribute-{time.strftime('%Y%m%d-%H%M%S')}",
        model=model,
        api_key=api_key,
        concurrency=concurrency,
        repeat=repeat,
        spec=spec,
        profile=profile,
        profile_dir=profile_dir,
        model_config=model_config,
        ca_cert=ca_cert,
        insecure=insecure,
    )
    if insecure:
        click.echo(f"warning: --insecure: the TLS certificate of {server_url} is not verified", err=True)
    progress = None if as_json else RichProgress()
    att = Attribute(cfg, progress)
    try:
        res = att.run(argv=sys.argv)
    except InputError as e:
        raise _UserError(redact.text(str(e))) from None
    except KeyboardInterrupt:
        if att.rd is None:  # before the run directory was made: nothing measured, nothing written
            click.echo("Error: interrupted (Ctrl-C) before the run began: nothing was measured", err=True)
        else:  # a second Ctrl-C during the first one's clean-up
            click.echo(f"Error: interrupted twice (Ctrl-C): {att.rd.path}/status.json may still say running", err=True)
        raise SystemExit(130) from None
    finally:
        if progress:
            progress.close()

    res = redact.scrub(json.loads(json.dumps(res, default=str)))
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        render(res)
    if not res["complete"]:
        why = res.get("incomplete_reason") or "; ".join(res["notes"][-1:])
        if res.get("interrupted"):
            click.echo(f"Error: {why}: the run is incomplete; what was measured is in {res['run_dir']}", err=True)
            raise SystemExit(130)
        raise click.ClickException(f"{why}: the run is incomplete; what was measured is in {res['run_dir']}")
