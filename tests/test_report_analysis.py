"""Page one from typed results: the headline, the bar, the verdict and the levers, on a model-based run
(the case study) and on real measured records; read back from the rendered PDF."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tpcomm.columns import fmt
from tpcomm.judge import bottleneck
from tpcomm.report.analysis import analyze
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution


def render_pdf(*args, **kwargs):
    """tpcomm.report.pdf.render_pdf, imported when a test calls it: reportlab is optional, and a machine
    without it (the bare GPU machine of scripts/gpu-check.sh) must still collect this module."""
    from tpcomm.report.pdf import render_pdf as real

    return real(*args, **kwargs)


PROSE_MAX_WORDS = 150


@pytest.fixture(scope="module")
def case_study(tmp_path_factory):
    """The motivating case: Kimi-K2.5 INT4, TP 8, 8x RTX PRO 6000 (PCIe), model-based."""
    from tpcomm.plan import build_plan
    from tpcomm.predict import Layout, predict

    rd = RunDir(tmp_path_factory.mktemp("case"))
    rd.write_json("plan.json", build_plan("kimi-k2.5", tp=8, batches=[1]).to_dict())
    doc = predict("kimi-k2.5", Layout(tp=8), gpu="rtx-pro-6000")
    rd.write_json("predict.json", doc)
    return rd.path, doc


def test_model_based_page_one_comes_from_predict(case_study):
    path, doc = case_study
    v = analyze(path).verdict
    ss = doc["single_stream"]
    assert v.source == "model-based" and "MODEL-BASED" in v.headline
    assert v.numbers["tok_per_s"] == ss["tok_per_s"] and fmt(ss["tok_per_s"]) in v.headline
    # The verdict is predict's own range verdict, read unchanged: a yes/no only where the whole range agrees.
    assert v.verdict.statement == doc["range"]["verdict"]["statement"]
    assert v.verdict.interconnect_is_bottleneck == doc["range"]["verdict"]["interconnect_is_bottleneck"]
    assert v.split.total_ms == pytest.approx(sum(ss["breakdown_ms"].values()))


def test_levers_name_what_to_set_and_only_what_the_machine_allows(case_study):
    path, doc = case_study
    v = analyze(path).verdict
    by = {lv.name: lv for lv in v.levers}
    # PCIe TP 8: the one-shot all-reduce is FlashInfer's PCIe IPC, named by its environment variable.
    assert "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1" in by["one-shot-allreduce"].setting
    w = {x["name"]: x for x in doc["what_if"]}
    assert by["one-shot-allreduce"].tok_per_s == pytest.approx(w["one-shot-allreduce"]["tok_per_s"])
    # NVLink is another machine, P2P off a risk, TP 4 does not fit: what-ifs, never levers.
    assert not {"nvlink", "p2p-disabled", "tp4", "tp2", "tp1"} & set(by)
    # "Collectives cost nothing" is a bound, not a lever row: the model's verdict states it over its range.
    assert "no-interconnect-cost" not in by and v.bounds == [] and "free interconnect" in " ".join(v.sentences)
    changes = [lv.change_pct for lv in v.levers]
    assert changes == sorted(changes, reverse=True) and all(c > 0 for c in changes)


def _page_one(pdf_path: Path):
    """Page 1's text, and its prose words: every word outside the tables and the figure's own text."""
    import pdfplumber

    with pdfplumber.open(pdf_path) as pdf:
        page = pdf.pages[0]
        text = " ".join((page.extract_text() or "").split())
        boxes = [t.bbox for t in page.find_tables()]
        # The page's own text: below the title and generation line, above the footer.
        words = [w for w in page.extract_words(extra_attrs=["fontname", "size"]) if 80 < w["top"] < page.height - 40]
    figure_fonts = {w["fontname"] for w in words if "DejaVu" in w["fontname"]}  # matplotlib's TrueType text

    def inside(w, b):
        return b[0] - 1 <= w["x0"] and w["x1"] <= b[2] + 1 and b[1] - 1 <= w["top"] and w["bottom"] <= b[3] + 1

    prose = [
        w
        for w in words
        if w["fontname"] not in figure_fonts and not any(inside(w, b) for b in boxes) and w["size"] >= 7
    ]
    return text, prose, boxes, figure_fonts


def test_model_based_page_one_read_back(case_study, tmp_path):
    path, _ = case_study
    rep = analyze(path)
    text, prose, boxes, figure_fonts = _page_one(render_pdf(rep, tmp_path / "case.pdf"))
    v = rep.verdict
    assert fmt(v.numbers["tok_per_s"]) in text and "MODEL-BASED" in text
    assert figure_fonts and "ms per token (model-based" in text  # the bar, vector with searchable labels
    assert boxes and "what to set" in text and "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1" in text
    assert len(prose) <= PROSE_MAX_WORDS, " ".join(w["text"] for w in prose)


def test_missing_everything_is_not_an_error(tmp_path):
    rep = analyze(RunDir(tmp_path).path)
    assert not any(s.available for k, s in rep.sections.items() if k != "methods")
    assert rep.verdict.numbers == {} and rep["verdict"].not_measured


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from measured_run import measured_run

    return measured_run(tmp_path_factory.mktemp("measured") / "run")


def test_measured_headline_is_the_split_total_and_page_one_reads_back(measured, tmp_path):
    att = Attribution.from_json(json.loads((measured / "attribution/summary.json").read_text()))
    rep = analyze(measured)
    v = rep.verdict
    lv = att.headline_level()
    t = lv.per_token_ms
    # One denominator: the headline is the engine's per-token time and the four terms add up to it.
    assert v.source == "measured" and v.numbers["ms_per_token"] == lv.engine_ms_per_token
    assert t.total == pytest.approx(lv.engine_ms_per_token, rel=1e-9)
    assert sum(lv.shares_pct.values()) == pytest.approx(100.0, abs=1e-9)
    # The one bottleneck rule, the same in attribute's summary and on the page.
    assert v.verdict == bottleneck.measured(t) == att.verdict
    assert len(v.sentences) <= 3
    text, prose, boxes, fonts = _page_one(render_pdf(rep, tmp_path / "m.pdf"))
    assert (
        f"{fmt(1e3 / lv.engine_ms_per_token)} tok/s" in text and f"{fmt(lv.engine_ms_per_token)} ms per token" in text
    )
    # The figure's legend carries each term with its share; the shares printed there sum to 100.
    shares = [float(x) for x in re.findall(r"(?:compute|transfer|wait|host gap) [\d.]+ ms \(([\d.]+)%\)", text)]
    assert len(shares) == 4 and sum(shares) == pytest.approx(100.0, abs=0.05)
    # Every term the page uses is defined on it, one line each (the terms table under the bar).
    assert "transfer per collective, the shortest time" in text and "closure per request" in text
    assert len(prose) <= PROSE_MAX_WORDS, " ".join(w["text"] for w in prose)


def test_an_older_summary_is_one_line_saying_how_to_redo_it(measured, tmp_path):
    from tpcomm.rundir.contract import SchemaError

    run = tmp_path / "old"
    shutil.copytree(measured, run)
    doc = json.loads((run / "attribution/summary.json").read_text())
    doc["schema_version"] = 1
    (run / "attribution/summary.json").write_text(json.dumps(doc))
    rep = analyze(run)
    err = rep.errors["attribution/summary.json"]
    assert "older tpcomm" in err and "tpcomm attribute --reanalyse RUN_DIR" in err and "\n" not in err
    assert rep["breakdown"].unreadable == [err]
    with pytest.raises(SchemaError):
        RunDir(run, create=False).read_json("attribution/summary.json") and Attribution.from_json(doc)


def test_a_summary_with_a_wrong_type_names_the_field(measured, tmp_path):
    run = tmp_path / "bad"
    shutil.copytree(measured, run)
    doc = json.loads((run / "attribution/summary.json").read_text())
    doc["levels"][0]["per_token_ms"]["wait"] = "0.5"
    (run / "attribution/summary.json").write_text(json.dumps(doc))
    err = analyze(run).errors["attribution/summary.json"]
    assert "levels[0].per_token_ms.wait" in err and "text where a number was expected" in err


DEMO_RUN = Path(__file__).parent / "data" / "demo_run"


def test_timeline_skew_matches_hook_records():
    import pandas as pd

    tl = analyze(DEMO_RUN)["timeline"].data
    coll = pd.read_parquet(DEMO_RUN / "hook/collectives.parquet")
    step = coll[coll["step"] == tl.step]
    starts = step.groupby("call_idx")["t_start_ns"].agg(["min", "max"])
    expected = ((starts["max"] - starts["min"]) / 1e3).tolist()
    assert tl.entry_skew_us == pytest.approx(expected)
    assert tl.max_entry_skew_us == pytest.approx(max(expected))
    steps = pd.read_parquet(DEMO_RUN / "hook/steps.parquet")
    assert set(steps[steps["step"] == tl.step]["kind"]) == {"decode"}


def test_a_killed_server_run_says_incomplete_and_blames_no_plugin(tmp_path):
    """The hook records are there but the server died mid-run: page 1 says the run is incomplete and why
    there is no split; it never claims the plugin was missing."""
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "reports/runs/cpu-demo", run)
    st = json.loads((run / "status.json").read_text())
    st["attribute"] = {"state": "incomplete", "reason": "server stopped answering", "utc": "x"}
    (run / "status.json").write_text(json.dumps(st))
    summ = json.loads((run / "attribution/summary.json").read_text())
    for lv in summ["levels"]:
        lv.update(attributed=False, per_token_ms=None, engine_ms_per_token=None, note="no decode steps recorded")
    summ["headline"], summ["verdict"] = None, None
    (run / "attribution/summary.json").write_text(json.dumps(summ))
    d = analyze(run).verdict
    text = d.warning + " " + " ".join(d.sentences)
    assert "INCOMPLETE run: attribute (server stopped answering)" in text
    assert "without the tpcomm plugin" not in text


def test_what_the_hook_could_not_time_is_on_page_one(measured, tmp_path):
    """A GPU server started without graph timing, serving a model that loaded a fused kernel the hook cannot see
    (as the hook's status reports them): page one says what is in no term."""
    from tpcomm.analysis.attribution import analyse_run_dir

    run = tmp_path / "nt"
    shutil.copytree(measured, run)
    st = json.loads((run / "hook/status.json").read_text())
    for w in st["per_rank"]:
        w["graph_timing"] = {"enabled": False, "applies": True}
        w["allreduce_fusion"] = {
            "not_covered_detail": [
                {"models": "kimi_k3", "module": "vllm/x.py", "what": "GEMM + TP all-reduce", "loaded_in_worker": True},
                {"models": "minimax", "module": "vllm/y.py", "what": "Lamport", "loaded_in_worker": False},
            ]
        }
    (run / "hook/status.json").write_text(json.dumps(st))
    att = analyse_run_dir(run, model_source=str(run / "model_config.json"))
    assert len(att.not_timed) == 2 and "TPCOMM_GRAPH_TIMING=1" in att.not_timed[0] and "GEMM" in att.not_timed[1]
    warning = analyze(run).verdict.warning
    assert "Not timed by the hook" in warning and "GEMM + TP all-reduce" in warning and "Lamport" not in warning
