"""`--profile`: capture vLLM's torch-profiler traces around a short C=1 round
and count communication in them, next to the hook's totals for the same window.

Communication in a Kineto trace: NCCL kernels (`nccl*`), vLLM's own
all-reduce kernels (`cross_device_reduce_*`, quick/one-shot variants) and on
CPU the `_C::shm_allreduce` op (plus the shm all-gather/gather ops). The
server must run with --profiler-config '{"profiler":"torch","torch_profiler_dir":DIR}';
the traces are read from DIR (the client must see it: same host or shared disk).

Units: *_us microseconds (Kineto `dur`), counts per rank over the window.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import time
from pathlib import Path

import httpx
import pandas as pd

from tpcomm import contract as C
from tpcomm.attribute import load, records
from tpcomm.attribute.server import ServerInfo

COMM_PATTERNS = [
    ("nccl", re.compile(r"^nccl", re.I)),
    ("custom_ar", re.compile(r"cross_device_reduce|one_shot|two_shot|quickreduce|allreduce_kernel", re.I)),
    ("shm", re.compile(r"^_C::shm_(allreduce|all_gather|gather)|shm_allreduce", re.I)),
]
PROFILER_HINT = (
    'start the server with --profiler-config \'{"profiler":"torch","torch_profiler_dir":"/tmp/vllm_prof"}\' '
    "and pass --profile-dir /tmp/vllm_prof"
)


def comm_events(trace: dict) -> pd.DataFrame:
    """Communication events of one Kineto trace: name, kind (nccl/custom_ar/shm), cat, ts_us, dur_us."""
    rows = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        name = ev.get("name", "")
        cat = ev.get("cat", "")
        # Kernels count on the device; CPU ops only for the shm path (a CUDA op's CPU launch would double count).
        for kind, pat in COMM_PATTERNS:
            if pat.search(name) and (cat in ("kernel", "gpu_user_annotation") or kind == "shm"):
                if kind == "shm" and cat not in ("cpu_op", "user_annotation", ""):
                    continue
                rows.append(
                    {
                        "name": name,
                        "kind": kind,
                        "cat": cat,
                        "ts_us": float(ev.get("ts", 0)),
                        "dur_us": float(ev.get("dur", 0)),
                    }
                )
                break
    return pd.DataFrame(rows, columns=["name", "kind", "cat", "ts_us", "dur_us"])


def read_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_rank(path: Path, trace: dict) -> int | None:
    info = trace.get("distributedInfo") or {}
    if isinstance(info.get("rank"), int):
        return info["rank"]
    m = re.search(r"rank(\d+)", path.name)
    return int(m.group(1)) if m else None


def summarise_traces(paths: list[Path]) -> pd.DataFrame:
    """One row per (rank, kind, name): count and total time."""
    frames = []
    for p in paths:
        tr = read_trace(p)
        ev = comm_events(tr)
        ev["rank"] = trace_rank(p, tr)
        ev["file"] = p.name
        frames.append(ev)
    if not frames:
        return pd.DataFrame(columns=["rank", "kind", "name", "count", "time_us"])
    ev = pd.concat(frames, ignore_index=True)
    return (
        ev.groupby(["rank", "kind", "name"], dropna=False)
        .agg(count=("dur_us", "size"), time_us=("dur_us", "sum"))
        .reset_index()
    )


def profile_run(info: ServerInfo, spec: load.LoadSpec, prompts: load.Prompts, profile_dir: str | None, rd) -> dict:
    prefix = f"tpcomm{time.strftime('%H%M%S')}"
    try:
        r = httpx.post(
            info.url + "/start_profile",
            json={"profile_prefix": prefix},
            headers=info.headers,
            timeout=120,
            verify=info.verify,
        )
    except httpx.HTTPError as e:
        return {"captured": False, "note": f"/start_profile failed ({type(e).__name__}: {e})"}
    if r.status_code == 404:
        return {"captured": False, "note": "the server's torch profiler is off: " + PROFILER_HINT}
    if r.status_code != 200:
        return {"captured": False, "note": f"/start_profile answered HTTP {r.status_code}: {r.text[:200]}"}
    plugin = bool(info.plugin and info.plugin.get("enabled", True))
    if plugin:
        records.start(info)
    small = load.LoadSpec(**{**spec.__dict__, "requests": min(spec.requests, 2)})
    t0 = time.time_ns()
    rows = asyncio.run(load.run_round(info, small, prompts, 1, small.requests, id_offset=10**9))
    t1 = time.time_ns()
    httpx.post(info.url + "/stop_profile", headers=info.headers, timeout=600, verify=info.verify).raise_for_status()
    doc = {
        "captured": True,
        "prefix": prefix,
        "requests": len(rows),
        "ok": sum(r["ok"] for r in rows),
        "output_len": small.output_len,
        "window_ns": [t0, t1],
    }
    hook = None
    if plugin:
        records.stop(info)
        coll, _, _ = records.fetch(info)
        coll = coll[(coll["t_start_ns"] >= t0) & (coll["t_end_ns"] <= t1)]
        rd.write_table(C.PROFILE_HOOK, coll)
        hook = (
            coll.groupby(["rank", "op"])
            .agg(count=("duration_us", "size"), time_us=("duration_us", "sum"))
            .reset_index()
        )
        doc["hook"] = hook.to_dict("records")
    if not profile_dir:
        doc["note"] = "traces written on the server; pass --profile-dir to parse them (" + PROFILER_HINT + ")"
        return doc
    paths = _wait_for_traces(Path(profile_dir), prefix)
    if not paths:
        doc["note"] = f"no trace named {prefix}* appeared in {profile_dir}"
        return doc
    summ = summarise_traces(paths)
    rd.write_table(C.PROFILE_EVENTS, summ)
    doc["traces"] = [str(p) for p in paths]
    doc["trace_comm"] = summ.to_dict("records")
    doc["comparison"] = compare_with_hook(summ, hook)
    doc["summary_line"] = "; ".join(
        f"rank {c['rank']}: trace {c['trace_count']} comm events "
        f"({c['trace_time_us']:.0f} us), hook {c['hook_count']} "
        f"({c['hook_time_us']:.0f} us)"
        for c in doc["comparison"]
    )
    return doc


def compare_with_hook(summ: pd.DataFrame, hook: pd.DataFrame | None) -> list[dict]:
    out = []
    for rank, g in summ.groupby("rank", dropna=False):
        h = hook[hook["rank"] == rank] if hook is not None else None
        out.append(
            {
                "rank": None if pd.isna(rank) else int(rank),
                "trace_count": int(g["count"].sum()),
                "trace_time_us": float(g["time_us"].sum()),
                "hook_count": int(h["count"].sum()) if h is not None else None,
                "hook_time_us": float(h["time_us"].sum()) if h is not None else None,
            }
        )
    return out


def _wait_for_traces(d: Path, prefix: str, timeout_s: float = 120) -> list[Path]:
    # Workers write their traces after /stop_profile returns on some versions: poll until they settle.
    deadline = time.monotonic() + timeout_s
    last: list[Path] = []
    while time.monotonic() < deadline:
        found = sorted(p for p in d.glob(f"{prefix}*") if p.name.endswith((".json", ".json.gz")))
        if found and found == last and all(_stable(p) for p in found):
            return found
        last = found
        time.sleep(1.0)
    return last


def _stable(p: Path) -> bool:
    try:
        s1 = p.stat().st_size
        time.sleep(0.2)
        return p.stat().st_size == s1 and s1 > 0
    except FileNotFoundError:
        return False
