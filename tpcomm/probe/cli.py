"""`tpcomm probe` (and `tpcomm probe import FILE`, `tpcomm probe --replay`): parse
and hand off to tpcomm.probe.runner / nccl_import / replay.

`--replay` writes probe/replay.json, probe/replay_steps.parquet and
probe/replay_collectives.parquet (described in tpcomm/probe/replay.py)."""

from __future__ import annotations

import json
import sys

import click

from probes.spec import BACKENDS, OPS
from tpcomm.cli_common import IntList
from tpcomm.rundir import contract as C


class _ProbeGroup(click.Group):
    def format_commands(self, ctx, formatter):
        with formatter.section("Subcommands"):
            formatter.write_dl([("import FILE", "Read nccl-tests output (text or JSON) into RUN_DIR/probe/.")])


@click.group("probe", cls=_ProbeGroup, invoke_without_command=True)
@click.option(
    "--gpus",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks to start on this machine (default: every CUDA GPU, or 2 CPU ranks). At most one rank per visible "
    "GPU for GPU backends, one per CPU core for CPU backends (see --oversubscribe). Ignored under torchrun/srun, "
    "where each rank runs `tpcomm probe` and RANK/WORLD_SIZE decide.",
)
@click.option(
    "--oversubscribe",
    is_flag=True,
    help="Allow more CPU ranks than CPU cores (ranks then share cores: timings include the OS scheduler).",
)
@click.option(
    "--backend",
    "backends",
    default="auto",
    show_default=True,
    help=f"Comma list: auto (nccl,pynccl,custom-ar on CUDA; gloo,shm on CPU), all, or of {', '.join(BACKENDS)}. "
    "Ineligible backends are reported with vLLM's reason.",
)
@click.option(
    "--model",
    "-m",
    default=None,
    metavar="MODEL",
    help="Plan source (preset, config.json or folder) whose message sizes are probed. Default, when --sizes "
    "is not given either: the deepseek-v3 preset at TP = ranks, batch 1.",
)
@click.option("--tp", type=click.IntRange(min=1), default=None, help="TP size of the plan (default: number of ranks).")
@click.option(
    "--batch",
    "-b",
    "batches",
    type=IntList(),
    default="1",
    show_default=True,
    help="Decode batch size(s) of the plan: 1 or 1,8,32.",
)
@click.option(
    "--sizes",
    default=None,
    help="Extra sweep in bytes per rank: 14336,1K:64M:x2 (K=1024). Alone (no --model): only these sizes.",
)
@click.option(
    "--ops",
    default=None,
    help=f"Comma list of {', '.join(OPS)} (default: the plan's ops; all_reduce for a bare sweep).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bfloat16", "float16", "float32"]),
    default=None,
    help="Element type of the sweep sizes (default bfloat16; plan sizes keep the plan's).",
)
@click.option(
    "--mode",
    type=click.Choice(["auto", "eager", "graph", "both"]),
    default="auto",
    show_default=True,
    help="Eager launches, inside a captured CUDA graph, or both. auto: both on CUDA, eager on CPU.",
)
@click.option(
    "--iters",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Timed ops per measurement (isolated and pipelined each).",
)
@click.option("--warmup", type=click.IntRange(min=0), default=10, show_default=True, help="Untimed ops before timing.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds without progress before every rank is stopped (a dead or hung rank); rank start-up gets extra time.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False),
    default=None,
    help="Run directory (default runs/probe-DATE-TIME): probe/results.parquet|json, probe/fit.json, topo.json.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON entry per measurement instead of the table.")
