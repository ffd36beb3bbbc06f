"""The clock estimate at the seed's scale (every attribute run calls it: analysis/attribution.py on_one_clock):
8 ranks x 123 collectives per decode step (a 61-layer MLA model) x S steps, synthetic records
(analysis/synthetic.py). Per rank, the median of the per-instance exit differences and its distribution-free
interval (analysis/closure.py median_interval), one value per collective instance.

Prints, side by side in one run: median_interval's exact integer walk (the code before 2026-12-06, kept for
n <= EXACT_INTERVAL_N) and the float64 sum used above it, on the same values; then the whole estimate
(align + clocks.estimate) at three scales, with its time per instance (flat = linear).

    .venv/bin/python benchmarks/bench_clock_estimate_scale.py
"""

import time

import numpy as np

from tpcomm.analysis import clocks
from tpcomm.analysis.align import align
from tpcomm.analysis.closure import _order_statistic, _order_statistic_exact
from tpcomm.analysis.synthetic import make_records

print("median_interval's order statistic, the same n both ways:")
walk = {}
for n in (2_000, 8_000, 16_000):
    t = time.perf_counter()
    exact = _order_statistic_exact(n)
    te = walk[n] = time.perf_counter() - t
    t = time.perf_counter()
    fast = _order_statistic(n)
    tf = time.perf_counter() - t
    same = exact[0] == fast[0] and abs(exact[1] - fast[1]) < 1e-9
    print(f"  n {n:>7,}: exact walk {te * 1e3:8.1f} ms, float64 {tf * 1e3:6.2f} ms ({te / tf:,.0f}x); same j: {same}")

print("align + clocks.estimate (8 ranks x 123 collectives per step):")
for steps in (130, 1300, 5200):
    coll, _, _ = make_records(steps=steps, tp=8, calls=123)
    t = time.perf_counter()
    est = clocks.estimate(align(coll))
    dt = time.perf_counter() - t
    inst = next(iter(est.values()))["instances"]
    print(
        f"  {steps:>5} steps, {len(coll):>9,} rows, {inst:>7,} instances per rank: {dt:6.2f} s "
        f"({dt / len(coll) * 1e6:.2f} us per row); rank 1 offset {est[1]['offset_us']:+.2f} us "
        f"[{est[1]['lo_us']:+.2f}, {est[1]['hi_us']:+.2f}] coverage {est[1]['coverage']:.4f}"
    )
growth = np.log(walk[16_000] / walk[8_000]) / np.log(2)
print(
    f"(the exact walk was not run at 160 k instances per rank: from 8 k to 16 k values its time grew as n^{growth:.1f}, "
    "and the estimate calls it once per rank other than rank 0)"
)
