"""Read nccl-tests output (plain text, or the JSON written with -J/--output_file)
into probe result rows, so cluster results feed `predict --probe` and the report.

nccl-tests' `size` is its own convention (all_gather/gather: the whole output);
rows carry it as nccl_size_bytes and convert `bytes` to the per-rank input. Its
time is the back-to-back average: rows are timing "pipelined"; with per-iteration
timing (-I) p50/p99 come from out_of_place_per_iter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tpcomm.errors import InputError

_PROGRAMS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
    "gather": "gather",
}
_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


def _op_from(text: str) -> str | None:
    for key, op in _PROGRAMS.items():
        if re.search(rf"\b{key}(_perf)?\b", text):
            return op
    return None


def _row(op, size, count, dtype, time_us, algbw, busbw, wrong, world, graph, device, per_iter=None) -> dict:
    per_rank = size // world if op in ("all_gather", "gather") else size
    r = {
        "backend": "nccl",
        "op": op,
        "mode": "graph" if graph else "eager",
        "timing": "pipelined",
        "bytes": per_rank,
        "count": count,
        "dtype": dtype,
        "nccl_size_bytes": size,
        "world_size": world,
        "nodes": None,
        "p50_us": time_us,
        "p90_us": None,
        "p99_us": None,
        "min_us": None,
        "max_us": None,
        "mean_us": time_us,
        "samples": None,
        "algbw_GBps": algbw,
        "busbw_GBps": busbw,
        "wrong": wrong,
        "timer": "nccl-tests",
        "hardware": device,
        "device": None,
        "host": None,
        "source": "nccl-tests",
    }
    if per_iter:
        r.update(
            {
                "p50_us": per_iter.get("p50_us", time_us),
                "p99_us": per_iter.get("p99_us"),
                "min_us": per_iter.get("min_us"),
                "max_us": per_iter.get("max_us"),
                "mean_us": per_iter.get("avg_us", time_us),
            }
        )
    return r


def parse_text(text: str, op: str | None = None, world: int | None = None) -> list[dict]:
    op = (
        op or _op_from(next((ln for ln in text.splitlines() if "Collective test starting" in ln), "")) or _op_from(text)
    )
    ranks = re.findall(r"^#\s+Rank\s+\d+\s+Group.*?device\s+\d+\s+\[[^\]]*\]\s+(.*)$", text, re.M)
    world = world or len(ranks) or None
    graph = bool(re.search(r"graph:\s*[1-9]", text))
    if op is None:
        raise InputError(
            "nccl-tests output",
            "cannot tell which collective it measured",
            "a '# Collective test starting: X_perf' line, or --op",
        )
    if not world:
        raise InputError(
            "nccl-tests output", "has no '#  Rank N ...' device lines", "full nccl-tests output, or --world-size"
        )
    rows = []
    for ln in text.splitlines():
        tok = ln.split()
        if len(tok) < 10 or ln.lstrip().startswith("#") or not tok[0].isdigit():
            continue
        # size count type [redop] [root] | time algbw busbw #wrong | time algbw busbw #wrong
        try:
            size, count, dtype = int(tok[0]), int(tok[1]), tok[2]
            t, alg, bus = float(tok[-8]), float(tok[-7]), float(tok[-6])
            wrong = None if tok[-5] == "N/A" else int(float(tok[-5]))
        except (ValueError, IndexError):
            continue
        rows.append(_row(op, size, count, dtype, t, alg, bus, wrong, world, graph, ranks[0] if ranks else None))
    if not rows:
        raise InputError(
            "nccl-tests output", "has no result lines", "lines like '  8  2  float  sum  -1  10.3  0.00  0.00  0 ...'"
        )
    return rows


def parse_json(doc: dict, op: str | None = None, world: int | None = None) -> list[dict]:
    cfg = doc.get("config", {})
    devices = cfg.get("devices") or []
    world = world or len(devices) or (cfg.get("ngpus", 0) * cfg.get("nthreads", 1)) or None
    op = op or _op_from(" ".join(doc.get("args", [])[:1]))
    if op is None or not world:
        raise InputError(
            "nccl-tests JSON", "cannot tell the collective or the number of ranks", "--op and --world-size"
        )
    dev = devices[0].get("device_info") if devices else None
    rows = []
    for r in doc.get("results", []):
        oop = r.get("out_of_place") or r.get("in_place")
        if not oop:
            continue
        wrong = oop.get("nwrong")
        rows.append(
            _row(
                op,
                int(r["size"]),
                int(r["count"]),
                r.get("type"),
                float(oop.get("time", oop.get("cpu_time"))),
                float(oop["alg_bw"]),
                float(oop["bus_bw"]),
                None if wrong is None else int(wrong),
                world,
                bool(cfg.get("graph")),
                dev,
                r.get("out_of_place_per_iter"),
            )
        )
    if not rows:
        raise InputError("nccl-tests JSON", "has no results", "the file written by nccl-tests -J")
    return rows


def import_file(path: str | Path, op: str | None = None, world: int | None = None) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise InputError(str(p), "does not exist", "a file with nccl-tests output")
    text = p.read_text(errors="replace")
    if text.lstrip().startswith("{"):
        try:
            return parse_json(json.loads(text), op, world)
        except json.JSONDecodeError as e:
            raise InputError(str(p), f"is not valid JSON ({e.msg})", "nccl-tests JSON or plain-text output") from None
    return parse_text(text, op or _op_from(p.name), world)
