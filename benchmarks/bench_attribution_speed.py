"""Speed of the attribution analysis: one million schema-true collective
records (TP 2, 10 collectives per decode step, 50,000 steps) aligned across
ranks and split per step and per level. Target: <= 5 s on a 2-core machine.

    .venv/bin/python benchmarks/bench_attribution_speed.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

from tpcomm.analysis.align import align
from tpcomm.analysis.attribution import client_side
from tpcomm.analysis.split import assign_levels, decode_steps, rank_steps, top_sites
from tpcomm.analysis.synthetic import make_client, make_records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--target-s", type=float, default=5.0)
    args = ap.parse_args()
    tp, calls = 2, 10
    steps = args.records // (tp * calls)
    t = time.perf_counter()
    coll, st, truth = make_records(steps=steps, tp=tp, calls=calls, prefill_every=64)
    gen_s = time.perf_counter() - t
    # Client: one request per prefill, each token arriving 100 us after its step ends (single stream).
    req, tokens = make_client(st, delivery_us=100.0)
    window = [
        {
            "concurrency": 1,
            "repeat": 0,
            "t_start_ns": int(st["t_start_ns"].min()),
            "t_end_ns": int(st["t_end_ns"].max()) + 1,
        }
    ]

    t = time.perf_counter()
    aligned = align(coll)
    t_align = time.perf_counter() - t
    by_rank = assign_levels(rank_steps(aligned, st), window)
    dsteps = decode_steps(by_rank)
    top_sites(assign_levels(aligned, window), dsteps)
    cs = client_side(by_rank, req, tokens, 1)  # the engine's split, each request paired, the closure
    sp = cs["split"]
    total = time.perf_counter() - t

    err = abs(sp["per_token_ms"]["transfer"] * 1e3 - truth["transfer_us"]) / truth["transfer_us"] * 100
    print(
        f"records {len(coll):,} (TP {tp}, {calls} collectives/step, {steps:,} steps), cpus {os.cpu_count()}, "
        f"pandas {pd.__version__}, numpy {np.__version__}"
    )
    print(
        f"generate {gen_s:.2f} s (not counted) | align {t_align:.2f} s | align + split {total:.2f} s "
        f"| target {args.target_s:.1f} s | ratio {total / args.target_s:.2f} | {'OK' if total <= args.target_s else 'SLOW'}"
    )
    print(
        f"transfer per decode step {sp['per_token_ms']['transfer'] * 1e3:.1f} us vs truth "
        f"{truth['transfer_us']:.1f} us ({err:.1f}% off); closure per request {cs['closure'].diff_pct:+.2f}% "
        f"({cs['closure'].statistic})"
    )


if __name__ == "__main__":
    main()
