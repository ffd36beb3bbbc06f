"""The API server's holds on a loaded host, with the tpcomm plugin loaded and not loaded (issue 31).

Same machine, same tiny model (vLLM-CPU, TP 2, one core per rank), same load (one `while True: pass` per
core beside the server), same client (`tpcomm attribute`, C=1), two servers started one after the other:
plugin loaded (TPCOMM_HOOK=1) and not loaded (VLLM_PLUGINS=""). For each run it prints, from the client's
own files (load/tokens.parquet), how often a stream was held (a gap of more than HOLD_MS between two chunks
of one request), how long the holds were, and how many tokens the chunk after a hold carried: a chunk of
several tokens is the API server's output collector merging tokens its stream had not yet taken (vLLM's
side); single-token chunks arriving back to back after a gap would be the client (or the socket) late.
With the plugin on, the run's attribution also gives the five-term split (delivery) per run.

    PYTHONPATH=. flock /tmp/tpcomm-vllm.lock .venv/bin/python benchmarks/bench_delivery_holds.py --out /tmp/holds --runs 3

The machine's load is whatever else runs on it too (stated in the output: /proc/loadavg and the CPU
pressure at each run's end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HOLD_MS = 100.0


def machine_load() -> dict:
    out = {"loadavg_1m": float(Path("/proc/loadavg").read_text().split()[0])}
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
        out["cpu_pressure_some_avg10_pct"] = float(some[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        out["cpu_pressure_some_avg10_pct"] = None
    return out


def holds(run_dir: Path) -> dict:
    import numpy as np
    import pandas as pd

    tok = pd.read_parquet(run_dir / "load/tokens.parquet")
    req = pd.read_parquet(run_dir / "load/requests.parquet")
    req = req[req["in_stats"].astype(bool) & req["ok"].astype(bool)]
    tok = tok[tok["request_id"].isin(req["request_id"])].sort_values(["request_id", "token_idx"])
    gaps, after, held_req = [], [], set()
    for rid, g in tok.groupby("request_id"):
        t = g["t_ns"].to_numpy(dtype=np.int64)
        n = g["n_tokens"].to_numpy() if "n_tokens" in g.columns else np.ones(len(t), dtype=int)
        d = np.diff(t) / 1e6
        for i in np.flatnonzero(d > HOLD_MS):
            gaps.append(float(d[i]))
            after.append(int(n[i + 1]))
            held_req.add(int(rid))
    multi = int((tok.get("n_tokens", pd.Series(dtype=int)) > 1).sum())
    return {
        "requests": int(len(req)),
        "tokens": int(req["output_tokens"].sum()),
        "holds": len(gaps),
        "held_requests": len(held_req),
        "hold_ms": sorted(round(x) for x in gaps),
        "tokens_in_chunk_after_hold": after,
        "multi_token_chunks": multi,
        "ttft_ms_p50": float(req["ttft_ms"].median()),
        "ttft_ms_max": float(req["ttft_ms"].max()),
    }


def attribute(url: str, out: Path, requests: int) -> int:
    args = [sys.executable, "-m", "tpcomm.cli", "attribute", "--server-url", url, "--concurrency", "1"]
    args += ["--requests", str(requests), "--input-len", "16", "--output-len", "64", "--warmup", "1"]
    args += ["--max-rounds", "1", "--out", str(out)]
    return subprocess.run(args, capture_output=True, text=True).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the run directories and holds.json")
    ap.add_argument("--runs", type=int, default=3, help="attribute runs per server")
    ap.add_argument("--requests", type=int, default=16, help="requests per run (C=1, 64 tokens each)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes beside the server")
    ap.add_argument("--variants", default="on,off", help="plugin variants, in order: on, off")
    a = ap.parse_args()
    from tpcomm.tinymodel import generate
    from tpcomm.vllm_server import VllmServer

    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    model = generate(root / "model")
    results = []
    for variant in a.variants.split(","):
        srv = VllmServer(
            model=str(model),
            tp=2,
            plugin=variant == "on",
            log_path=str(root / f"server-{variant}.log"),
            extra_env={"VLLM_CACHE_ROOT": str(root / "vllm-cache"), "VLLM_USE_AOT_COMPILE": "0"},
        )
        with srv:
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
            try:
                time.sleep(2)
                for i in range(a.runs):
                    run = root / f"plugin-{variant}-{i}"
                    rc = attribute(srv.url, run, a.requests)
                    row = {"plugin": variant, "run": i, "rc": rc, "busy": a.busy, **machine_load(), **holds(run)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
    (root / "holds.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
