"""The report as Markdown beside the PDF: same blocks as pdf.py, figures as SVG
files in a folder next to it (report_figures/)."""

from __future__ import annotations

from pathlib import Path

from tpcomm.report import figures as F
from tpcomm.report import tables
from tpcomm.report.analysis import Report
from tpcomm.rundir import safefs


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(header, rows, _widths) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_blocks(items, data: dict, figdir: Path) -> list[str]:
    """tables.py's blocks as Markdown paragraphs; figures as SVG files in `figdir` (pdf.py draws the same blocks)."""
    parts: list[str] = []
    for item in items:
        kind = item[0]
        if kind == "text":
            parts.append(item[1])
        elif kind in ("headline", "warning"):
            parts.append(f"**{item[1]}**")
        elif kind == "small":
            parts.append(f"_{item[1]}_")
        elif kind == "table":
            parts.append(_table(*item[1]))
        elif kind == "figure":
            key, caption = item[1], item[2]
            fig = F.ALL[key][1](data)
            if fig is None:
                continue
            # report_figures/ and its files: never through a link planted in a shared run directory
            safefs.write_atomic(figdir.parent, f"{figdir.name}/{key}.svg", F.to_svg_bytes(fig))
            parts.append(f"![{caption or key}]({figdir.name}/{key}.svg)" + (f"\n\n_{caption}_" if caption else ""))
    return parts


def render_markdown(report: Report, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figdir = out.parent / (out.stem + "_figures")
    parts: list[str] = [f"# {tables.title(report)}", f"_Run directory: `{report.run_dir}`_"]

    def missing(sec) -> None:
        parts.extend(f"**Could not read:** {e}" for e in sec.unreadable)
        parts.extend(f"**Not measured:** {m['what']}. Measure it with: `{m['command']}`" for m in sec.not_measured)

    v = report["verdict"]
    parts.append(f"## {v.title}")
    missing(v)
    parts += render_blocks(tables.page_one_blocks(v.data), v.data, figdir)
    for key in ("system", "plan", "probe", "breakdown", "replay", "timeline", "ladder", "what_if", "methods"):
        sec = report[key]
        parts.append(f"## {sec.title}")
        if sec.conditions:
            parts.append(f"_Conditions: {sec.conditions}_")
        missing(sec)
        if not sec.available:
            parts.append("Not measured.")
            continue
        parts += render_blocks(tables.section_blocks(sec), sec.data, figdir)
    safefs.write_atomic(out.parent, out.name, ("\n\n".join(parts) + "\n").encode())
    return out
