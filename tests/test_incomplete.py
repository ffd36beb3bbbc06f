"""The one rule for an incomplete level (tpcomm/judge/complete.py), both sides of each condition; the summary,
the headline and the report's page one follow it; error pages in one line; a stopped worker process named by
the rank watch (real processes, the real /tpcomm/v1/workers route)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from tpcomm.attribute.load import error_text
from tpcomm.judge import complete
from tpcomm.rundir import contract as C
from tpcomm.rundir.documents import LoadLevel
from tpcomm.rundir.results import from_json

DATA = Path(__file__).parent / "data"
REAL = DATA / "attribute_tiny_tp2"


def level_incomplete(level: dict, seqs_per_step):
    """judge/complete.py's rule on a level as load/levels.json holds it (read through its dataclass)."""
    return complete.level_incomplete(load_level(level), seqs_per_step)


def load_level(doc: dict) -> LoadLevel:
    return from_json(LoadLevel, doc, C.LOAD_LEVELS)


def test_a_level_is_complete_only_when_nothing_took_from_it():
    ok = {"concurrency": 2, "repeat": 0, "requests": 8, "failed": 0}
    assert level_incomplete(ok, 2.0) is None and level_incomplete(ok, None) is None
    assert level_incomplete(ok, 1.2) is None  # fewer than C in a step (ramp up/down): ours alone
    assert "other traffic: 2.01 sequences per decode step" in level_incomplete(ok, 2.01)
    assert level_incomplete({**ok, "failed": 1}, 2.0) == "1 of 8 requests failed"
    assert level_incomplete({**ok, "worker_problem": "TP rank 1 stopped"}, 2.0) == "TP rank 1 stopped"
    assert level_incomplete({**ok, "hook_problem": "another client"}, 2.0) == "another client"
    assert level_incomplete({**ok, "records_problem": "not fetched"}, 2.0) == "not fetched"
    assert level_incomplete({**ok, "interrupted": "interrupted (Ctrl-C)"}, 2.0) == "interrupted (Ctrl-C)"
    both = level_incomplete({**ok, "failed": 2, "hook_problem": "another client"}, 3.5)
    assert both.split("; ") == [
        "another client",
        "2 of 8 requests failed",
        "the batch held other traffic: 3.50 sequences per decode step on average where this level runs 2 streams",
    ]


def test_one_decode_step_above_c_is_other_traffic_whatever_the_mean():
    """A closed loop of C never has more than C in flight: a decode step with more is another client's, also
    where the level's own steps carry fewer than C as often and the mean stays below C (the figures of the
    recorded run below)."""
    ok = {"concurrency": 2, "repeat": 1, "requests": 16, "failed": 0}
    got = complete.level_incomplete(load_level(ok), 1.984, {2: 314, 1: 195, 3: 184})
    assert got == (
        "the batch held other traffic: 184 of 693 decode steps carried more sequences than this level's 2 streams "
        "(up to 3; 1.98 sequences per decode step on average)"
    )
    assert complete.level_incomplete(load_level(ok), 1.98, {2: 500, 1: 10}) is None  # ours alone
    assert "2.01 sequences per decode step" in complete.level_incomplete(load_level(ok), 2.01, None)  # no counts


def test_other_traffic_at_c2_is_judged_step_by_step(tmp_path):
    """A real run's C=2 level beside another `attribute` client's C=1 (tests/test_hardening_server.py, 2026-12-07,
    beside a busy process; cut to that level): 184 of its 693 decode steps carried 3 sequences, 195 carried 1
    (its own two streams out of step), and the mean, 1.98, was all the rule read: the level was called complete
    and the test that asks for the other client's traffic to be named failed. Re-analysed, it is incomplete."""
    from tpcomm.analysis.attribution import analyse_run_dir

    run = tmp_path / "run"
    shutil.copytree(DATA / "attribute_other_traffic_c2", run)
    (lv,) = analyse_run_dir(run).levels
    assert (lv.concurrency, lv.repeat) == (2, 1) and lv.seqs_per_step < 2
    assert lv.incomplete and lv.incomplete.startswith("the batch held other traffic: 184 of 693 decode steps")


def test_the_summary_carries_the_judgement_and_no_headline_comes_from_an_incomplete_level(tmp_path):
    """Real records of a C=1 run: re-analysed as they are, the level is complete and gives the headline; with
    one of its requests marked failed, it is incomplete, there is no headline, and page one says why."""
    from tpcomm.attribute.run import reanalyse_run_dir
    from tpcomm.report.analysis import analyze

    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    res = reanalyse_run_dir(str(run))
    summ = json.loads((run / "attribution/summary.json").read_text())
    assert res["complete"] and summ["headline"] == {"concurrency": 1, "repeat": 0}
    assert summ["levels"][0]["incomplete"] is None and summ["levels"][0]["seqs_per_step"] == 1.0
    levels = json.loads((run / "load/levels.json").read_text())
    levels[0]["failed"] = 1
    (run / "load/levels.json").write_text(json.dumps(levels))
    res = reanalyse_run_dir(str(run))
    summ = json.loads((run / "attribution/summary.json").read_text())
    assert (
        not res["complete"]
        and res["incomplete_reason"] == f"C=1 repeat 0: 1 of {levels[0]['requests']} requests failed"
    )
    assert summ["headline"] is None and summ["verdict"] is None
    assert summ["levels"][0]["attributed"]  # what was measured stays
    page = analyze(run).verdict
    assert any(s.startswith("No headline: every measured level is incomplete") for s in page.sentences), page


