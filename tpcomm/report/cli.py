"""`tpcomm report RUN_DIR`: parse, hand off to tpcomm.report.render."""

from __future__ import annotations

import json

import click


@click.command("report")
@click.argument("run_dir", type=click.Path(file_okay=False, dir_okay=True))
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="PDF path to write (default RUN_DIR/report.pdf); the Markdown twin goes beside it.")
@click.option("--no-markdown", is_flag=True, default=False, help="Write only the PDF.")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="Also print the verdict and per-section availability as JSON (what the report says, as data).")
def report(run_dir: str, out: str | None, no_markdown: bool, as_json: bool) -> None:
    """Render RUN_DIR (written by plan/predict/topo/probe/attribute) into report.pdf and report.md.

    Sections without data say "not measured" and name the command that measures them.
    """
    from pathlib import Path

    from tpcomm.report.analysis import analyze
    from tpcomm.report.markdown import render_markdown
    from tpcomm.report.pdf import render_pdf
    from tpcomm.rundir import RunDir

    rd = RunDir(run_dir, create=False)
    rep = analyze(rd.path)
    pdf = render_pdf(rep, Path(out) if out else rd.path / "report.pdf")
    md = None if no_markdown else render_markdown(rep, pdf.with_suffix(".md"))
    if as_json:
        click.echo(json.dumps({"pdf": str(pdf), "markdown": str(md) if md else None,
                               "verdict": {k: rep.verdict.get(k) for k in ("source", "numbers", "sentences")},
                               "sections": {k: {"available": s.available, "not_measured": s.not_measured} for k, s in rep.sections.items()}},
                              indent=2, default=str))
        return
    for line in rep.verdict.get("sentences", []):
        click.echo(line)
    missing = [k for k, s in rep.sections.items() if not s.available]
    click.echo(f"wrote {pdf}" + (f" and {md}" if md else "") + (f" (not measured: {', '.join(missing)})" if missing else ""))