@click.option(
    "--replay",
    is_flag=True,
    help="Replay one decode step: the plan's collectives in vLLM's order, each after memory-streaming work of "
    "its layer's size; timed with collectives, compute only and collectives only.",
)
@click.option(
    "--context",
    type=click.IntRange(min=0),
    default=1024,
    show_default=True,
    help="--replay: KV-cache tokens per sequence that every attention layer reads.",
)
@click.option(
    "--work-scale",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="--replay: scale of the bytes streamed between collectives (a CPU cannot stream a large model's shard).",
)
@click.option(
    "--skew-us",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="--replay: a known delay before each collective on one rank (tests the wait split).",
)
@click.option(
    "--skew-rank",
    type=click.IntRange(min=0),
    default=None,
    help="--replay: the rank --skew-us delays (default: the last).",
)
@click.option(
    "--steps", type=click.IntRange(min=1), default=30, show_default=True, help="--replay: timed steps per timing."
)
@click.pass_context
def probe(
    ctx,
    gpus,
    oversubscribe,
    backends,
    model,
    tp,
    batches,
    sizes,
    ops,
    dtype,
    mode,
    iters,
    warmup,
    timeout,
    out,
    as_json,
    replay,
    context,
    work_scale,
    skew_us,
    skew_rank,
    steps,
):
    """Time the model's collectives on the backends vLLM could use, at the
    plan's message sizes: isolated latency (ranks lined up by a tiny collective,
    the backend's own where it allows one, before each op, as a decode step reaches it; the skew left is
    measured and shown) and back-to-back pipelined average, p50/p90/p99, algbw/busbw
    as nccl-tests, a correctness check per measurement, and a fitted latency
    model for `tpcomm predict --probe RUN_DIR`.

    \b
    Examples:
      tpcomm probe --gpus 2                         # deepseek-v3 plan sizes, TP=2, batch 1
      tpcomm probe --gpus 8 --model kimi-k2.5 --batch 1,8,32 --out runs/r1
      tpcomm probe --gpus 2 --backend gloo --sizes 1K:16M:x4
      torchrun --nnodes 2 --nproc-per-node 8 ... -m tpcomm.cli probe --out runs/r2
      tpcomm probe import all_reduce_perf.txt --out runs/r3
      tpcomm probe --replay --gpus 8 --oversubscribe --model kimi-k2.5 --backend gloo --work-scale 1e-4 --out runs/r4
    """
    if ctx.invoked_subcommand is not None:
        return
    if replay:
        return _replay(
            gpus,
            oversubscribe,
            backends,
            model,
            tp,
            batches,
            sizes,
            ops,
            mode,
            warmup,
            timeout,
            out,
            as_json,
            context,
            work_scale,
            skew_us,
            skew_rank,
            steps,
        )
    from tpcomm.probe.launcher import ProbeFailed
    from tpcomm.probe.results import format_table, no_gpu_visible, preempt_notes, slack_notes
    from tpcomm.probe.runner import ProbeConfig, run_probe

    cfg = ProbeConfig(
        gpus=gpus,
        backends=backends.split(","),
        model=model,
        tp=tp,
        batches=batches,
        sizes=sizes,
        ops=ops.split(",") if ops else None,
        dtype=dtype,
        mode=mode,
        iters=iters,
        warmup=warmup,
        timeout=timeout,
        out=out,
        oversubscribe=oversubscribe,
    )
    try:
        res = run_probe(cfg, argv=sys.argv)
    except ProbeFailed as e:
        # exit 1: a measurement failed; what finished is on disk (tpcomm/cli.py exit codes)
        raise click.ClickException(
            f"probe failed: {e}\nMeasurements finished before the failure are kept in "
            f"{e.run_dir or 'the run directory'}."
        ) from None
    if res.run is None:  # a non-zero rank of a joined launch: rank 0 reports
        return
    if as_json:
        click.echo(json.dumps(res.json_entries(), indent=1))
        for line in slack_notes(res.rows)[1:] + preempt_notes(res.rows):  # the warnings; else in the table
            click.echo(line.lstrip("# "), err=True)
    else:
        click.echo(format_table(res.rows, res.skipped, res.conditions))
        click.echo(f"# saved: {res.run.path}/probe/results.parquet, results.json, fit.json; topo.json", err=True)
    if res.nothing_measured:  # state "failed" in status.json; the error names why
        from tpcomm.errors import InputError

        reasons = [str(s.get("reason")) for s in res.skipped]
        if all(no_gpu_visible(s) for s in res.skipped):  # GPU backends asked for on a machine without one
            raise InputError(
                f"--backend {backends}",
                f"nothing was measured on this machine ({reasons[0]})",
                "a backend this machine runs: auto picks gloo,shm on CPU and nccl,pynccl,custom-ar on CUDA",
            )
        raise InputError(
            "probe",
            f"every measurement was skipped, nothing was measured (first reason: {reasons[0]}; the table lists each)",
            "--backend, --ops, --mode and --sizes that this machine's backends run",
        )