def test_error_pages_are_one_line():
    page = "<!DOCTYPE html>\n<html><head>\n<title>502 Bad\nGateway</title></head><body><h1>x</h1></body></html>"
    assert error_text(page, "text/html") == "HTML page: 502 Bad Gateway"
    assert error_text("<html><body><p>down for\nmaintenance</p><script>var a=1;</script></body></html>") == (
        "HTML page: down for maintenance"
    )
    assert error_text('{"error":\n  "not implemented here"}', "application/json") == '{"error": "not implemented here"}'
    assert len(error_text("x" * 5000)) == 200 and error_text("") == "(empty body)"


def test_a_slow_pace_is_compared_and_a_stall_that_releases_a_burst_is_not():
    """A proxy adding 0.3 s before every token (each long gap releases one token): that is the pace the
    client gets, compared, and the closure fails. A stall that releases many tokens at once (a starved API
    server): its window is left out of both sides, and a request it holds most of is named as stalled."""
    from tpcomm.analysis import pairing
    from tpcomm.analysis.closure import STALLED, closure

    n = 16
    req = pd.DataFrame({"request_id": range(5), "output_tokens": [float(n)] * 5})

    def tokens(times):
        return pd.DataFrame(
            [
                {"request_id": r, "token_idx": i, "t_ns": t, "n_tokens": 1}
                for r in range(5)
                for i, t in enumerate(times(r))
            ]
        )

    slow = tokens(lambda r: [int(k * 300e6) for k in range(n)])
    spans = pairing.client_spans(req, slow, period_ms=6.0)
    assert spans["holes"].map(len).eq(0).all() and spans["client_ms_per_token"].eq(300.0).all()
    pairs = spans.assign(engine_ms_per_token=6.0, paired=True, why="")
    cz, _, ids = closure(pairs, 1, "prefill segments")
    assert cz.judged and cz.ok is False and ids == [0, 1, 2, 3, 4] and cz.client_ms == 300.0, cz

    # Requests 1 and 3: token 0, a 1 s stall, then the other 15 tokens in one burst (the rest on pace, 6 ms).
    def burst(r):
        if r in (1, 3):
            return [0] + [int(1e9 + k * 1e3) for k in range(1, n)]
        return [int(k * 6e6) for k in range(n)]

    spans = pairing.client_spans(req, tokens(burst), period_ms=6.0)
    assert spans.set_index("request_id").loc[[1, 3], "stalled_out"].all()
    cz, _, ids = closure(spans.assign(engine_ms_per_token=6.0, paired=True, why=""), 1, "prefill segments")
    assert ids == [0, 2, 4] and cz.excluded == {STALLED: [1, 3]} and not cz.judged  # 3 < 4 requests


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_stopped_worker_process_is_named_after_it_stays_stopped():
    from test_rank_watch import _Hook, _seen

    from tpcomm.attribute import ranks
    from tpcomm.attribute.ranks import RankWatch

    ps = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    hook = _Hook(_seen(ps))
    try:
        w = RankWatch(hook.info, 1, poll_s=0.1).start()
        assert sorted(w.local) == [0, 1] and w.stopped(0) is None
        os.kill(ps[1].pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while w.stopped(0) is None:
            assert time.monotonic() < deadline, "the stop was never seen"
            time.sleep(0.05)
        assert w.stopped(ranks.STOPPED_S) is None  # not yet long enough to end a level
        s = w.stopped(0.3 if time.sleep(0.35) is None else 0)
        assert s.rank == 1 and s.pid == ps[1].pid and s.state == "T"
        assert f"TP rank 1 (pid {ps[1].pid}) stopped answering during C=1" in s.message()
        # The route says so to a client that watches over HTTP, too.
        st = {x["rank"]: x["state"] for x in w._hook.workers()}
        assert st == {0: "S", 1: "T"}, st
        os.kill(ps[1].pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while w.stopped(0) is not None:  # continued: no longer stopped
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert w.stop() is None
    finally:
        for p in ps:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
        hook.stop()


def test_a_level_stopped_before_its_first_request_ended_is_analysed(tmp_path):
    """SIGSTOP on a worker before any request of the level ended: no request rows, the level named."""
    from tpcomm.attribute.run import reanalyse_run_dir
    from tpcomm.rundir import contract as C
    from tpcomm.rundir.layout import RunDir

    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    rd = RunDir(run)
    rd.write_table(C.LOAD_REQUESTS, pd.read_parquet(run / "load/requests.parquet").iloc[:0].astype(object))
    rd.write_table(C.LOAD_TOKENS, pd.read_parquet(run / "load/tokens.parquet").iloc[:0])
    levels = json.loads((run / "load/levels.json").read_text())
    levels[0].update(requests=0, failed=0, worker_problem="TP rank 1 (pid 7) stopped answering during C=1")
    rd.write_json(C.LOAD_LEVELS, levels[:1])
    res = reanalyse_run_dir(str(run))
    lv = res["attribution"]["levels"][0]
    assert not res["complete"] and lv["incomplete"] == "TP rank 1 (pid 7) stopped answering during C=1"
    assert not lv["attributed"] and lv["note"].startswith("not attributed: TP rank 1")
