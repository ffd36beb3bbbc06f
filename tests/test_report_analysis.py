"""analysis.py on real plan/predict outputs: the verdict's numbers, the levers
and their predicted effects, and the PDF page 1 carrying exactly those numbers."""

from __future__ import annotations

import pytest

from tpcomm.report.analysis import analyze
from tpcomm.report.pdf import render_pdf
from tpcomm.report.verdict import fmt
from tpcomm.rundir import RunDir


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


def test_verdict_numbers_come_from_predict(case_study):
    path, doc = case_study
    v = analyze(path).verdict
    ss = doc["single_stream"]
    assert v["source"] == "model-based"
    assert v["numbers"]["cap_tok_per_s"] == fmt(ss["tok_per_s"])
    assert v["numbers"]["ms_per_token"] == fmt(ss["ms_per_token"])
    coll = ss["breakdown_ms"]["collectives"]
    assert v["predicted"]["interconnect_ms"] == pytest.approx(coll)
    assert v["predicted"]["collectives_per_token"] == ss["collectives_per_token"]
    assert v["predicted"]["latency_us_each"] == pytest.approx(1000 * coll / ss["collectives_per_token"])
    share = coll / sum(ss["breakdown_ms"].values())
    assert v["bottleneck"]["interconnect_share"] == pytest.approx(share)
    # Model-based: a yes/no only where the whole range of inputs agrees (None: the model cannot decide).
    assert v["bottleneck"]["interconnect_is_bottleneck"] == doc["range"]["verdict"]["interconnect_is_bottleneck"]
    # Without a measurement the transfer/wait split is not invented.
    assert v["predicted"]["transfer_ms"] is None and "not measured" in " ".join(v["sentences"])


def test_levers_ranked_with_predicted_effects(case_study):
    path, doc = case_study
    levers = analyze(path).verdict["levers"]
    by_name = {lv["name"]: lv for lv in levers}
    for w in doc["what_if"]:
        if w.get("tok_per_s") is None:
            continue
        if w["delta_pct"] > 0 and w.get("fits_memory") is not False:
            assert by_name[w["name"]]["tok_per_s"] == pytest.approx(w["tok_per_s"])
            assert by_name[w["name"]]["change_pct"] == pytest.approx(w["delta_pct"])
        else:  # a risk (P2P off) or a layout that does not fit is not offered as a lever
            assert w["name"] not in by_name
    effects = [lv["change_pct"] for lv in levers if lv["change_pct"] is not None]
    assert effects == sorted(effects, reverse=True) and all(e > 0 for e in effects)
    # The PCIe case names the levers that help: a one-shot all-reduce and NVLink; fewer TP ranks do not fit.
    assert {"one-shot-allreduce", "nvlink"} <= set(by_name) and "tp4" not in by_name


def test_page_one_states_the_verdict_numbers(case_study, tmp_path):
    import pdfplumber

    path, _ = case_study
    rep = analyze(path)
    out = render_pdf(rep, tmp_path / "case.pdf")
    with pdfplumber.open(out) as pdf:
        page1 = pdf.pages[0].extract_text().replace("\n", " ")
        text = " ".join((p.extract_text() or "") for p in pdf.pages)
    for name, value in rep.verdict["numbers"].items():
        assert value in page1, (name, value)
    assert "model-based" in page1
    for lv in rep.verdict["levers"][:3]:
        assert lv["name"] in page1
    # The what-if figure is vector with searchable labels.
    assert "single-stream tok/s (model-based)" in text
    assert "ms per token (model-based" in page1


def test_missing_everything_is_not_an_error(tmp_path):
    rep = analyze(RunDir(tmp_path).path)
    assert not any(s.available for k, s in rep.sections.items() if k != "methods")
    assert rep.verdict["numbers"] == {} and rep["verdict"].not_measured


DEMO_RUN = __import__("pathlib").Path(__file__).parent / "data" / "demo_run"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from measured_run import measured_run

    return measured_run(tmp_path_factory.mktemp("measured") / "run")


