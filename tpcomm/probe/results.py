"""Probe results: one row per (backend, op, mode, bytes, timing), written to the
run directory after every measurement so a failure keeps what finished.

Columns of probe/results.parquet (and the "results" list of probe/results.json):
    backend, op, mode (eager|graph), timing (isolated|pipelined), bytes (per-rank
    input), count (elements), dtype, nccl_size_bytes (size as nccl-tests prints
    it), world_size, nodes, p50_us, p90_us, p99_us, min_us, max_us, mean_us,
    samples, algbw_GBps, busbw_GBps (from p50, nccl-tests formulas, GB = 1e9),
    wrong (#wrong elements), timer, hardware, device, host, source (probe|nccl-tests),
    lineup (isolated rows: what lined the ranks up before each op, e.g. "tiny nccl
    all_reduce (device stream)"), skew_p50_us, skew_p99_us (isolated rows: the rank
    skew left after the line-up, per sample the slowest rank's duration minus the
    fastest's; for gather and send_recv, where ranks legitimately finish apart, an
    upper bound), slack_us, slack_overruns (isolated GPU rows: the sleep kernel
    between the line-up and the start event, and the samples, on any rank, whose
    start event had fired before the op was queued, so the device waited for the
    host inside the timed interval; None on CPU, where no slack is used),
    preempted_samples (isolated CPU rows: samples in which some rank's thread
    waited over 100 us for a CPU, runnable with another task on its core, between
    its line-up and the end of its op (Linux schedstat run_delay); None on a GPU)

Conditions (probe/results.json) also hold visible_gpus_by_rank: the GPUs each
rank saw, once a GPU backend mapped ranks to devices.
"""

from __future__ import annotations

from tpcomm.judge.tolerances import PREEMPTED_WARN
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir
from tpcomm.table import human_bytes

COLUMNS = [
    "backend",
    "op",
    "mode",
    "timing",
    "bytes",
    "count",
    "dtype",
    "nccl_size_bytes",
    "world_size",
    "nodes",
    "p50_us",
    "p90_us",
    "p99_us",
    "min_us",
    "max_us",
    "mean_us",
    "samples",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "iters",
    "warmup",
    "timer",
    "hardware",
    "device",
    "host",
    "source",
    "lineup",
    "skew_p50_us",
    "skew_p99_us",
    "slack_us",
    "slack_overruns",
    "preempted_samples",
]
# Above this share of a row's samples with the slack overrun, the table says so.
SLACK_OVERRUN_WARN = 0.10
JSON_KEYS = [
    "backend",
    "op",
    "mode",
    "timing",
    "bytes",
    "world_size",
    "p50_us",
    "p90_us",
    "p99_us",
    "min_us",
    "max_us",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
]


class ProbeResults:
    """Collects records from the ranks; `write()` saves Parquet + JSON atomically."""

    def __init__(self, run: RunDir | None, conditions: dict):
        self.run = run
        self.conditions = conditions
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        self.state = "running"
        self.error: str | None = None
        self.planned = 0

    @property
    def nothing_measured(self) -> bool:
        """Every item was skipped: the probe failed though no rank did (e.g. --backend nccl without CUDA)."""
        return bool(self.skipped) and not self.rows

    def add(self, rec: dict) -> None:
        kind = rec.get("kind")
        if rec.get("visible_gpus_by_rank"):
            self.conditions["visible_gpus_by_rank"] = rec["visible_gpus_by_rank"]
        if kind == "start":
            self.planned = rec.get("items", 0)
            self.conditions.setdefault("world_size", rec.get("world_size"))
            self.conditions.setdefault("nodes", rec.get("nodes"))
            if rec.get("inter_node"):
                self.conditions.setdefault("inter_node", rec["inter_node"])
            return
        if kind == "result":
            self.rows.append({c: rec.get(c) for c in COLUMNS} | {"source": rec.get("source", "probe")})
        elif kind == "skipped":
            sk = {k: rec.get(k) for k in ("backend", "op", "mode", "bytes", "dtype", "reason")}
            if "visible_gpus_by_rank" in rec:  # a GPU backend's setup: how many GPUs each rank saw
                sk["visible_gpus_by_rank"] = rec["visible_gpus_by_rank"]
            self.skipped.append(sk)
        else:
            return
        self.write()

    @property
    def done_items(self) -> int:
        return len({(r["backend"], r["op"], r["mode"], r["bytes"]) for r in self.rows}) + len(self.skipped)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=COLUMNS)

    def document(self) -> dict:
        return {
            "state": self.state,
            "error": self.error,
            "conditions": self.conditions,
            "results": self.rows,
            "skipped": self.skipped,
        }

    def write(self) -> None:
        if self.run is None:
            return
        self.run.write_table(C.PROBE_RESULTS, self.frame())
        self.run.write_json(C.PROBE_RESULTS_JSON, self.document())

    def json_entries(self) -> list[dict]:
        """`--json`: one entry per measurement, the keys of JSON_KEYS first."""
        return [
            {k: r.get(k) for k in JSON_KEYS} | {k: v for k, v in r.items() if k not in JSON_KEYS} for r in self.rows
        ]


