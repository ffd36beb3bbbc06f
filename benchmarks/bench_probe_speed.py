"""Wall time of the default probe: `tpcomm probe --gpus 2` (the deepseek-v3 plan
at TP 2, batch 1, on gloo and vLLM's shared-memory all-reduce on CPU).
Target: within 60 s on 2 CPU ranks.

    .venv/bin/python benchmarks/bench_probe_speed.py [--gpus 2] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="ranks to start")
    ap.add_argument("--repeat", type=int, default=1, help="runs to time")
    a = ap.parse_args()
    walls = []
    for i in range(a.repeat):
        out = Path(tempfile.mkdtemp(prefix="tpcomm-bench-probe-"))
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "tpcomm.cli", "probe", "--gpus", str(a.gpus), "--out", str(out)],
            capture_output=True,
            text=True,
        )
        walls.append(time.monotonic() - t0)
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            sys.exit(p.returncode)
        doc = json.loads((out / "probe" / "results.json").read_text())
        c = doc["conditions"]
        if i == 0:
            print(
                f"conditions: {c.get('hardware')}; torch {c.get('torch')}, vLLM {c.get('vllm')}; world size {c['world_size']}; "
                f"backends {','.join(c['backends'])}; plan {c['plan']['model']} TP {c['plan']['tp']} batch {c['plan']['batches']}; "
                f"iters {c['iters']} + warmup {c['warmup']}; measurements {len(doc['results'])}, skipped {len(doc['skipped'])}"
            )
        print(f"run {i + 1}: wall {walls[-1]:.1f} s  (target <= {TARGET_S:.0f} s, ratio {walls[-1] / TARGET_S:.2f})")
    print(f"default probe wall time: best {min(walls):.1f} s, worst {max(walls):.1f} s over {len(walls)} run(s)")


if __name__ == "__main__":
    main()
