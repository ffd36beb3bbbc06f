"""The machine's load over a level, as a measured condition of its figures (results.HostLoad).

Read by the client, and only where it runs on the server's machine (the rank watch verified the workers'
or the API server's pid there): Linux CPU pressure (/proc/pressure/cpu, `some total`: the time some
runnable task waited for a CPU, in us) over the level's last round, the 1-minute load average at its end,
the API server's own CPU wait (the schedstat run_delay of its threads, ns) over the same round, per
token the round delivered, and the client's (this process's) the same way: which of the two waited is
where a token's delivery went on a loaded host. And the host's speed as one thread gets it: a fixed reference
workload (REFERENCE_CODE, ~1.5 ms, in a fresh interpreter) run 9 times before the level's recording starts
and 9 times after its records are read (outside the window of the ranks' CPU wait, which it would add to:
the workers spin for a CPU for a second after each call), its trimmed mean (a wait for a CPU included:
measured here, beside 2 and 4 busy processes on 2 CPUs, 1.5 -> 3.1 and 4.7 ms) and its median (the speed
while it ran: a slower clock, the hypervisor's steal, a neighbour on the core's caches; 1.5 ms beside the
busy processes too, as a CFS slice outlasts one run). It sees the host at the level's edges, not during it.
compare sets a difference of the mean between two runs against their terms (compare/levels.py). Others'
processes on a shared machine are in the pressure and the load: they are the host's, and the report says
so. Nothing here asks the server anything.

Units: *_pct percent, *_ms milliseconds, *_ns / *_us as named.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HIGH_PRESSURE_PCT = 50.0  # some runnable task waited for a CPU half of the time: the host was loaded
REFERENCE_RUNS = 9  # timed runs of the reference work at each edge of a level (after one untimed run)
REFERENCE_N = 30_000  # the reference work's loop count: about 1.5 ms on a 2020s server core
REFERENCE_TRIM = 2  # the slowest runs of the 18 left out of the mean (reference_figures)


# The reference work and its timing, run in a fresh interpreter (`python -I -S -c`): in attribute's own
# process its runs took 50-56 ms on average against a 1.6 ms median (2026-12-07, a real A/A on 2 cores): rare
# stalls of about a second from the client's own threads and heap, not the host's. Integer arithmetic in the
# interpreter, no memory traffic to speak of; the same work in every run of this schema.
REFERENCE_CODE = """
import sys, time, json
def work(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return x
runs, n = int(sys.argv[1]), int(sys.argv[2])
work(n)
out = []
for _ in range(runs):
    t0 = time.perf_counter_ns()
    work(n)
    out.append((time.perf_counter_ns() - t0) / 1e6)
print(json.dumps(out))
"""


def reference_runs(runs: int = REFERENCE_RUNS, n: int = REFERENCE_N) -> list[float]:
    """ms of each of `runs` timed runs of the reference work in a fresh interpreter (the first, untimed, warms
    it); [] where that could not run (no interpreter to start, a 10 s timeout: the figure is then not measured,
    and the level is not held up by it)."""
    try:
        p = subprocess.run(
            [sys.executable, "-I", "-S", "-c", REFERENCE_CODE, str(runs), str(n)],
            capture_output=True,
            text=True,
            timeout=10,
        )
        got = json.loads(p.stdout) if p.returncode == 0 else []
        return [float(x) for x in got] if isinstance(got, list) else []
    except (OSError, ValueError, TypeError, subprocess.SubprocessError):
        return []


def reference_figures(before: list[float], after: list[float]) -> dict:
    """HostLoad's reference fields from the runs before a level's recording and after it: the mean without
    the slowest REFERENCE_TRIM runs (one CFS slice lost in one run of 18 would move a plain mean by up to a
    fifth; contention that reaches more runs than that still shows) and the median. None each where either
    side did not run in full, or a time is not a positive number."""
    runs = before + after
    ok = len(before) == len(after) == REFERENCE_RUNS and all(math.isfinite(x) and x > 0 for x in runs)
    if not ok:
        return {"reference_ms": None, "reference_median_ms": None}
    kept = sorted(runs)[: len(runs) - REFERENCE_TRIM]
    return {"reference_ms": statistics.mean(kept), "reference_median_ms": statistics.median(runs)}


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of the whole machine since boot (/proc/stat's cpu line: user, nice, system,
    irq, softirq; guest time is inside user), or None off Linux."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return f[0] + f[1] + f[2] + f[5] + f[6], (f[7] if len(f) > 7 else 0)
    except (OSError, ValueError, IndexError):
        return None


def _tree(*roots: int) -> set[int]:
    """`roots` and every process descended from them (the vLLM server: API server, engine core, workers), from
    one scan of /proc."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return set(roots)
    for d in names:
        if d.isdigit():
            try:
                st = Path(f"/proc/{d}/stat").read_text()
                children.setdefault(int(st[st.rindex(")") + 2 :].split()[1]), []).append(int(d))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = set(roots), list(roots)
    while todo:
        kids = [c for c in children.get(todo.pop(), []) if c not in out]
        out.update(kids)
        todo += kids
    return out


def _cpu_ticks(pids: set[int]) -> dict[int, int]:
    """utime + stime clock ticks per pid (all its threads), the pids that could be read."""
    out = {}
    for pid in pids:
        try:
            st = Path(f"/proc/{pid}/stat").read_text()
            f = st[st.rindex(")") + 2 :].split()
            out[pid] = int(f[11]) + int(f[12])
        except (OSError, ValueError, IndexError):
            continue
    return out


def _pressure_us() -> int | None:
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _run_delay_ns(pid: int) -> int | None:
    """Summed over the process's threads (schedstat's second field)."""
    total, seen = 0, False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
            seen = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total if seen else None


class HostLoadMeter:
    """start() before a round, stop(tokens) after it: the HostLoad document of that round (or None)."""

    def __init__(self, api_pid: int | None, worker_pids: tuple[int, ...] = ()):
        self.api_pid = api_pid
        self.worker_pids = tuple(worker_pids)  # the server's workers seen on this machine (Ray's are no children)
        self._t0 = self._p0 = self._d0 = None
        self._m0, self._tree, self._s0 = None, set(), {}

    def start(self) -> None:
        self._t0, self._p0 = time.monotonic_ns(), _pressure_us()
        self._d0 = _run_delay_ns(self.api_pid) if self.api_pid else None
        self._c0 = _run_delay_ns(os.getpid())
        # others' CPU: the machine's busy time less the server's process tree's and this client's (the tree
        # found first, so that the scan's own CPU is not counted as others'); never raises into the level
        try:
            self._tree = _tree(*(p for p in (self.api_pid, *self.worker_pids) if p))
            self._m0 = _machine_ticks()
            self._s0 = _cpu_ticks(self._tree | {os.getpid()})
        except Exception:  # noqa: BLE001 - a figure not measured, not a failed level
            self._m0, self._tree, self._s0 = None, set(), {}

    def _others(self, wall_us: float) -> tuple[float | None, float | None]:
        """(others' CPU, steal) over the round, percent of the machine's CPU time: the machine's busy time
        (/proc/stat) less the CPU time of the server's process tree (the API server's descendants) and of this
        client, and the hypervisor's steal (time this machine's CPUs wanted and another guest got). None off
        Linux or where the server's API process could not be read (then it would count as others')."""
        try:
            m1 = _machine_ticks()
            s1 = _cpu_ticks(self._tree | {os.getpid()})
        except Exception:  # noqa: BLE001 - a figure not measured, not a failed level
            return None, None
        if m1 is None or self._m0 is None or not wall_us or not self._tree:
            return None, None
        if self.api_pid not in s1 or self.api_pid not in self._s0:
            return None, None
        ours = sum(s1[p] - self._s0[p] for p in s1 if p in self._s0)
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        capacity = wall_us / 1e6 * hz * (os.cpu_count() or 1)
        busy, steal = m1[0] - self._m0[0], m1[1] - self._m0[1]
        others = max(0.0, min(100.0, 100.0 * (busy - ours + steal) / capacity))
        return others, max(0.0, min(100.0, 100.0 * steal / capacity))

    def stop(self, tokens: int) -> dict | None:
        if self._t0 is None:
            return None
        wall_us = (time.monotonic_ns() - self._t0) / 1e3
        p1 = _pressure_us()
        # the two reads are not at the exact instants of the two clock reads: a fully loaded host can read 101%
        pressure = (
            min(100.0, 100.0 * (p1 - self._p0) / wall_us)
            if p1 is not None and self._p0 is not None and wall_us
            else None
        )
        d1 = _run_delay_ns(self.api_pid) if self.api_pid else None
        api = (d1 - self._d0) / 1e6 / tokens if d1 is not None and self._d0 is not None and tokens else None
        c1 = _run_delay_ns(os.getpid())
        client = (c1 - self._c0) / 1e6 / tokens if c1 is not None and self._c0 is not None and tokens else None
        try:
            load1 = float(Path("/proc/loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            load1 = None
        cpus = os.cpu_count() or 1  # the machine's: the load average is the machine's
        others, steal = self._others(wall_us)
        high = (pressure is not None and pressure >= HIGH_PRESSURE_PCT) or (load1 is not None and load1 > cpus)
        return {
            "cpus": cpus,
            "loadavg_1m": load1,
            "cpu_pressure_pct": pressure,
            "api_server_wait_ms_per_token": api,
            "client_wait_ms_per_token": client,
            "high": bool(high),
            "others_cpu_pct": others,
            "steal_pct": steal,
        }
