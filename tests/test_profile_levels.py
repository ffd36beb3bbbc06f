"""The traces as the attribution's records (attribute --profile without the plugin, profile_levels.py), fast, on
the real recorded run tests/data/attribute_tiny_tp2 (vLLM-CPU TP 2, C=1, 4 requests): its records moved where
the trace import writes them (trace/, with the import's own columns), the level marked as the profiled one and
the hook's status removed. The attribution must come out the same as from the hook's records (same split,
closure and cross-check: one function reads both), typed with source "trace", no plugin claimed, and the
levels outside the traces' window must say why they have no split. The live check against a server without the
plugin is tests/test_trace_alone_server.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tpcomm.analysis.align import align
from tpcomm.analysis.attribution import analyse_run_dir
from tpcomm.analysis.profile_levels import NOT_PROFILED, next_repeat, profiled_requests, trace_records
from tpcomm.rundir.layout import RunDir

DATA = Path(__file__).parent / "data" / "attribute_tiny_tp2"


def _as_trace_run(d: Path, extra_level: bool = False) -> None:
    """Move the hook's records to trace/ as the import writes them (its added columns included)."""
    (d / "trace").mkdir()
    coll = align(pd.read_parquet(d / "hook/collectives.parquet")).assign(source="trace", name="shm_allreduce")
    coll["bytes_from"] = "args"
    coll.to_parquet(d / "trace/collectives.parquet")
    pd.read_parquet(d / "hook/steps.parquet").assign(source="trace").to_parquet(d / "trace/steps.parquet")
    shutil.rmtree(d / "hook")
    levels = json.loads((d / "load/levels.json").read_text())
    levels[0]["profiled"] = True
    if extra_level:  # a level measured before the profiled one, outside the traces' window
        levels.insert(0, {**levels[0], "concurrency": 4, "repeat": 0, "profiled": False})
    (d / "load/levels.json").write_text(json.dumps(levels))


@pytest.fixture
def runs(tmp_path):
    hook, trace = tmp_path / "hook", tmp_path / "trace"
    shutil.copytree(DATA, hook)
    shutil.copytree(DATA, trace)
    _as_trace_run(trace)
    return hook, trace


def test_the_traces_give_the_same_attribution_as_the_hook(runs):
    hook_dir, trace_dir = runs
    cfg = str(DATA / "model_config.json")
    h, t = analyse_run_dir(hook_dir, model_source=cfg), analyse_run_dir(trace_dir, model_source=cfg)
    assert h.source == "hook" and t.source == "trace"
    assert t.plugin is False and t.plugin_note  # no plugin claimed; how to enable it is said
    assert any("torch-profiler traces" in n for n in t.notes)
    (lh,), (lt,) = h.levels, t.levels
    assert lt.source == "trace" and lt.attributed
    assert lt.engine_ms_per_token == pytest.approx(lh.engine_ms_per_token, rel=1e-12)
    assert lt.per_token_ms.as_dict() == pytest.approx(lh.per_token_ms.as_dict(), rel=1e-9)
    assert (lt.closure.engine_ms, lt.closure.client_ms, lt.closure.judged, lt.closure.ok) == (
        lh.closure.engine_ms,
        lh.closure.client_ms,
        lh.closure.judged,
        lh.closure.ok,
    )
    assert lt.collectives_per_step["match"] is True
    assert t.headline == h.headline and t.verdict.statement == h.verdict.statement
    # The summary on disk is the typed one, as the report reads it.
    assert json.loads((trace_dir / "attribution/summary.json").read_text())["source"] == "trace"


