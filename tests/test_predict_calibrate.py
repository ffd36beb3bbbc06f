"""`tpcomm predict --attribution RUN_DIR` on a real measured run: reports/runs/cpu-demo was written by
`tpcomm demo` (real vLLM-CPU, TP 2, the tiny DeepSeek-V3-architecture model, tpcomm hook on)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.tinymodel import TINY_CONFIG

RUN = Path(__file__).resolve().parents[1] / "reports" / "runs" / "cpu-demo"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    return str(d)


def measured_c1():
    """The run's headline level, read here by name, independently of tpcomm.predict."""
    summ = json.loads((RUN / "attribution" / "summary.json").read_text())
    h = summ["headline"]
    lv = next(x for x in summ["levels"] if (x["concurrency"], x["repeat"]) == (h["concurrency"], h["repeat"]))
    pt = lv["per_token_ms"]
    return pt, pt["host_gap"], lv["engine_ms_per_token"]


def run(tiny, *extra):
    r = CliRunner().invoke(
        cli, ["predict", "--model", tiny, "--tp", "2", "--gpu", "cpu", "--attribution", str(RUN), *extra]
    )
    return r


def test_attribution_reproduces_the_measured_run_and_collectives_free_is_compute_plus_host(tiny):
    r = run(tiny, "--json", "--batch", "1,4")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    pt, host, total = measured_c1()
    assert d["single_stream"]["tok_per_s"] == pytest.approx(1e3 / total, rel=0.05)
    w = {x["name"]: x for x in d["what_if"]}
    assert w["no-interconnect-cost"]["ms_per_token"] == pytest.approx(pt["compute"] + host)
    assert w["no-interconnect-cost"]["tok_per_s"] == pytest.approx(1e3 / (pt["compute"] + host))
    assert w["no-rank-skew"]["ms_per_token"] == pytest.approx(pt["compute"] + pt["transfer"] + host)
    # TP 1 has no collectives; TP 4 has no measured latency on this CPU run and says so instead of guessing.
    assert w["tp1"]["breakdown_ms"]["transfer"] == 0 and w["tp1"]["breakdown_ms"]["wait"] == 0
    assert w["tp4"]["tok_per_s"] is None and "world size 2" in w["tp4"]["description"]
    assert w["batch4"]["tok_per_s"] > d["single_stream"]["tok_per_s"]
    keys = d["calibration"]["keys_read"]
    assert any(k.endswith(".per_token_ms.compute") for k in keys) and any(
        k.endswith(".per_token_ms.host_gap") for k in keys
    )


def test_attribution_text_output_names_its_source(tiny):
    r = run(tiny)
    assert r.exit_code == 0, r.output
    assert "MODEL ANCHORED ON A MEASURED RUN" in r.output and "attribution/summary.json at concurrency 1" in r.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tp", "4"], "differs from the measured run's TP 2"),
        (["--compare-model", "kimi-k2.5"], "--attribution answers from a measured run"),
        (["--engine", "gpt-fast"], "is gpt-fast, but --attribution"),  # the run is vLLM's: its plan is vLLM's
    ],
)
def test_attribution_bad_input(tiny, args, needle):
    r = CliRunner().invoke(
        cli, ["predict", "--model", tiny, "--gpu", "cpu", "--attribution", str(RUN), "--tp", "2", *args]
    )
    assert r.exit_code == 2 and needle in r.output, r.output


def test_attribution_dir_without_summary(tiny, tmp_path):
    r = CliRunner().invoke(
        cli, ["predict", "--model", tiny, "--tp", "2", "--gpu", "cpu", "--attribution", str(tmp_path)]
    )
    assert r.exit_code == 2 and "has no attribution/summary.json" in r.output, r.output
