"""The PDF report: reportlab platypus for text and tables, matplotlib for figures.

Figures stay vector: each is saved by matplotlib as a one-page PDF, platypus
reserves a slot of the right size where it belongs (FigureSlot records the
page and position when it is laid out), and after the build pypdf stamps the
figure page into its slot. Text in both is real text, so the PDF is
searchable. This module only draws; every number comes from analysis.py.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from xml.sax.saxutils import escape

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import (
    CondPageBreak,
    Flowable,
    KeepTogether,
    PageBreak,
    Paragraph,
    SimpleDocTemplate,
    Spacer,
    Table,
    TableStyle,
)

from tpcomm.report import figures as F
from tpcomm.report import tables
from tpcomm.report.analysis import Report
from tpcomm.rundir import safefs

MARGIN = 18 * mm
FRAME_W = A4[0] - 2 * MARGIN
FRAME_H = A4[1] - 2 * MARGIN
_ss = getSampleStyleSheet()
ST = {
    "title": ParagraphStyle("t", parent=_ss["Title"], fontSize=16, spaceAfter=4),
    "h1": ParagraphStyle("h1", parent=_ss["Heading1"], fontSize=13, spaceBefore=6, spaceAfter=4),
    "body": ParagraphStyle("b", parent=_ss["BodyText"], fontSize=9, leading=12),
    "verdict": ParagraphStyle("v", parent=_ss["BodyText"], fontSize=10.5, leading=14, spaceAfter=4),
    "headline": ParagraphStyle(
        "hl", parent=_ss["BodyText"], fontSize=12, leading=15, spaceAfter=3, fontName="Helvetica-Bold"
    ),
    "cond": ParagraphStyle(
        "c", parent=_ss["BodyText"], fontSize=7.5, leading=9.5, textColor=colors.HexColor("#555555")
    ),
    "missing": ParagraphStyle(
        "m", parent=_ss["BodyText"], fontSize=9, leading=12, textColor=colors.HexColor("#8B0000")
    ),
    "cell": ParagraphStyle("cell", parent=_ss["BodyText"], fontSize=7, leading=8.5),
    "cellb": ParagraphStyle("cellb", parent=_ss["BodyText"], fontSize=7, leading=8.5, fontName="Helvetica-Bold"),
}


class FigureSlot(Flowable):
    """Reserves space for a figure; records where it landed for the stamping pass."""

    def __init__(self, key: str, pdf_bytes: bytes, slots: list):
        super().__init__()
        from pypdf import PdfReader

        self.key, self.pdf_bytes, self.slots = key, pdf_bytes, slots
        box = PdfReader(io.BytesIO(pdf_bytes)).pages[0].mediabox
        self.fw, self.fh = float(box.width), float(box.height)
        # Fit the frame: a figure taller than a page (many ranks, many what-ifs) is shrunk, never cut.
        self.scale = min(1.0, FRAME_W / self.fw, 0.8 * FRAME_H / self.fh)
        self.width, self.height = self.fw * self.scale, self.fh * self.scale

    def wrap(self, aw, ah):
        return self.width, self.height

    def draw(self):
        x, y = self.canv.absolutePosition(0, 0)
        self.slots.append(
            {
                "key": self.key,
                "page": self.canv.getPageNumber() - 1,
                "x": x,
                "y": y,
                "scale": self.scale,
                "pdf": self.pdf_bytes,
            }
        )


def P(text: str, style: str = "body") -> Paragraph:
    return Paragraph(escape(str(text)), ST[style])


def render_pdf(report: Report, out: str | Path) -> Path:
    slots: list[dict] = []
    story = _story(report, slots)
    return write_pdf(story, slots, tables.title(report), "tpcomm report", f"run directory: {report.run_dir}", out)


def write_pdf(story: list[Flowable], slots: list[dict], title: str, subject: str, footer: str, out: str | Path) -> Path:
    """Lay out `story` on A4 with the footer line, stamp the figures into their slots, write `out` atomically
    (the report's and the comparison's PDFs alike)."""
    out = Path(out)
    buf = io.BytesIO()
    doc = SimpleDocTemplate(
        buf,
        pagesize=A4,
        leftMargin=MARGIN,
        rightMargin=MARGIN,
        topMargin=MARGIN,
        bottomMargin=MARGIN,
        title=title,
        author="tpcomm",
        subject=subject,
    )

    made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def draw_footer(canv, _doc):
        canv.saveState()
        canv.setFont("Helvetica", 7)
        canv.setFillColor(colors.HexColor("#777777"))
        canv.drawString(MARGIN, 10 * mm, f"{title}  |  {footer}  |  generated {made}"[:170])
        canv.drawRightString(A4[0] - MARGIN, 10 * mm, f"page {canv.getPageNumber()}")
        canv.restoreState()

    doc.build(story, onFirstPage=draw_footer, onLaterPages=draw_footer)
    _stamp(buf.getvalue(), slots, out)
    return out


def _stamp(base: bytes, slots: list[dict], out: Path) -> None:
    from pypdf import PdfReader, PdfWriter, Transformation

    w = PdfWriter(clone_from=PdfReader(io.BytesIO(base)))
    for s in slots:
        fig_page = PdfReader(io.BytesIO(s["pdf"])).pages[0]
        w.pages[s["page"]].merge_transformed_page(
            fig_page, Transformation().scale(s["scale"], s["scale"]).translate(s["x"], s["y"])
        )
    buf = io.BytesIO()
    w.write(buf)
    out.parent.mkdir(parents=True, exist_ok=True)
    safefs.write_atomic(out.parent, out.name, buf.getvalue())  # never through a link planted at `out`


def _figure(key: str, data: dict, caption: str, slots: list) -> list[Flowable]:
    fig = F.ALL[key][1](data)
    if fig is None:
        return []
    cap = [P(caption, "cond")] if caption else []
    return [KeepTogether([FigureSlot(key, F.to_pdf_bytes(fig), slots), *cap, Spacer(1, 4)])]


def _missing(sec) -> list[Flowable]:
    return [P(f"Could not read: {e}", "missing") for e in sec.unreadable] + [
        P(f"Not measured: {m['what']}. Measure it with: {m['command']}", "missing") for m in sec.not_measured
    ]


def _table(header: list[str], rows: list[list], widths: list[float]) -> Table:
    total = sum(widths)
    cols = [FRAME_W * w / total for w in widths]
    data = [[Paragraph(escape(h), ST["cellb"]) for h in header]] + [
        [Paragraph(escape(str(c)), ST["cell"]) for c in r] for r in rows
    ]
    t = Table(data, colWidths=cols, repeatRows=1)
    t.setStyle(
        TableStyle(
            [
                ("GRID", (0, 0), (-1, -1), 0.25, colors.HexColor("#BBBBBB")),
                ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#EEEEEE")),
                ("VALIGN", (0, 0), (-1, -1), "TOP"),
                ("TOPPADDING", (0, 0), (-1, -1), 1.5),
                ("BOTTOMPADDING", (0, 0), (-1, -1), 1.5),
            ]
        )
    )
    return t


def _blocks(blocks, data: dict, slots: list, text_style: str = "body") -> list[Flowable]:
    """tables.py's blocks as flowables (the Markdown twin draws the same blocks)."""
    out: list[Flowable] = []
    for item in blocks:
        kind = item[0]
        if kind == "text":
            out.append(P(item[1], text_style))
        elif kind in ("small", "headline", "warning"):
            out.append(P(item[1], {"small": "cond", "headline": "headline", "warning": "missing"}[kind]))
        elif kind == "table":
            out += [_table(*item[1]), Spacer(1, 4)]
        elif kind == "figure":
            out += _figure(item[1], data, item[2], slots)
    return out


def _story(report: Report, slots: list) -> list[Flowable]:
    st: list[Flowable] = [P(tables.title(report), "title")]
    v = report["verdict"]
    st += [P(v.title, "h1")] + _missing(v)
    st += _blocks(tables.page_one_blocks(v.data), v.data, slots, "verdict")
    st.append(PageBreak())
    for key in ("system", "plan", "probe", "breakdown", "replay", "timeline", "ladder", "what_if", "methods"):
        sec = report[key]
        head: list[Flowable] = [P(sec.title, "h1")]
        if sec.conditions:
            head.append(P("Conditions: " + sec.conditions, "cond"))
        head += _missing(sec)
        if not sec.available:
            st.append(KeepTogether(head + [P("Not measured.", "missing")]))
            continue
        body = _blocks(tables.section_blocks(sec), sec.data, slots)
        # A heading never ends a page alone: it travels with a leading figure, or starts a new page when
        # less than a few table rows of room are left (a long table itself may then split across pages).
        if body and isinstance(body[0], KeepTogether):
            st.append(KeepTogether(head + body[:1]))
            st += body[1:]
        else:
            st += [CondPageBreak(140)] + head + body
    return st
