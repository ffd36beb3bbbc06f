"""How often `tpcomm compare`'s intervals call an A/A pair changed (false alarms) and a real shift resolved
(power), on synthetic steps with a known answer (tests/compare_synthetic.py: AR(1) compute noise, 16 requests of
63 decode steps per repeat, 2 ranks), plus the wall time of one comparison of two synthetic run directories.

    .venv/bin/python benchmarks/bench_compare_calibration.py [--pairs 300] [--json out.json]

Nominal: 5% of A/A pairs with any resolved difference (the band is simultaneous over a level's 8 differences).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from compare_synthetic import run_dir, sample  # noqa: E402

from tpcomm.compare.analysis import compare_runs  # noqa: E402
from tpcomm.compare.intervals import differences  # noqa: E402


def rates(pairs: int, reps: int = 1, offset_us: float = 0.0, block: str = "request", shift_us: float = 0.0) -> dict:
    rng = np.random.default_rng(7)
    any_ = per = covered = 0
    for i in range(pairs):
        a = [sample(1000 * i + 2 * j, block=block, offset_us=rng.normal(0, offset_us)) for j in range(reps)]
        b = [
            sample(1000 * i + 2 * j + 1, block=block, offset_us=rng.normal(0, offset_us), shift_us=shift_us)
            for j in range(reps)
        ]
        band = differences(a, b, seed=i, n=1000)
        any_ += any(iv.resolved for iv in band.intervals.values())
        iv = band.intervals["per_token"]
        per += iv.resolved
        covered += iv.lo <= shift_us / 1e3 <= iv.hi
    return {"pairs": pairs, "any_resolved": any_ / pairs, "per_token_resolved": per / pairs, "covered": covered / pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = args.pairs
    out = {
        "A/A, request blocks, 1 repeat per side": rates(n),
        "A/A, every step its own block (autocorrelation ignored)": rates(max(n // 10, 20), block="step"),
        "A/A, each repeat offset by N(0, 0.3 ms), 1 repeat per side": rates(n // 3, offset_us=300.0),
        "A/A, each repeat offset by N(0, 0.3 ms), 3 repeats per side": rates(n // 3, reps=3, offset_us=300.0),
        "A/B, compute +0.4 ms (7% of the token)": rates(n // 3, shift_us=400.0),
        "A/B, compute +0.8 ms (14% of the token)": rates(n // 3, shift_us=800.0),
    }
    with tempfile.TemporaryDirectory() as d:
        a, b = run_dir(Path(d) / "a", seed=1), run_dir(Path(d) / "b", seed=2)
        t = time.perf_counter()
        compare_runs(a, b)
        out["one comparison of two 16-request runs (s)"] = round(time.perf_counter() - t, 3)
    for k, v in out.items():
        print(f"{k}: {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
