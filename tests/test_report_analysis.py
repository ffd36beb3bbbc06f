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
    from tpcomm.predict import predict

    rd = RunDir(tmp_path_factory.mktemp("case"))
    rd.write_json("plan.json", build_plan("kimi-k2.5", tp=8, batches=[1]).to_dict())
    doc = predict("kimi-k2.5", tp=8, gpu="rtx-pro-6000")
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
    assert v["bottleneck"]["interconnect_is_bottleneck"] == (share >= 0.5)
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
    assert "ms per token (model-based)" in page1


def test_missing_everything_is_not_an_error(tmp_path):
    rep = analyze(RunDir(tmp_path).path)
    assert not any(s.available for k, s in rep.sections.items() if k != "methods")
    assert rep.verdict["numbers"] == {} and rep["verdict"].not_measured


DEMO_RUN = __import__("pathlib").Path(__file__).parent / "data" / "demo_run"


def test_measured_verdict_from_attribution_and_client_timings():
    import json

    summ = json.loads((DEMO_RUN / "attribution/summary.json").read_text())
    levels = json.loads((DEMO_RUN / "load/levels.json").read_text())
    rep = analyze(DEMO_RUN)
    v = rep.verdict
    assert v["source"] == "measured"
    lv = min(summ["levels"], key=lambda x: x["concurrency"])
    pt = lv["per_token_ms"]
    client = [x["tpot_ms_p50"] for x in levels if x["concurrency"] == lv["concurrency"]]
    m = v["measured"]
    assert m["ms_per_token"] == pytest.approx(sorted(client)[len(client) // 2])
    assert m["tok_per_s"] == pytest.approx(1000 / m["ms_per_token"])
    assert m["transfer_ms"] == pytest.approx(pt["transfer"]) and m["wait_ms"] == pytest.approx(pt["wait"])
    assert m["interconnect_share"] == pytest.approx((pt["transfer"] + pt["wait"]) / sum(pt.values()))
    assert m["collectives_per_token"] == lv["collectives_per_step"]["observed_total"]
    # Bounds from the measurement: no skew, and a free interconnect.
    by = {lv_["name"]: lv_ for lv_ in v["levers"]}
    assert by["remove rank skew"]["tok_per_s"] == pytest.approx(1000 / (m["ms_per_token"] - pt["wait"]))
    assert by["free interconnect (upper bound)"]["tok_per_s"] == pytest.approx(
        1000 / (m["ms_per_token"] - pt["transfer"] - pt["wait"]))
    # The statement follows the numbers: wait > transfer is called out as skew.
    assert ("waiting for the slowest rank" in v["bottleneck"]["statement"]) == (pt["wait"] > pt["transfer"])
    # The timeline comes from the hook records of one decode step on every rank.
    tl = rep["timeline"].data
    assert {r["rank"] for r in tl["ranks"]} == {0, 1} and tl["n_collectives"] == lv["collectives_per_step"]["observed_total"]


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