def no_gpu_visible(skip: dict) -> bool:
    """A skip because no rank saw any GPU (a GPU backend asked for on a machine without one), from the
    visible-GPU counts the ranks gathered while mapping devices (probes/devices.py), not from its wording."""
    seen = skip.get("visible_gpus_by_rank")
    return bool(seen) and not any(seen)


def _f(v, nd=2) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def slack_notes(rows: list[dict]) -> list[str]:
    """Table notes on the GPU slack: its length and overruns over all isolated rows, and one warning
    line per row where more than SLACK_OVERRUN_WARN of the samples overran. Empty without GPU rows."""
    iso = [r for r in rows if r.get("timing") == "isolated" and r.get("slack_overruns") is not None]
    if not iso:
        return []
    over = sum(int(r["slack_overruns"]) for r in iso)
    total = sum(int(r.get("samples") or 0) for r in iso)
    slack = sorted({r.get("slack_us") for r in iso if r.get("slack_us") is not None})
    out = [
        f"# slack: a {'/'.join(f'{x:g}' for x in slack)} us sleep kernel between the line-up and the start event "
        f"(outside the timed interval) lets each host queue the op before its GPU reaches it; it ran out first "
        f"(the GPU waited for the host inside the interval) in {over} of {total} isolated samples"
    ]
    for r in iso:
        n = int(r.get("samples") or 0)
        if n and r["slack_overruns"] / n > SLACK_OVERRUN_WARN:
            out.append(
                f"# WARNING: slack overrun in {r['slack_overruns']}/{n} samples ({r['slack_overruns'] / n:.0%}) of "
                f"{r['backend']} {r['op']} {r['bytes']} B {r['mode']}: its isolated time includes host enqueue "
                "time (a busy host, or an enqueue slower than the slack)"
            )
    return out


def preempt_notes(rows: list[dict]) -> list[str]:
    """One warning line per isolated CPU row where more than PREEMPTED_WARN of the samples had a rank
    preempted: its times and skew then hold the scheduler's slices, not the collective's."""
    out = []
    for r in rows:
        k, n = r.get("preempted_samples"), int(r.get("samples") or 0)
        if r.get("timing") == "isolated" and k is not None and n and k / n > PREEMPTED_WARN:
            out.append(
                f"# WARNING: a rank was preempted in {k}/{n} samples ({k / n:.0%}) of {r['backend']} {r['op']} "
                f"{r['bytes']} B {r['mode']}: its time and skew hold the scheduler's slices (another busy process "
                "on the ranks' cores, or more ranks than free cores)"
            )
    return out


def inter_node_text(d: dict) -> str:
    env = ", ".join(f"{k}={v}" for k, v in (d.get("env") or {}).items())
    rdma = ", ".join(d.get("rdma_devices") or [])
    return (
        "gloo over TCP sockets; NCCL over "
        + (
            f"RDMA ({rdma}) where it uses them, else TCP sockets"
            if rdma
            else "TCP sockets (no RDMA device on rank 0's node)"
        )
        + f"; settings: {env or 'none set'} (NCCL_DEBUG=INFO names the transport NCCL took)"
    )


