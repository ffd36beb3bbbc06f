"""Prometheus text exposition of the hook (GET /tpcomm/v1/metrics).

Histograms of collective duration per (rank, group, op, size bucket, backend)
and of engine step duration per (rank, kind), over the records since the last
POST /tpcomm/v1/start: a new start resets them, which Prometheus treats as a
counter reset. The workers keep the histograms (histograms.py), so a scrape
moves a few hundred numbers whatever the record buffer holds, and the label set
is bounded (sizes are buckets, not raw byte counts). Units: microseconds (the
`_us` in the metric names).
"""

from __future__ import annotations

from typing import Any


def _labels(**kv: Any) -> str:
    def esc(v: Any) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def _histogram(lines: list[str], name: str, buckets: list, h: dict, labels: dict[str, Any]) -> None:
    for le, c in zip(buckets, h["cumulative"]):
        lines.append(f"{name}_bucket{_labels(**labels, le=le)} {int(c)}")
    lines.append(f"{name}_bucket{_labels(**labels, le='+Inf')} {int(h['count'])}")
    lines.append(f"{name}_sum{_labels(**labels)} {float(h['sum_us']):.3f}")
    lines.append(f"{name}_count{_labels(**labels)} {int(h['count'])}")


def prometheus_text(per_rank: list[dict[str, Any]], source: str = "rpc") -> str:
    """``per_rank``: the workers' snapshots (publish.snapshot: published files, or the RPC fallback)."""
    import time

    per_rank = sorted(per_rank, key=lambda r: r["rank"])
    lines = [
        "# HELP tpcomm_collective_duration_us Duration of one collective call on one rank, since the last "
        "/tpcomm/v1/start (size: bucket of bytes per call).",
        "# TYPE tpcomm_collective_duration_us histogram",
    ]
    for r in per_rank:
        h = r["histograms"]
        for c in h["collectives"]:
            _histogram(
                lines,
                "tpcomm_collective_duration_us",
                h["buckets_us"],
                c,
                {"rank": r["rank"], "group": c["group"], "op": c["op"], "size": c["size"], "backend": c["backend"]},
            )
    lines += [
        "# HELP tpcomm_step_duration_us Engine step duration on one rank (execute_model + sample_tokens).",
        "# TYPE tpcomm_step_duration_us histogram",
    ]
    for r in per_rank:
        h = r["histograms"]
        for s in h["steps"]:
            _histogram(lines, "tpcomm_step_duration_us", h["buckets_us"], s, {"rank": r["rank"], "kind": s["kind"]})
    lines += [
        "# HELP tpcomm_dropped_records Records dropped because the bounded buffer was full.",
        "# TYPE tpcomm_dropped_records gauge",
    ]
    lines += [f"tpcomm_dropped_records{_labels(rank=r['rank'])} {r['dropped']}" for r in per_rank]
    lines += ["# HELP tpcomm_armed 1 while the hook records on that rank.", "# TYPE tpcomm_armed gauge"]
    lines += [f"tpcomm_armed{_labels(rank=r['rank'])} {int(bool(r['armed']))}" for r in per_rank]
    lines += [
        "# HELP tpcomm_metrics_age_seconds Age of this rank's snapshot (published by the worker every "
        "TPCOMM_METRICS_PUBLISH_S; source rpc = taken now).",
        "# TYPE tpcomm_metrics_age_seconds gauge",
    ]
    now = time.time_ns()
    lines += [
        f"tpcomm_metrics_age_seconds{_labels(rank=r['rank'], source=source)} "
        f"{max(0.0, (now - r.get('t_ns', now)) / 1e9):.3f}"
        for r in per_rank
    ]
    return "\n".join(lines) + "\n"
