"""The model-based report carries predict's ranges, its range-checked verdict and the "fitted" labels,
read back from the real PDF."""

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli


def _pdf_text(path):
    import pdfplumber

    with pdfplumber.open(path) as pdf:
        pages = [(p.extract_text() or "").replace("\n", " ") for p in pdf.pages]
    return pages[0], " ".join(pages)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for name, model, extra in (
        ("int4", "kimi-k2.5", []),
        ("nvfp4", "kimi-k2.5-nvfp4", ["--fitted-to", "1:61.3,32:464"]),
    ):
        run = tmp_path_factory.mktemp(name)
        for args in (
            ["plan", "--model", model, "--tp", "8", "--out", str(run)],
            [
                "predict",
                "--model",
                model,
                "--tp",
                "8",
                "--gpu",
                "rtx-pro-6000",
                "--batch",
                "1,32,48",
                *extra,
                "--out",
                str(run),
            ],
            ["report", str(run), "--out", str(run / "report.pdf")],
        ):
            r = CliRunner().invoke(cli, args)
            assert r.exit_code == 0, r.output
        out[name] = run
    return out


def test_int4_report_states_the_range_and_does_not_decide(reports):
    from tpcomm.report.analysis import analyze

    run = reports["int4"]
    doc = __import__("json").loads((run / "predict.json").read_text())
    page1, text = _pdf_text(run / "report.pdf")
    t = doc["range"]["single_stream"]["tok_per_s"]
    v = analyze(run).verdict
    assert v.verdict.statement == doc["range"]["verdict"]["statement"]
    assert v.verdict.interconnect_is_bottleneck is None and v.verdict.decided is False
    assert "The model cannot decide whether the interconnect is the bottleneck" in page1
    assert f"{t['low']:.1f}-{t['high']:.1f} tok/s single stream" in page1  # the bounds sentence
    assert "tpcomm attribute --server-url URL" in page1
    assert "range over its stated inputs" in page1  # levers carry their range
    # Every lever on page 1 helps at every corner of the range, and names what to set.
    for lv in v.levers:
        w = next(x for x in doc["what_if"] if x["name"] == lv.name)
        assert w["delta_pct_range"]["low"] > 0 and lv.setting.split()[0] in page1
    assert "whiskers = range over the stated inputs" in text and "ms per token (model-based): total" in text
    assert "lower bound: NCCL tuning model" in text


def test_nvfp4_report_labels_the_fitted_point(reports):
    run = reports["nvfp4"]
    page1, text = _pdf_text(run / "report.pdf")
    assert "extra terms fitted to the measured 61.3 tok/s: this reproduces that fit, it does not predict it" in page1
    assert "a prediction, not a measurement" not in page1
    assert "fitted to measured 61.3 tok/s at batch 1, 464 tok/s at batch 32" in text
    assert "fitted to the measured 464 tok/s" in text  # the C=32 row of the batch table
