"""Import speed and peak memory of `tpcomm trace`: (1) traces with the structure of a vLLM GPU worker's at
millions of events per rank, beside HolisticTraceAnalysis; (2) a 100 MB Kineto trace, beside json.load.

(1) --vllm-gpu: tests/vllm_gpu_trace.py writes one gzipped trace per rank (CUDA-graph replays, eager prefill,
async scheduling, GPU-side execute_context ranges, NCCL and custom all-reduce kernels, 61 layers x 2
all-reduces per step, with_stack python_function events: about 9 events per kernel as in published vLLM
profiles). Measured, each in a fresh process: tpcomm's read + tables of one rank (CPU seconds on one core, peak
memory), `tpcomm trace`'s whole import of all ranks (importer.load + analyse: wall seconds, ranks in parallel
processes, peak memory of the largest process), and HTA 0.5 (TraceAnalysis parse + get_gpu_kernel_breakdown,
its communication / computation kernel breakdown: wall seconds, peak memory), on the same files. The collective
time found is checked against the generated truth.

    python benchmarks/bench_trace_import.py --vllm-gpu [--events 5000000] [--ranks 2] [--hta-events 500000]

Targets (issue 28): 5 M events per rank in <= 60 s of CPU on one core; eight such ranks in <= 2 min wall on
8 cores; the same split as the small trace repeated (tests/test_trace_scale.py).

(2) the 100 MB mode (issue 18):

The trace is made from a real one (tests/data/trace_vllm_cpu_tp2/rank0.pt.trace.json.gz, vLLM-CPU TP 2): its
events are replicated, each copy shifted in time after the previous one, until the file reaches --mb MB. Each
measurement runs in a fresh Python process (peak RSS from getrusage, minus that process's RSS before reading).

    python benchmarks/bench_trace_import.py [--mb 100] [--gzip]

Prints: file size, events, seconds and peak MB for (a) tpcomm's streaming read + the rank's step/collective
tables, (b) json.load of the same file, and their ratios. Target (issue 18): (a) <= 20 s for 100 MB on 2 cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests/data/trace_vllm_cpu_tp2/rank0.pt.trace.json.gz"
sys.path.insert(0, str(ROOT / "tests"))

GPU_CHILD = r"""
import json, resource, sys, time, logging
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
mode, folder, arg = sys.argv[1], sys.argv[2], sys.argv[3]
import pandas, numpy
if mode == "hta":
    from hta.trace_analysis import TraceAnalysis
    logging.getLogger("hta").setLevel(logging.ERROR)
else:
    from tpcomm.trace import importer
    from tpcomm.trace.reader import read_trace
    from tpcomm.trace.steps import keep_args, rank_tables
base = rss_mb()
w, c = time.perf_counter(), time.process_time()
if mode == "one":
    tr = read_trace(arg, keep_args)
    tab = rank_tables(tr, 1)
    extra = {"events": tr.events_seen, "collective_us": float(tab.collectives["duration_us"].sum())}
elif mode == "all":
    imp = importer.analyse(importer.load(importer.find_traces(folder), jobs=int(arg)))
    per = imp.traces.collectives.groupby("rank")["duration_us"].sum()
    extra = {"collective_us": {int(r): float(v) for r, v in per.items()}, "split": imp.split.get("per_token_ms")}
else:
    ta = TraceAnalysis(trace_dir=folder)
    kb = ta.get_gpu_kernel_breakdown(visualize=False)[0]
    extra = {"kernel_types": kb.to_dict(orient="records")}
wall, cpu = time.perf_counter() - w, time.process_time() - c
self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kids_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_mb": self_peak - base, "child_peak_mb": kids_peak,
                  **extra}, default=str))
