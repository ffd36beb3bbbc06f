"""CLI speed: `tpcomm --help` and `plan`/`predict` for every preset, beyond interpreter start.

Targets (issue 2): --help under 0.5 s; plan/predict for any preset under 1 s,
both measured as (command wall time) - (bare `python -c pass` wall time), the
median of N runs, side by side in one run. Prints one row per command.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

N = 5
PY = sys.executable
BIN = str(Path(PY).parent / "tpcomm")


def _once(cmd: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.decode()[-500:]}")
    return time.perf_counter() - t


def wall(cmd: list[str]) -> tuple[float, float]:
    """(median wall s, median of (wall - interpreter start) s), the two interleaved so load hits both alike."""
    walls, beyond = [], []
    for _ in range(N):
        b = _once([PY, "-c", "pass"])
        w = _once(cmd)
        walls.append(w)
        beyond.append(w - b)
    return statistics.median(walls), statistics.median(beyond)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tpcomm.models import preset_names

    print(f"each row: median of {N} runs, each run interleaved with a bare `python -c pass` (interpreter start)")
    print(f"{'command':60s} {'wall ms':>8s} {'beyond start ms':>16s} {'target ms':>9s} ok")
    rows = [(["--help"], 500)]
    for p in preset_names():
        rows.append((["plan", "--model", p, "--tp", "8"], 1000))
        rows.append((["predict", "--model", p, "--tp", "8", "--gpu", "h100-sxm"], 1000))
    worst = 0.0
    for args, target in rows:
        t, beyond = wall([BIN, *args])
        beyond *= 1e3
        worst = max(worst, beyond / target)
        print(
            f"{'tpcomm ' + ' '.join(args):60s} {t * 1e3:8.0f} {beyond:16.0f} {target:9d} {'yes' if beyond < target else 'NO'}"
        )
    print(f"worst ratio to target: {worst:.2f} (< 1 meets every target)")


if __name__ == "__main__":
    main()
