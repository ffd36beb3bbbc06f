"""The comparison's PDF and Markdown: `render_comparison(cmp, pdf_path)`. The blocks come from
tpcomm/compare/tables.py and are drawn by the report's own renderers (pdf.py, markdown.py); this module only
adds the one figure (B - A per term with its interval) and lays the sections out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reportlab.platypus import CondPageBreak, KeepTogether

from tpcomm.compare.levels import LABELS
from tpcomm.compare.results import Comparison
from tpcomm.compare.tables import sections
from tpcomm.report import figures as F
from tpcomm.report import markdown, pdf
from tpcomm.rundir import safefs
from tpcomm.terms import ENGINE_TERMS

FIG_TERMS = ("per_token", *ENGINE_TERMS, "delivery")


def fig_compare_terms(data: dict[str, Any]):
    """One panel per compared level: B - A of the per-token time and each term, with its interval."""
    levels = [lv for lv in data.get("levels") or [] if lv.term("per_token").diff is not None][:4]
    if not levels:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(F.WIDTH_IN, 0.35 + 1.45 * len(levels)))
    axes = fig.subplots(len(levels), 1, squeeze=False)[:, 0]
    for ax, lv in zip(axes, levels):
        rows = [t for t in (lv.term(n) for n in FIG_TERMS) if t is not None and t.diff is not None]
        ys = list(range(len(rows)))[::-1]
        for y, t in zip(ys, rows):
            solid = t.changed
            color = F.COLORS.get(t.name, "#333333")
            ax.barh([y], [t.diff], color=color, alpha=1.0 if solid else 0.35, height=0.6)
            if t.lo is not None:
                ax.plot([t.lo, t.hi], [y, y], color="black", lw=0.9)
                ax.plot([t.lo, t.lo], [y - 0.18, y + 0.18], color="black", lw=0.9)
                ax.plot([t.hi, t.hi], [y - 0.18, y + 0.18], color="black", lw=0.9)
        ax.axvline(0, color="black", lw=0.6)
        ax.set_yticks(ys, [LABELS[t.name].split(" (")[0] for t in rows], fontsize=6.5)
        ax.set_title(f"C={lv.concurrency}: B - A, ms per token", fontsize=8, loc="left")
        ax.grid(False, axis="y")
    axes[-1].set_xlabel("B - A (ms per token); bar: the difference, whiskers: its interval (simultaneous band)")
    fig.tight_layout()
    return fig


F.ALL.setdefault("compare_terms", ("compare", fig_compare_terms))


def title(cmp: Comparison) -> str:
    return f"tpcomm comparison: {Path(cmp.run_a).name or cmp.run_a} (A) vs {Path(cmp.run_b).name or cmp.run_b} (B)"


def render_comparison(cmp: Comparison, out: str | Path, markdown_too: bool = True) -> tuple[Path, Path | None]:
    """`out` (the PDF) and its Markdown twin beside it (same stem, .md; figures in <stem>_figures/)."""
    out = Path(out)
    data = {"levels": cmp.levels}
    slots: list[dict] = []
    story = [pdf.P(title(cmp), "title")]
    for i, (heading, blocks) in enumerate(sections(cmp)):
        body = pdf._blocks(blocks, data, slots, "verdict" if i == 0 else "body")
        head = [pdf.P(heading, "h1")]
        if i:
            story.append(CondPageBreak(140))
        story += [KeepTogether(head + body[:1])] + body[1:] if body else head
    path = pdf.write_pdf(story, slots, title(cmp), "tpcomm comparison", f"A {cmp.run_a}  B {cmp.run_b}", out)
    md = None
    if markdown_too:
        md = out.with_suffix(".md")
        figdir = md.parent / (md.stem + "_figures")
        parts = [f"# {title(cmp)}"]
        for heading, blocks in sections(cmp):
            parts.append(f"## {heading}")
            parts += markdown.render_blocks(blocks, data, figdir)
        # through safefs: a link planted at compare.md during the run is refused, never written through
        safefs.write_atomic(md.parent, md.name, ("\n\n".join(parts) + "\n").encode())
    return path, md
