"""The closing split on a second architecture: a tiny dense Llama generated the same way as the demo's
DeepSeek-V3 model (tpcomm.tinymodel, arch="llama"), served by a real vLLM-CPU TP 2 server with the
plugin on, `tpcomm attribute` at C=1 and C=2. Then, last on that server (conftest.PHASE2_ORDER), the whole
server killed mid-run: nothing in it depends on the architecture, and this server's end of life costs no start.
One server start (~1.5 min on 2 cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from hookwait import wait_armed
from test_attribute_server import _run, assert_split_closes

from tpcomm.vllm_server import VllmServer


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory, request):
    from tpcomm.tinymodel import generate

    # Two TP-2 servers would fight over the cores: stop the pooled one first.
    try:
        factory = request.getfixturevalue("vllm_server_factory")
        close = getattr(getattr(factory, "__self__", None), "close", None)
        if close:
            close()
    except pytest.FixtureLookupError:
        pass
    model = generate(tmp_path_factory.mktemp("llama") / "model", arch="llama")
    log = tmp_path_factory.mktemp("logs") / "llama_server.log"
    with VllmServer(model=str(model), tp=2, plugin=True, log_path=str(log)) as srv:
        yield srv, model


@pytest.mark.vllm
def test_llama_split_closes_at_c1_and_c2(llama_server, tmp_path):
    srv, model = llama_server
    out = tmp_path / "run"
    r = _run(
        [
            "--server-url",
            srv.url,
            "--concurrency",
            "1,2",
            "--requests",
            "8",
            "--input-len",
            "16",
            "--output-len",
            "64",  # as the demo: a fixed per-request delivery cost (~13 ms here) stays a small part of each token
            "--warmup",
            "2",
            "--max-rounds",
            "2",
            "--model-config",
            str(model / "config.json"),
            "--out",
            str(out),
            "--json",
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summ = json.loads((out / "attribution/summary.json").read_text())
    levels = json.loads((out / "load/levels.json").read_text())
    assert [lv["concurrency"] for lv in summ["levels"]] == [1, 2]
    for lv in summ["levels"]:
        cc = lv["collectives_per_step"]
        # Dense Llama at TP 2: 2 all-reduces per layer x 4 + the embedding, and the logits all-gather.
        assert cc["match"] is True and cc["observed_total"] == 10, cc["detail"]
    assert_split_closes(summ, levels, out)


@pytest.mark.vllm
def test_a_whole_server_killed_mid_level_ends_the_run_incomplete_not_blamed_on_a_rank(llama_server, tmp_path):
    """SIGKILL to the server's whole process group (API server, engine, workers) during C=2 of a C=1,2 run:
    attribute exits 1 and says the whole server stopped, not one rank; the run directory is marked incomplete
    and keeps C=1 whole and what C=2 measured. Ends the server."""
    from tpcomm.attribute.hook_client import HookClient

    srv, model = llama_server
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
        start_new_session=True,
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
