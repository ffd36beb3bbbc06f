"""MLA + MoE decode per engine version (issue 29 item 2): DeepSeek-V3-architecture FP8 checkpoints take the MoE
path of the engine version that serves them, each with the validation rows that informed it, and an engine
version no public measurement covers says so and gets a widened range. Rows: tpcomm/predict/data/validation.json."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.predict import kernels
from tpcomm.predict.validation import run

TABLE = resources.files("tpcomm.predict").joinpath("data", "validation.json").read_text()
ROWS = {r["id"] for r in json.loads(TABLE)["rows"]}


def _predict(engine: str) -> dict:
    r = CliRunner().invoke(
        cli, ["predict", "-m", "deepseek-v3", "--tp", "8", "--gpu", "h200", "--engine", engine, "--json"]
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.parametrize(
    "engine, backend, covered",
    [
        ("sglang-0.4.1", "mla-fp8-sglang-early", True),  # Triton MLA decode, block-FP8 Triton MoE (sglang PR 2643)
        ("sglang-0.4.6", "default", True),
        ("vllm-0.6.6", "mla-vllm-no-mla-kernel", False),  # before vLLM's MLA kernel (0.7.1): no clean row
        ("vllm-0.7.2", "default", True),
    ],
)
def test_the_moe_path_follows_the_engine_version_and_names_its_rows(engine, backend, covered):
    moe = _predict(engine)["range"]["inputs"]["moe_layer_us"]
    assert moe["backend"] == backend
    assert moe["covered_by_a_measurement"] is covered
    assert set(moe["informed_by"]) <= ROWS  # every row it names is in the table
    fitted = {r["id"]: r for r in json.loads(TABLE)["rows"] if r.get("fitted")}
    for rid in moe["informed_by"]:  # a fitted backend's rows are the rows fitted for it
        if backend != "default":
            assert backend in (fitted[rid].get("fitted_for") or ""), rid


@pytest.mark.parametrize(
    "engine, backend",
    [("vllm-0.7.2+cu118", "default"), ("sglang-0.4.10rc1", "default"), ("sglang-0.4.1.post2", "mla-fp8-sglang-early")],
)
def test_version_suffixes_do_not_move_an_engine_across_a_boundary(engine, backend):
    assert _predict(engine)["range"]["inputs"]["moe_layer_us"]["backend"] == backend


def test_a_given_moe_cost_is_not_called_uncovered():
    args = ["predict", "-m", "deepseek-v3", "--tp", "8", "--gpu", "h200", "--engine", "vllm-0.6.6"]
    r = CliRunner().invoke(cli, [*args, "--moe-layer-us", "300"])
    assert r.exit_code == 0, r.output
    assert "no public measurement covers" not in r.output


def test_every_moe_backend_names_rows_of_the_table():
    assert set(kernels.MOE_ROWS) == set(kernels.MOE_LAYER_US)
    for backend, rows in kernels.MOE_ROWS.items():
        assert set(rows) <= ROWS, backend


def test_an_uncovered_engine_version_says_so_on_the_console():
    r = CliRunner().invoke(
        cli, ["predict", "-m", "deepseek-v3", "--tp", "8", "--gpu", "h200", "--engine", "vllm-0.6.6"]
    )
    assert r.exit_code == 0, r.output
    assert "no public measurement covers this engine version" in r.output


def test_early_sglang_is_three_times_slower_than_a_modern_engine_and_both_public_rows_lie_inside():
    early, modern = _predict("sglang-0.4.1"), _predict("sglang-0.4.6")
    t_early = early["single_stream"]["tok_per_s"]
    t_modern = modern["single_stream"]["tok_per_s"]
    # the modern path's central (the default MoE cost) is ~100 tok/s; the early path's public figure is 30.29
    assert t_modern / t_early > 2.5
    by = {
        r.row["id"]: r
        for r in run(["deepseek-v3-fp8-tp8-h200-sglang-0.4.1", "deepseek-v3-fp8-tp8-h200-vllm-0.6.6-approx"])
    }
    for rid, r in by.items():
        assert r.inside, (rid, r.measured, r.low, r.high)
    # the fitted row within 20% (it set the constant; the held-out approximate row only has to lie inside)
    fitted = by["deepseek-v3-fp8-tp8-h200-sglang-0.4.1"]
    assert abs(fitted.central / fitted.measured - 1) < 0.2