def format_table(rows: list[dict], skipped: list[dict], conditions: dict) -> str:
    """nccl-tests' layout, one block per (backend, mode, op): isolated | pipelined."""
    out = []
    cond = conditions
    out.append(
        f"# tpcomm probe: world size {cond.get('world_size')} on {cond.get('nodes', 1)} node(s), "
        f"{cond.get('hardware', '?')}; torch {cond.get('torch', '?')}, vLLM {cond.get('vllm') or 'not installed'}"
    )
    if cond.get("inter_node"):
        out.append("# between nodes: " + inter_node_text(cond["inter_node"]))
    out.append(
        "# isolated: ranks lined up before each op by a tiny collective, the backend's own where it allows one "
        "(named per block: lineup), as a decode step reaches it; pipelined: back-to-back average (nccl-tests' time)"
    )
    out.append(
        "# skew: rank skew left after the line-up, p50 over samples of slowest - fastest rank's duration "
        "(included in the isolated time)"
    )
    out.append(
        "# algbw/busbw from p50, GB/s = 1e9 B/s; busbw as nccl-tests: all_reduce x2(n-1)/n, all_gather/reduce_scatter/all_to_all x(n-1)/n"
    )
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["backend"], r["mode"], r["op"]), {})
        g.setdefault(r["bytes"], {})[r["timing"]] = r
    for (backend, mode, op), by_size in groups.items():
        any_row = next(iter(next(iter(by_size.values())).values()))
        out.append("#")
        iso_row = next((t["isolated"] for t in by_size.values() if "isolated" in t), {})
        lineup = f"  lineup {iso_row['lineup']}" if iso_row.get("lineup") else ""
        out.append(
            f"# {op}  backend {backend}  mode {mode}  timer {any_row.get('timer')}  ranks {any_row.get('world_size')}"
            + lineup
        )
        out.append(
            f"# {'size(B)':>12} {'count':>10} {'type':>8} |{'isolated p50':>13} {'p99':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6} "
            f"{'skew':>7} |{'pipelined':>10} {'algbw':>7} {'busbw':>7}"
        )
        out.append(
            f"# {'':>12} {'(elements)':>10} {'':>8} |{'(us)':>13} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} "
            f"{'(us)':>7} |{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}"
        )
        for nbytes in sorted(by_size):
            iso, pipe = by_size[nbytes].get("isolated"), by_size[nbytes].get("pipelined")
            base = iso or pipe
            size = base.get("nccl_size_bytes") or nbytes
            cells = f"  {size:>12} {base.get('count') or 0:>10} {base.get('dtype') or '':>8} |"
            if iso:
                cells += (
                    f"{_f(iso['p50_us']):>13} {_f(iso['p99_us']):>9} {_f(iso['algbw_GBps']):>7} "
                    f"{_f(iso['busbw_GBps']):>7} {iso['wrong']:>6} {_f(iso.get('skew_p50_us')):>7} |"
                )
            else:
                cells += f"{'-':>13} {'-':>9} {'-':>7} {'-':>7} {base.get('wrong', '-'):>6} {'-':>7} |"
            if pipe:
                cells += f"{_f(pipe['p50_us']):>10} {_f(pipe['algbw_GBps']):>7} {_f(pipe['busbw_GBps']):>7}"
            else:
                cells += f"{'-':>10} {'-':>7} {'-':>7}"
            out.append(cells)
    if skipped:
        out.append("#")
        out.append("# not measured:")
        seen = set()
        for s in skipped:
            key = (s["backend"], s.get("op"), s.get("mode"), s["reason"])
            if key in seen:
                continue
            seen.add(key)
            sizes = sorted(
                {x["bytes"] for x in skipped if (x["backend"], x.get("op"), x.get("mode"), x["reason"]) == key}
            )
            out.append(
                f"#   {s['backend']:<9} {s.get('op') or '':<14} {s.get('mode') or '':<6} "
                f"({', '.join(human_bytes(b) for b in sizes[:4])}{', ...' if len(sizes) > 4 else ''}): {s['reason']}"
            )
    notes = slack_notes(rows) + preempt_notes(rows)
    if notes:
        out.append("#")
        out += notes
    bad = sum(int(r.get("wrong") or 0) for r in rows if r["timing"] == "isolated")
    out.append(f"# Out of bounds values : {bad} {'OK' if bad == 0 else 'FAILED'}")
    return "\n".join(out)