def test_measured_verdict_headline_is_the_split_total(measured):
    import json

    summ = json.loads((measured / "attribution/summary.json").read_text())
    v = analyze(measured).verdict
    assert v["source"] == "measured" and v["split_source"] == "measured"
    lv = min(summ["levels"], key=lambda x: x["concurrency"])
    pt, m = lv["per_token_ms"], v["measured"]
    # One denominator: the headline is the engine's per-token time and the four terms add up to it.
    assert m["ms_per_token"] == pytest.approx(lv["engine_ms_per_token"])
    assert sum(m["terms"].values()) == pytest.approx(m["ms_per_token"], rel=1e-9)
    assert m["tok_per_s"] == pytest.approx(1000 / m["ms_per_token"])
    assert sum(m["shares_pct"].values()) == pytest.approx(100.0, abs=1e-9)
    for k, share in m["shares_pct"].items():
        assert share == pytest.approx(100 * pt[k] / lv["engine_ms_per_token"], abs=0.1)
    assert m["collective_ms"] == pytest.approx(pt["transfer"] + pt["wait"])
    assert m["collectives_per_token"] == lv["collectives_per_step"]["observed_total"]
    # The client beside it, with the named difference. This saved run (busy host) delivered whole streams in
    # bursts: its plain TPOT p50 is far below the engine's period (the closure failed on it, +123%), while the
    # held TPOT (E2E minus the fastest TTFT, per token) closes; both are printed, the closure uses the held one.
    assert m["client_tpot_ms_p50"] == pytest.approx(lv["client"]["tpot_ms_p50"])
    held = lv["client"]["tpot_held_ms_p50"]
    assert m["client_tpot_ms_p50"] < 0.7 * m["ms_per_token"] and held > m["client_tpot_ms_p50"]
    d = lv["delivery"]
    assert m["delivery_ms"] == d["ms"] == pytest.approx(lv["closure"]["client_tpot_ms_p50"] - d["engine_tpot_ms"])
    text = " ".join(v["sentences"])
    # Printed with its interval; a difference whose interval holds 0 is never printed as a signed cost alone.
    assert v["numbers"]["delivery"] in text and f"over {d['requests']} requests" in text
    assert ("not separable from zero" in text) == (not d["resolved"])
    assert lv["closure"]["client_tpot_ms_p50"] == pytest.approx(held)
    assert ("CLOSURE CHECK FAILED" in text) == (lv["closure"]["ok"] is False)
    assert v["numbers"]["client_tpot_ms_p50"] in text and v["numbers"]["client_held_tpot_ms_p50"] in text
    assert v["numbers"]["ms_per_token"] in text
    assert "Collective time = transfer + wait" in text
    # Levers: bounds from the same terms as the headline.
    by = {x["name"]: x for x in v["levers"]}
    assert by["remove rank skew"]["tok_per_s"] == pytest.approx(1000 / (m["ms_per_token"] - pt["wait"]))
    assert by["free interconnect (transfer = 0)"]["tok_per_s"] == pytest.approx(
        1000 / (m["ms_per_token"] - pt["transfer"])
    )
    assert by["no collective time (upper bound)"]["tok_per_s"] == pytest.approx(
        1000 / (m["ms_per_token"] - pt["transfer"] - pt["wait"])
    )
    # The statement follows the numbers: rank skew is never called link speed.
    st = v["bottleneck"]["statement"]
    assert ("waiting for the slowest rank" in st) == (pt["wait"] > pt["transfer"])
    assert v["bottleneck"]["interconnect_share"] == pytest.approx(m["shares_pct"]["transfer"] / 100)


def test_old_attribution_format_is_not_shown_as_a_split(tmp_path):
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(DEMO_RUN, run)
    summ = json.loads((run / "attribution/summary.json").read_text())
    del summ["split_format"]  # as attribute wrote it before the closing split
    (run / "attribution/summary.json").write_text(json.dumps(summ))
    v = analyze(run).verdict
    assert v["measured"]["split"] is False and "predates the closing split" in v["measured"]["label"]


def test_timeline_skew_matches_hook_records():
    import pandas as pd

    tl = analyze(DEMO_RUN)["timeline"].data
    coll = pd.read_parquet(DEMO_RUN / "hook/collectives.parquet")
    step = coll[coll["step"] == tl["step"]]
    starts = step.groupby("call_idx")["t_start_ns"].agg(["min", "max"])
    expected = ((starts["max"] - starts["min"]) / 1e3).tolist()
    assert tl["entry_skew_us"] == pytest.approx(expected)
    assert tl["max_entry_skew_us"] == pytest.approx(max(expected))
    steps = pd.read_parquet(DEMO_RUN / "hook/steps.parquet")
    assert set(steps[steps["step"] == tl["step"]]["kind"]) == {"decode"}


def test_a_killed_server_run_says_incomplete_and_blames_no_plugin(tmp_path):
    """The hook records are there but the server died mid-run (issue 12, item 7): page 1 says the run is
    incomplete and why there is no split; it never claims the plugin was missing."""
    import json
    import shutil

    from tpcomm.report.analysis import analyze

    run = tmp_path / "run"
    shutil.copytree(__import__("pathlib").Path(__file__).parents[1] / "reports/runs/cpu-demo", run)
    st = json.loads((run / "status.json").read_text())
    st["attribute"] = {"state": "incomplete", "reason": "server stopped answering", "utc": "x"}
    (run / "status.json").write_text(json.dumps(st))
    summ = json.loads((run / "attribution/summary.json").read_text())
    for lv in summ["levels"]:
        lv.update(per_token_ms=None, engine_ms_per_token=None, note="no decode steps recorded in this level's window")
    (run / "attribution/summary.json").write_text(json.dumps(summ))
    text = " ".join(analyze(run).verdict["sentences"])
    assert "INCOMPLETE: attribute (server stopped answering)" in text
    assert "without the tpcomm plugin" not in text
