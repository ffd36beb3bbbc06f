"""Fidelity of `tpcomm probe --replay` against real serving, side by side in one run.

On the CPU demo model (tpcomm/tinymodel.py) at TP 2, vLLM's shm all-reduce:
  1. a vLLM-CPU server with the tpcomm hook decodes single-stream requests under
     `tpcomm attribute --concurrency 1` (the in-serving truth), then stops;
  2. `tpcomm probe --replay` replays the same model's decode step on 2 ranks
     (shm), first at --work-scale 1 (the bytes the tiny model's layers read),
     then at a scale calibrated so the replay's compute-only step equals
     attribute's compute per token at C=1 (the tiny model's layers cost far more
     than their bytes on a CPU: Python and op dispatch, not memory streaming;
     a scale above 1 re-reads each layer's own bytes, keeping its footprint).
Targets: replay in-step all-reduce p50 within 20% of the hook's in-serving
all-reduce p50; replay interconnect cost per token within 25% of attribute's
transfer + wait per token at C=1. Both replays are written into the attribute
run directory, so `tpcomm report RUN` shows them beside the hook's figures.

    flock /tmp/tpcomm-heavy.lock .venv/bin/python benchmarks/bench_replay.py [--requests 8 --output-len 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TPCOMM = [sys.executable, "-m", "tpcomm.cli"]


def _run(args: list[str], timeout: float = 900) -> str:
    p = subprocess.run(TPCOMM + args, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        sys.exit(f"failed: tpcomm {' '.join(args)}")
    return p.stdout


def serve_and_attribute(model: Path, run: Path, requests: int, output_len: int) -> None:
    from tpcomm.vllm_server import VllmServer

    server = VllmServer(model=str(model), tp=2, plugin=True, log_path=str(run.parent / "server.log"))
    print(f"starting vLLM server (TP 2, tiny model, log {run.parent / 'server.log'}) ...", flush=True)
    server.start()
    try:
        _run(
            [
                "attribute",
                "--server-url",
                server.url,
                "--concurrency",
                "1",
                "--requests",
                str(requests),
                "--output-len",
                str(output_len),
                "--out",
                str(run),
            ]
        )
    finally:
        server.stop()


def hook_figures(run: Path) -> dict:
    summ = json.loads((run / "attribution" / "summary.json").read_text())
    lv = next(x for x in summ["levels"] if x.get("concurrency") == 1)
    pt = lv["per_token_ms"]
    coll = pd.read_parquet(run / "hook" / "collectives.parquet")
    steps = pd.read_parquet(run / "hook" / "steps.parquet")
    dec = steps[(steps["kind"] == "decode") & (steps["num_seqs"] == 1)][["rank", "step"]]
    ar = coll[coll["op"] == "all_reduce"].merge(dec, on=["rank", "step"])
    ar = ar[ar["bytes"] == ar["bytes"].min()]
    per_instance_min = ar.groupby(["step", "call_idx"])["duration_us"].min()
    # Who waits in serving (attribute's alignment): one rank always late would be a fixed skew
    # (replayable with --skew-us); both ranks waiting alike is lateness that alternates.
    from tpcomm.analysis.align import align

    allc = align(coll.merge(dec, on=["rank", "step"]))
    wait_by_rank = allc.groupby("rank")["wait_us"].mean()
    return {
        "compute_us": pt["compute"] * 1e3,
        "transfer_us": pt["transfer"] * 1e3,
        "wait_us": pt["wait"] * 1e3,
        "ar_p50_us": float(ar["duration_us"].median()),
        "ar_min_p50_us": float(per_instance_min.median()),
        "wait_by_rank_us": {int(k): float(v) for k, v in wait_by_rank.items()},
        "ar_bytes": int(ar["bytes"].iloc[0]),
        "ar_records": len(ar),
        "backend": ",".join(sorted(ar["backend"].astype(str).unique())),
        "versions": (json.loads((run / "meta.json").read_text()).get("versions") or {}),
    }


def replay(model: Path, run: Path, scale: float, steps: int, context: int) -> dict:
    out = _run(
        [
            "probe",
            "--replay",
            "--gpus",
            "2",
            "--model",
            str(model),
            "--backend",
            "shm",
            "--work-scale",
            f"{scale:.6g}",
            "--context",
            str(context),
            "--steps",
            str(steps),
            "--warmup",
            "10",
            "--out",
            str(run),
            "--json",
        ]
    )
    (e,) = json.loads(out)
    ar = min((o for o in e["ops"] if o["timing"] == "full" and o["op"] == "all_reduce"), key=lambda o: o["bytes"])
    return {
        "scale": scale,
        "compute_p50_us": e["timings"]["compute"]["p50_us"],
        "full_p50_us": e["timings"]["full"]["p50_us"],
        "cost_us": e["interconnect_cost_us_per_token_mean"],
        "cost_p50_us": e["interconnect_cost_us_per_token"],
        "in_step_us": e["in_step_comm_us_per_token"],
        "ar_p50_us": ar["duration_us_p50"],
        "ar_transfer_p50_us": ar["transfer_us_p50"],
        "split": e["full_step_split_us"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8, help="single-stream requests recorded by attribute")
    ap.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    ap.add_argument("--steps", type=int, default=200, help="replay steps per timing")
    a = ap.parse_args()
    from tpcomm.tinymodel import generate

    tmp = Path(tempfile.mkdtemp(prefix="tpcomm-bench-replay-"))
    model = generate(tmp / "tiny")
    run = tmp / "run"
    t0 = time.monotonic()
    serve_and_attribute(model, run, a.requests, a.output_len)
    h = hook_figures(run)
    # The KV the replay reads: the prompt plus half the output, the mean context of a request's decode steps.
    context = 32 + a.output_len // 2
    r1 = replay(model, run / "replay-scale1", 1.0, a.steps, context)
    # Calibrate: the compute-only step should cost attribute's compute per token (a scale above 1
    # re-reads each layer's bytes, so time grows about linearly; two corrections at most).
    r2 = r1
    for _ in range(3):
        scale = r2["scale"] * h["compute_us"] / max(r2["compute_p50_us"], 1e-3)
        r2 = replay(model, run / "replay-calibrating", scale, a.steps, context)
        if abs(r2["compute_p50_us"] / h["compute_us"] - 1) < 0.1:
            break
    r2 = replay(model, run, r2["scale"], a.steps, context)  # into the attribute run directory, for the report
    v = h["versions"]
    hook_tw = h["transfer_us"] + h["wait_us"]
    print(
        f"conditions: tiny DeepSeek-V3-style model (tpcomm/tinymodel.py), TP 2 on {v.get('cpu_count')} cores, vLLM {v.get('vllm')} "
        f"({v.get('vllm_build')}), torch {v.get('torch')}; hook backend {h['backend']}, eager, all_reduce of {h['ar_bytes']} B, "
        f"{h['ar_records']} hook records at C=1 ({a.requests} requests x {a.output_len} tokens); replay shm, eager, {a.steps} steps, "
        f"context {context} tokens; bench wall {time.monotonic() - t0:.0f} s"
    )
    print(
        f"serving: mean wait per collective by rank (us): {', '.join(f'rank {k} {v:.1f}' for k, v in h['wait_by_rank_us'].items())}"
    )
    rs = (r1, r2)

    def row(label, f, fmt_="{:>11.2f}", tail=""):
        print(f"{label:48s}" + "".join(fmt_.format(f(r)) for r in rs) + tail)

    print(f"{'':48s} {'scale 1':>11s} {'calibrated':>11s}")
    row("replay work scale", lambda r: r["scale"], "{:>11.3g}")
    row(
        "replay compute-only step p50 (us)",
        lambda r: r["compute_p50_us"],
        "{:>11.1f}",
        f"   attribute compute/token {h['compute_us']:.1f}",
    )
    row(
        "replay in-step all-reduce p50 (us)",
        lambda r: r["ar_p50_us"],
        tail=f"   hook in-serving p50 {h['ar_p50_us']:.2f}",
    )
    row("  ratio replay / hook (target 0.8-1.2)", lambda r: r["ar_p50_us"] / h["ar_p50_us"])
    row(
        "replay in-step all-reduce transfer p50 (us)",
        lambda r: r["ar_transfer_p50_us"],
        tail=f"   hook min-over-ranks p50 {h['ar_min_p50_us']:.2f}",
    )
    # Means on both sides: attribute's per-token terms are (trimmed) means over decode steps.
    row(
        "replay interconnect cost per token, mean (us)",
        lambda r: r["cost_us"],
        "{:>11.1f}",
        f"   attribute transfer+wait {hook_tw:.1f}",
    )
    row("  ratio replay / attribute (target 0.75-1.25)", lambda r: r["cost_us"] / hook_tw)
    row("  (the same from step p50s, us)", lambda r: r["cost_p50_us"], "{:>11.1f}")
    row(
        "replay in-step transfer + wait per token (us)",
        lambda r: r["in_step_us"],
        "{:>11.1f}",
        f"   (attribute transfer {h['transfer_us']:.1f} + wait {h['wait_us']:.1f})",
    )
    print(f"run directory (hook + calibrated replay; `tpcomm report` shows both): {run}")


if __name__ == "__main__":
    main()
