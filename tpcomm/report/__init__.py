"""`tpcomm report`: a run directory rendered into a PDF and a Markdown twin.

    from tpcomm.report import render
    pdf, md = render("runs/r1")          # runs/r1/report.pdf, runs/r1/report.md

analysis.py holds every number; pdf.py, markdown.py and figures.py only draw.
"""

from __future__ import annotations

from pathlib import Path


def render(run_dir: str | Path, pdf: str | Path | None = None, markdown: bool = True) -> tuple[Path, Path | None]:
    from tpcomm.report.analysis import analyze
    from tpcomm.report.markdown import render_markdown
    from tpcomm.report.pdf import render_pdf

    report = analyze(run_dir)
    pdf_path = Path(pdf) if pdf else Path(run_dir) / "report.pdf"
    render_pdf(report, pdf_path)
    md_path = render_markdown(report, pdf_path.with_suffix(".md")) if markdown else None
    return pdf_path, md_path