"""


def _gpu_child(mode: str, folder: Path, arg: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", GPU_CHILD, mode, str(folder), arg], capture_output=True, text=True, env=env
    )
    if out.returncode:
        raise SystemExit(f"{mode} failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _write(args) -> dict:
    from vllm_gpu_trace import Shape, steps_for, write_rank

    path, rank, world, events = args
    return write_rank(path, rank, world, steps_for(events, Shape()), Shape())


def vllm_gpu(events: int, ranks: int, hta_events: int, jobs: int, keep: str | None) -> None:
    from vllm_gpu_trace import Shape

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(keep or tmp)
        sets = {"tpcomm": (events, ranks)}
        if hta_events:
            sets["hta"] = (hta_events, ranks)
        made = {}
        for label, (n, k) in sets.items():
            if label == "hta" and (n, k) == sets["tpcomm"]:
                made[label] = made["tpcomm"]
                continue
            d = root / f"{label}-{n}x{k}"
            d.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            with ProcessPoolExecutor(min(k, jobs)) as pool:
                truths = list(pool.map(_write, [(d / f"rank{r}.pt.trace.json.gz", r, k, n) for r in range(k)]))
            mb = sum(p.stat().st_size for p in d.iterdir()) / 1e6
            made[label] = (d, truths)
            print(
                f"generated {k} rank(s) x {truths[0]['events']:,} events ({len(truths[0]['steps'])} steps of "
                f"{Shape().kernels_per_step} kernels), {mb:.0f} MB gzipped, in {time.perf_counter() - t:.0f} s"
            )
        d, truths = made["tpcomm"]
        want = sum(x["coll_ns"] for x in truths[0]["steps"]) / 1e3
        one = _gpu_child("one", d, str(d / "rank0.pt.trace.json.gz"))
        print(
            f"tpcomm, one rank ({one['events']:,} events): {one['cpu_s']:.1f} s CPU, {one['wall_s']:.1f} s wall, "
            f"peak +{one['peak_mb']:.0f} MB; {1e6 * one['cpu_s'] / one['events']:.2f} us CPU per event; "
            f"collective time {one['collective_us']:.0f} us (generated: {want:.0f})"
        )
        allr = _gpu_child("all", d, str(jobs))
        print(
            f"tpcomm trace, all {ranks} ranks ({min(jobs, ranks)} processes): {allr['wall_s']:.1f} s wall, "
            f"peak of the largest process {max(allr['peak_mb'], allr['child_peak_mb']):.0f} MB; "
            f"split (ms/token) {allr['split']}"
        )
        if hta_events:
            hd, ht = made["hta"]
            ours = _gpu_child("all", hd, str(jobs))
            ref = _gpu_child("hta", hd, "")
            print(
                f"same {ranks} rank(s) x {ht[0]['events']:,} events: tpcomm trace {ours['wall_s']:.1f} s wall, "
                f"peak {max(ours['peak_mb'], ours['child_peak_mb']):.0f} MB | HTA parse + kernel breakdown "
                f"{ref['wall_s']:.1f} s wall, peak {max(ref['peak_mb'], ref['child_peak_mb']):.0f} MB | ratio "
                f"time {ours['wall_s'] / ref['wall_s']:.2f}, memory "
                f"{max(ours['peak_mb'], ours['child_peak_mb']) / max(ref['peak_mb'], ref['child_peak_mb']):.2f}"
            )
            print(f"  HTA kernel types: {ref['kernel_types']}")


CHILD = r"""
import json, resource, sys, time, gzip
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
path, mode = sys.argv[1], sys.argv[2]
if mode == "tpcomm":
    from tpcomm.trace.reader import read_trace
    from tpcomm.trace.steps import keep_args, rank_tables
import pandas, numpy  # both modes pay for these imports before the baseline
base = rss_mb()
t = time.perf_counter()
if mode == "tpcomm":
    tr = read_trace(path, keep_args)
    tab = rank_tables(tr, 2)
    n, extra = len(tr), f"steps={len(tab.steps)} collectives={len(tab.collectives)}"
else:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        doc = json.load(f)
    n, extra = len(doc["traceEvents"]), ""
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": dt, "events": n, "peak_mb": peak - base, "extra": extra}))
"""


def make_trace(path: Path, mb: float, gz: bool) -> int:
    doc = json.load(gzip.open(SRC))
    ev = doc.pop("traceEvents")
    timed = [e for e in ev if "ts" in e and e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    head = json.dumps(doc)[:-1]
    opener = gzip.open if gz else open
    n, copy, written = 0, 0, 0
    with opener(path, "wt") as f:
        f.write(head + ', "traceEvents": [')
        first = True
        while True:
            for e in ev:
                if copy and "ts" not in e:
                    continue
                e2 = dict(e, ts=e["ts"] + copy * span) if "ts" in e else e
                line = ("" if first else ",\n") + json.dumps(e2)
                f.write(line)
                written += len(line)
                first = False
                n += 1
            copy += 1
            if written >= mb * 1e6:  # JSON characters (ASCII: bytes) before compression
                break
        f.write("]}")
    return n


def run(path: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="Size of the (uncompressed) trace in MB (1e6 bytes).")
    ap.add_argument("--gzip", action="store_true", help="Write and read the trace gzipped.")
    ap.add_argument("--vllm-gpu", action="store_true", help="Generated vLLM-GPU-like traces, beside HTA.")
    ap.add_argument("--events", type=float, default=5e6, help="--vllm-gpu: events per rank.")
    ap.add_argument("--ranks", type=int, default=2, help="--vllm-gpu: ranks (one file each).")
    ap.add_argument("--hta-events", type=float, default=5e5, help="--vllm-gpu: events per rank of HTA's set (0: none).")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="--vllm-gpu: processes.")
    ap.add_argument("--keep", default=None, help="--vllm-gpu: folder to write (and keep) the traces in.")
    a = ap.parse_args()
    if a.vllm_gpu:
        vllm_gpu(int(a.events), a.ranks, int(a.hta_events), a.jobs, a.keep)
        return
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / ("rank0.pt.trace.json" + (".gz" if a.gzip else ""))
        n = make_trace(p, a.mb, a.gzip)
        size = p.stat().st_size / 1e6
        ours, ref = run(p, "tpcomm"), run(p, "json.load")
    print(
        f"trace: {size:.1f} MB on disk ({'gzip, ' if a.gzip else ''}{a.mb:.0f} MB of JSON), {n} events "
        f"(real vLLM-CPU rank-0 trace replicated)"
    )
    print(f"tpcomm read + tables: {ours['s']:.2f} s, peak +{ours['peak_mb']:.0f} MB  ({ours['extra']})")
    print(f"json.load:            {ref['s']:.2f} s, peak +{ref['peak_mb']:.0f} MB")
    print(
        f"ratio tpcomm/json.load: time {ours['s'] / ref['s']:.2f}, peak memory {ours['peak_mb'] / ref['peak_mb']:.2f}"
    )


if __name__ == "__main__":
    main()
