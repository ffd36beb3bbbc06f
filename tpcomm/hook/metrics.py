"""Prometheus text exposition of the hook's records (GET /tpcomm/v1/metrics).

Histograms of collective duration per (rank, group, op, bytes, backend) and of
engine step duration per (rank, kind), over the records since the last
POST /tpcomm/v1/start: a new start resets them, which Prometheus treats as a
counter reset. Units: microseconds (the `_us` in the metric names).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BUCKETS_US = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000)


def _labels(**kv: Any) -> str:
    def esc(v: Any) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def _histogram(lines: list[str], name: str, values: np.ndarray, labels: dict[str, Any]) -> None:
    counts = np.searchsorted(np.sort(values), BUCKETS_US, side="right")
    for le, c in zip(BUCKETS_US, counts):
        lines.append(f"{name}_bucket{_labels(**labels, le=le)} {int(c)}")
    lines.append(f"{name}_bucket{_labels(**labels, le='+Inf')} {len(values)}")
    lines.append(f"{name}_sum{_labels(**labels)} {float(values.sum()):.3f}")
    lines.append(f"{name}_count{_labels(**labels)} {len(values)}")


def prometheus_text(records: dict[str, Any]) -> str:
    """``records`` is the merged columnar document of GET /tpcomm/v1/records."""
    lines: list[str] = []
    coll, steps, meta = records["collectives"], records["steps"], records["meta"]

    lines += ["# HELP tpcomm_collective_duration_us Duration of one collective call on one rank, "
              "since the last /tpcomm/v1/start (timing column says how it was measured).",
              "# TYPE tpcomm_collective_duration_us histogram"]
    dur = np.asarray(coll["duration_us"], dtype=float)
    keys = list(zip(coll["rank"], coll["group"], coll["op"], coll["bytes"], coll["backend"]))
    groups: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    for (rank, group, op, nbytes, backend), idx in sorted(groups.items()):
        _histogram(lines, "tpcomm_collective_duration_us", dur[idx],
                   {"rank": rank, "group": group, "op": op, "bytes": nbytes, "backend": backend})

    lines += ["# HELP tpcomm_step_duration_us Engine step duration on one rank (execute_model + sample_tokens).",
              "# TYPE tpcomm_step_duration_us histogram"]
    sdur = np.asarray(steps["duration_us"], dtype=float)
    skeys: dict[tuple, list[int]] = {}
    for i, k in enumerate(zip(steps["rank"], steps["kind"])):
        skeys.setdefault(k, []).append(i)
    for (rank, kind), idx in sorted(skeys.items()):
        _histogram(lines, "tpcomm_step_duration_us", sdur[idx], {"rank": rank, "kind": kind})

    lines += ["# HELP tpcomm_dropped_records Records dropped because the bounded buffer was full.",
              "# TYPE tpcomm_dropped_records gauge"]
    for r in meta.get("per_rank", []):
        lines.append(f"tpcomm_dropped_records{_labels(rank=r['rank'])} {r['dropped']}")
    lines += ["# HELP tpcomm_armed 1 while the hook records on that rank.", "# TYPE tpcomm_armed gauge"]
    for r in meta.get("per_rank", []):
        lines.append(f"tpcomm_armed{_labels(rank=r['rank'])} {int(bool(r['armed']))}")
    return "\n".join(lines) + "\n"
