"""The whole analysis of a run directory (analysis/attribution.py analyse_run_dir: every attribute run, --reanalyse,
the trace route's summary) at the seed's scale: 8 ranks x 123 collectives per decode step (a 61-layer MLA model),
one stream of 64-token requests, synthetic records with a known answer (analysis/synthetic.py). Run at three
sizes side by side; the time per collective row should stay flat (linear in the records).

Before 2026-12-06 the clock estimate inside it (median_interval's exact integer walk, one value per collective
instance) grew as n squared and did not end at these sizes: see benchmarks/bench_clock_estimate_scale.py.

    .venv/bin/python benchmarks/bench_analyse_run_dir_scale.py
"""

import tempfile
import time
from pathlib import Path

from tpcomm.analysis.attribution import analyse_run_dir
from tpcomm.analysis.synthetic import make_client, make_records
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir

OUTPUT_LEN = 64
with tempfile.TemporaryDirectory() as tmp:
    per_row = []
    for requests in (2, 10, 40):
        steps = requests * OUTPUT_LEN
        coll, st, _ = make_records(steps=steps, tp=8, calls=123, prefill_every=OUTPUT_LEN, idle_us=2000.0)
        req, tok = make_client(st)
        rd = RunDir(Path(tmp) / f"run{requests}")
        rd.write_table(C.HOOK_COLLECTIVES, coll)
        rd.write_table(C.HOOK_STEPS, st)
        rd.write_table(C.LOAD_REQUESTS, req)
        rd.write_table(C.LOAD_TOKENS, tok)
        rd.write_json(C.LOAD_LEVELS, [{"concurrency": 1, "repeat": 0, "conditions": {"output_len": OUTPUT_LEN}}])
        t = time.perf_counter()
        att = analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": OUTPUT_LEN, "tp": 8})
        dt = time.perf_counter() - t
        per_row.append(dt / len(coll) * 1e6)
        (lv,) = att.levels
        five = lv.delivery_term
        print(
            f"{requests:>3} requests, {steps:>5} steps, {len(coll):>9,} collective rows: {dt:6.2f} s "
            f"({per_row[-1]:.2f} us per row); {lv.engine_ms_per_token:.4f} ms per token, five terms "
            f"{five.diff_pct:+.2f}% of the {five.diff_of}'s"
        )
    print(f"time per row, largest / smallest: {per_row[-1] / per_row[0]:.2f} (1.0 = linear)")
