"""Run: .venv/bin/python benchmarks/bench_compare_scale.py

compare_runs at the seed's scale (8 ranks x 123 collectives a step), both runs with the ranks' CPU wait
stated so that the host-load rule (compare/levels.py _host_load) runs; then again with a third run of A's
configuration as --again (A, B, A again: the drift allowance), side by side."""

import tempfile
import time
from pathlib import Path

from tpcomm.analysis.attribution import analyse_run_dir
from tpcomm.analysis.synthetic import make_client, make_records
from tpcomm.compare.analysis import compare_runs
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir

OUT = 64
with tempfile.TemporaryDirectory() as tmp:
    dirs = []
    for i, (wait, comp) in enumerate(((0.05, 3000.0), (1.05, 3600.0), (0.05, 3500.0))):
        steps = 10 * OUT
        coll, st, _ = make_records(
            steps=steps, tp=8, calls=123, prefill_every=OUT, idle_us=2000.0, seed=i + 1, compute_us=comp
        )
        req, tok = make_client(st)
        rd = RunDir(Path(tmp) / f"r{i}")
        for k, v in ((C.HOOK_COLLECTIVES, coll), (C.HOOK_STEPS, st), (C.LOAD_REQUESTS, req), (C.LOAD_TOKENS, tok)):
            rd.write_table(k, v)
        n = int(st["step"].nunique())
        per = {"ms": wait / 8 * n, "steps": n}
        rd.write_json(
            C.LOAD_LEVELS,
            [
                {
                    "concurrency": 1,
                    "repeat": 0,
                    "conditions": {"output_len": OUT},
                    "cpu_wait": {"ms_per_step": wait, "per_rank": {str(r): per for r in range(8)}},
                }
            ],
        )
        analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": OUT, "tp": 8})
        dirs.append(rd.path)
        print(f"run {i}: {len(coll):,} collective rows")
    for again in (None, dirs[2]):
        t = time.perf_counter()
        cmp = compare_runs(dirs[0], dirs[1], run_again=again)
        dt = time.perf_counter() - t
        lv = cmp.levels[0]
        print(
            f"compare_runs{' --again' if again else ''} {dt:.2f} s; changed {[t.name for t in lv.terms if t.changed]}; "
            f"host-load or drift marked {[t.name for t in lv.terms if t.host_load]}; cpu wait {lv.cpu_wait_ms_per_step}"
        )
