"""Fidelity: the probe's p50 for vLLM's shared-memory all-reduce at the plan's
per-token size versus the same op timed inside a real vLLM-CPU server by the
tpcomm hook. Target: within 20%.

One after the other (two TP-2 jobs would fight over the same cores): a tiny
generated DeepSeek-V3-style model is served at TP 2 with the hook on, single
stream decode is recorded, the server stops, then `tpcomm probe --backend shm`
runs at the all-reduce size the hook saw.

    .venv/bin/python benchmarks/bench_probe_vs_hook.py [--requests 4 --output-len 64]

Both sides are printed with their conditions. The hook's duration includes
waiting for the other rank; its per-instance minimum over ranks (transfer
estimate, DESIGN.md) is printed beside it. The probe's isolated p50 has the
ranks lined up before each op by a tiny shm all-reduce (its residual skew is printed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpcomm.attribute.hook_client import HookClient  # noqa: E402


def decode(url: str, n: int, output_len: int) -> None:
    body = {
        "model": "tiny",
        "prompt": "tensor parallel inference splits every layer",
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
    }
    for _ in range(n):
        httpx.post(url + "/v1/completions", json=body, timeout=600).raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4, help="single-stream requests recorded by the hook")
    ap.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    ap.add_argument("--iters", type=int, default=300, help="probe iterations")
    a = ap.parse_args()

    from tpcomm.tinymodel import generate
    from tpcomm.vllm_server import VllmServer

    tmp = Path(tempfile.mkdtemp(prefix="tpcomm-bench-fidelity-"))
    server = VllmServer(model=str(generate(tmp / "tiny")), tp=2, plugin=True, log_path=str(tmp / "server.log"))
    print(f"starting vLLM server (TP 2, tiny model, log {tmp / 'server.log'}) ...", flush=True)
    server.start()
    try:
        hook = HookClient(server.url)
        decode(server.url, 1, 16)  # warm-up, compile
        hook.start()
        decode(server.url, a.requests, a.output_len)
        hook.stop()
        coll, _steps, meta = hook.frames()
    finally:
        server.stop()

    ar = coll[(coll["op"] == "all_reduce")]
    # decode steps of one sequence: the smallest all-reduce is the per-token one
    size = int(ar["bytes"].min())
    at = ar[ar["bytes"] == size]
    hook_p50 = float(at["duration_us"].median())
    per_instance_min = at.groupby(["step", "call_idx"])["duration_us"].min()
    hook_min_p50 = float(per_instance_min.median())
    backends = ",".join(sorted(at["backend"].astype(str).unique()))

    out = tmp / "probe-run"
    t0 = time.monotonic()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpcomm.cli",
            "probe",
            "--gpus",
            "2",
            "--backend",
            "shm",
            "--ops",
            "all_reduce",
            "--sizes",
            str(size),
            "--iters",
            str(a.iters),
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        sys.exit(1)
    rows = {r["timing"]: r for r in json.loads(p.stdout)}
    probe_p50 = rows["isolated"]["p50_us"]
    v = meta.get("versions", {})
    print(
        f"conditions: vLLM {v.get('vllm')} ({v.get('vllm_build')}), torch {v.get('torch')}, TP 2 on {v.get('cpu_count')} cores, "
        f"all_reduce of {size} B (bf16), hook backend {backends}, hook timing {','.join(map(str, meta.get('timing', [])))}, "
        f"{len(at)} hook records; probe shm, eager, {a.iters} iters, probe wall {time.monotonic() - t0:.1f} s"
    )
    print(f"{'source':42s} {'p50 (us)':>10s}")
    print(f"{'hook, per-rank duration (incl. wait)':42s} {hook_p50:10.2f}")
    print(f"{'hook, min over ranks per instance':42s} {hook_min_p50:10.2f}")
    print(f"{'probe, isolated (lined up before each op)':42s} {probe_p50:10.2f}")
    skew = rows["isolated"].get("skew_p50_us")
    print(
        f"{'probe, rank skew left after the line-up':42s} {skew:10.2f}"
        if skew is not None
        else "probe skew: not measured"
    )
    print(f"{'probe, pipelined (back-to-back)':42s} {rows['pipelined']['p50_us']:10.2f}")
    print(f"ratio probe isolated / hook min-over-ranks: {probe_p50 / hook_min_p50:.2f}  (target 0.8-1.2)")
    print(f"ratio probe isolated / hook duration:       {probe_p50 / hook_p50:.2f}")


if __name__ == "__main__":
    main()