def test_levels_outside_the_traces_say_why(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(DATA, d)
    _as_trace_run(d, extra_level=True)
    att = analyse_run_dir(d, model_source=str(DATA / "model_config.json"))
    other = next(lv for lv in att.levels if lv.concurrency == 4)
    assert not other.attributed and other.note == f"not measured: {NOT_PROFILED}"
    assert other.collectives_per_step["match"] is None  # no verdict on records that do not cover the level
    assert not other.incomplete  # plugin off is not a fault of the run
    assert att.headline == {"concurrency": 1, "repeat": 0}


def test_no_profiled_level_no_trace_records(tmp_path):
    """A `tpcomm trace` import into a run whose levels were not profiled: the traces are not the levels' records."""
    d = tmp_path / "run"
    shutil.copytree(DATA, d)
    _as_trace_run(d)
    levels = json.loads((d / "load/levels.json").read_text())
    levels[0].pop("profiled")
    (d / "load/levels.json").write_text(json.dumps(levels))
    assert trace_records(RunDir(d, create=False)) is None
    assert analyse_run_dir(d).levels[0].attributed is False


def test_the_profiled_window_is_short():
    assert profiled_requests(200, plugin=False) == 6  # the fewest on which the closure and the five terms are judged
    assert profiled_requests(3, plugin=False) == 3
    assert profiled_requests(200, plugin=True) == 2
    assert next_repeat([{"repeat": 0}, {"repeat": 2}]) == 3 and next_repeat([]) == 0


def test_the_terminal_shows_the_traces_split(runs):
    from rich.console import Console

    from tpcomm.attribute.show import render

    _, trace_dir = runs
    att = analyse_run_dir(trace_dir, model_source=str(DATA / "model_config.json"))
    levels = json.loads((trace_dir / "load/levels.json").read_text())
    con = Console(width=220, record=True)
    render({"levels": levels, "attribution": att.to_json(), "notes": [], "complete": True, "run_dir": "r"}, con)
    text = con.export_text()
    assert "Per-token split (torch-profiler traces, no plugin" in text
    assert att.verdict.statement in text


def test_count_line_without_hook_records():
    from tpcomm.attribute.profile import _count_text

    no_hook = {"rank": 0, "trace_count": 3, "trace_time_us": 5.0, "hook_count": None, "hook_time_us": None}
    assert _count_text(no_hook) == "rank 0: trace 3 comm events (5 us)"
    both = {**no_hook, "hook_count": 3, "hook_time_us": 4.0}
    assert _count_text(both).endswith(", hook 3 (4 us)")


REAL = Path(__file__).parent / "data" / "attribute_trace_alone_tp2"


def test_real_run_without_the_plugin_reanalyses_to_its_attribution(tmp_path):
    """The recorded real run (no plugin, traces only): --reanalyse gives the traces' split with the closure judged
    against the client, as recorded live (-3.553% then: step ends averaged over the ranks; -3.5495% with rank 0's,
    vLLM's output rank, pairing.step_ends). Per-token time 28.910245 ms with start-to-start periods, 28.877992 with
    end-to-end ones (analysis/split.py, 2026-12-06: the window the client's tokens span)."""
    from tpcomm.attribute.run import reanalyse_run_dir

    d = tmp_path / "run"
    shutil.copytree(REAL, d)
    res = reanalyse_run_dir(str(d))
    att = res["attribution"]
    assert att["source"] == "trace" and att["plugin"] is False and res["complete"]
    plain, prof = att["levels"]
    assert not plain["attributed"] and plain["note"] == f"not measured: {NOT_PROFILED}"
    assert prof["attributed"] and prof["source"] == "trace" and att["headline"] == {"concurrency": 1, "repeat": 1}
    assert prof["engine_ms_per_token"] == pytest.approx(28.877992, rel=1e-6)
    assert sum(prof["per_token_ms"].values()) == pytest.approx(prof["engine_ms_per_token"], rel=1e-12)
    cz = prof["closure"]
    assert cz["judged"] and cz["ok"] and cz["requests"] == 4 and cz["diff_pct"] == pytest.approx(-3.5495, abs=1e-3)
    # The traces' collectives per decode step: 9 all-reduces and 1 all-gather, as the plan of this model says
    # (their sizes are not in a trace recorded without record_shapes: -1 B).
    seen = {o["op"]: o["count"] for o in prof["collectives_per_step"]["observed"]}
    assert seen == {"all_reduce": 9, "all_gather": 1}