def _replay(
    gpus,
    oversubscribe,
    backends,
    model,
    tp,
    batches,
    sizes,
    ops,
    mode,
    warmup,
    timeout,
    out,
    as_json,
    context,
    work_scale,
    skew_us,
    skew_rank,
    steps,
):
    from tpcomm.probe.launcher import ProbeFailed
    from tpcomm.probe.replay import ReplayConfig, run_replay
    from tpcomm.probe.replay_format import format_replay

    if sizes or ops:
        raise click.UsageError("--replay runs the plan's own collectives: drop --sizes/--ops")
    if len(batches) != 1:
        raise click.UsageError(f"--replay replays one batch size; got --batch {','.join(map(str, batches))}")

    def progress(rec):
        if rec.get("kind") == "replay":
            click.echo(f"replay {rec['backend']} {rec['mode']} {rec['timing']}: {rec['steps']} steps done", err=True)

    cfg = ReplayConfig(
        gpus=gpus,
        backends=backends.split(","),
        model=model or "deepseek-v3",
        tp=tp,
        batch=batches[0],
        context=context,
        work_scale=work_scale,
        skew_us=skew_us,
        skew_rank=skew_rank,
        mode=mode,
        steps=steps,
        warmup=min(warmup, 10),
        timeout=timeout,
        out=out,
        oversubscribe=oversubscribe,
    )
    try:
        res = run_replay(cfg, argv=sys.argv, progress=progress)
    except ProbeFailed as e:
        raise click.ClickException(
            f"replay failed: {e}\nTimings finished before the failure are kept in {e.run_dir or 'the run directory'}."
        ) from None
    if res.run is None:
        return
    click.echo(json.dumps(res.doc["results"], indent=1) if as_json else format_replay(res.doc))
    click.echo(f"# saved: {res.run.path}/probe/replay.json, replay_steps.parquet, replay_collectives.parquet", err=True)


@probe.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--op",
    type=click.Choice(list(OPS)),
    default=None,
    help="Collective measured (default: read from the output or file name).",
)
@click.option(
    "--world-size", type=click.IntRange(min=1), default=None, help="Ranks in the test (default: the '# Rank' lines)."
)
@click.option(
    "--out", "-o", type=click.Path(file_okay=False), required=True, help="Run directory to write probe/ into."
)
@click.option("--json", "as_json", is_flag=True, help="Print the imported entries as JSON.")
def import_cmd(file, op, world_size, out, as_json):
    """Read nccl-tests output (plain text or its JSON) into RUN_DIR/probe/ in
    the probe's format, with a fitted latency model."""
    from tpcomm.probe.fit import fit_document
    from tpcomm.probe.nccl_import import import_file
    from tpcomm.probe.results import ProbeResults, format_table
    from tpcomm.rundir.layout import RunDir

    rows = import_file(file, op, world_size)
    run = RunDir(out)
    prev = run.read_json(C.PROBE_RESULTS_JSON) or {}
    res = ProbeResults(
        run,
        {
            **(prev.get("conditions") or {}),
            "imported_from": str(file),
            "world_size": rows[0]["world_size"],
            "hardware": rows[0]["hardware"],
        },
    )
    keep = [r for r in prev.get("results", []) if not (r.get("source") == "nccl-tests" and r["op"] == rows[0]["op"])]
    res.rows = keep + rows
    res.skipped = prev.get("skipped", [])
    res.state = "complete"
    res.write()
    run.write_json(C.PROBE_FIT, fit_document(res.rows, res.conditions))
    run.record_command("probe import")
    run.mark("probe", "complete", measurements=len(res.rows), imported=str(file))
    click.echo(json.dumps(res.json_entries(), indent=1) if as_json else format_table(rows, [], res.conditions))
