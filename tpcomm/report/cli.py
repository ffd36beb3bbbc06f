"""`tpcomm report RUN_DIR`: parse, hand off to tpcomm.report.render."""

from __future__ import annotations

import json

import click


@click.command("report")
@click.argument("run_dir", type=click.Path(file_okay=False, dir_okay=True))
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False),
    default=None,
    help="PDF path to write (default RUN_DIR/report.pdf); the Markdown twin goes beside it.",
)
@click.option("--no-markdown", is_flag=True, default=False, help="Write only the PDF.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=False,
    help="Also print the verdict and per-section availability as JSON (what the report says, as data).",
)
def report(run_dir: str, out: str | None, no_markdown: bool, as_json: bool) -> None:
    """Render RUN_DIR (written by plan/predict/topo/probe/attribute) into report.pdf and report.md.

    Sections without data say "not measured" and name the command that measures them.
    """
    from pathlib import Path

    from tpcomm.errors import InputError
    from tpcomm.report.analysis import analyze
    from tpcomm.report.markdown import render_markdown
    from tpcomm.report.output import check_target
    from tpcomm.report.pdf import render_pdf
    from tpcomm.rundir import contract
    from tpcomm.rundir.layout import RunDir
    from tpcomm.rundir.results import to_json

    rd = RunDir(run_dir, create=False)
    if not any(rd.exists(s) for s in contract.ALL.values() if s.format != "aux"):
        raise InputError(
            f"run directory {rd.path}",
            "holds no file written by tpcomm: nothing to report",
            "a folder written by tpcomm plan/predict/topo/probe/attribute/demo with --out",
        )
    target = check_target(Path(out) if out else rd.path / "report.pdf")
    if not no_markdown:
        check_target(target.with_suffix(".md"), option="the Markdown twin")
    rep = analyze(rd.path)
    try:
        pdf = render_pdf(rep, target)
        md = None if no_markdown else render_markdown(rep, pdf.with_suffix(".md"))
    except OSError as e:  # a full disk, a file made read-only meanwhile: one line, not a traceback
        raise InputError(f"--out {target}", f"cannot be written ({e.strerror or e})", "a writable path") from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "pdf": str(pdf),
                    "markdown": str(md) if md else None,
                    # Numbers as numbers (tpcomm.rundir.results' types as JSON), the sentences as printed.
                    "page_one": to_json(
                        {
                            k: getattr(rep.verdict, k)
                            for k in ("source", "headline", "numbers", "sentences", "verdict", "levers", "bounds")
                        }
                    ),
                    "sections": {
                        k: {"available": s.available, "not_measured": s.not_measured, "unreadable": s.unreadable}
                        for k, s in rep.sections.items()
                    },
                    "errors": rep.errors,
                },
                indent=2,
                default=str,
            )
        )
    else:
        for line in rep.verdict.sentences:
            click.echo(line)
        missing = [k for k, s in rep.sections.items() if not s.available]
        click.echo(
            f"wrote {pdf}"
            + (f" and {md}" if md else "")
            + (f" (not measured: {', '.join(missing)})" if missing else "")
        )
    if rep.errors:
        # The report is written (every other section rendered); the unreadable files are named, exit 2.
        for line in rep.errors.values():
            click.echo(f"Error: {line}", err=True)
        raise SystemExit(2)
