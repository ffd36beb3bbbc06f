"""The replay's records as tables and a summary, split exactly as `attribute` splits
serving: each collective instance (same step and call on every rank) is aligned
by tpcomm/analysis/align.py; transfer = the minimum duration over the ranks,
wait = the rest of each rank's duration (rank skew).

probe/replay_collectives.parquet, one row per collective per rank per step
(timings full and comm): backend, mode, timing, rank, group, group_size, step,
call_idx, site, layer, op, bytes, dtype, t_start_ns, duration_us, transfer_us,
wait_us, entry_skew_us, complete.

probe/replay_steps.parquet, one row per step (every timing), terms averaged
over ranks as attribute's decode steps are: backend, mode, timing, step,
step_us, compute_us, transfer_us, wait_us, n_collectives, ranks, step_us_max
(slowest rank), cpu_wait_us_max (the longest any rank waited for a CPU during
the step: runnable, another task on its core; Linux schedstat run_delay),
preempted (cpu_wait_us_max over a tenth of step_us_max). compute_us + transfer_us + wait_us = step_us exactly.

Units: *_us microseconds, *_ns nanoseconds (perf_counter, or host time plus
CUDA event offsets), bytes per rank per call, tok/s tokens per second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.analysis.align import align
from tpcomm.analysis.split import collective_sums
from tpcomm.judge.tolerances import PREEMPTED_SHARE

COLL_COLUMNS = [
    "backend",
    "mode",
    "timing",
    "rank",
    "group",
    "group_size",
    "step",
    "call_idx",
    "site",
    "layer",
    "op",
    "bytes",
    "dtype",
    "t_start_ns",
    "duration_us",
    "transfer_us",
    "wait_us",
    "entry_skew_us",
    "complete",
]
STEP_COLUMNS = [
    "backend",
    "mode",
    "timing",
    "step",
    "step_us",
    "compute_us",
    "transfer_us",
    "wait_us",
    "n_collectives",
    "ranks",
    "step_us_max",
    "cpu_wait_us_max",
    "preempted",
]


def record_frames(rec: dict, slots: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(collectives aligned, per-rank steps) of one replay record (one backend, mode, timing)."""
    ncoll = rec["collectives_per_step"]
    coll, rsteps = [], []
    for r in rec["ranks"]:
        rsteps.append(
            pd.DataFrame(
                {
                    "rank": r["rank"],
                    "step": np.arange(len(r["step_us"])),
                    "t_start_ns": r["step_t0_ns"],
                    "step_us": r["step_us"],
                    # how long this rank waited for a CPU in the step (CPU ranks; older records: not known, 0)
                    "cpu_wait_us": r.get("cpu_wait_us") or [0.0] * len(r["step_us"]),
                }
            )
        )
        if ncoll:
            n = len(r["coll_us"])
            idx = np.arange(n)
            coll.append(
                pd.DataFrame(
                    {
                        "rank": r["rank"],
                        "step": idx // ncoll,
                        "call_idx": idx % ncoll,
                        "t_start_ns": np.asarray(r["coll_t0_ns"], dtype=np.int64),
                        "duration_us": np.asarray(r["coll_us"], dtype=np.float64),
                    }
                )
            )
    rs = pd.concat(rsteps, ignore_index=True)
    key = {"backend": rec["backend"], "mode": rec["mode"], "timing": rec["timing"]}
    if not coll:
        return pd.DataFrame(columns=COLL_COLUMNS), rs.assign(**key)
    c = pd.concat(coll, ignore_index=True)
    meta = pd.DataFrame(
        [
            {
                "call_idx": i,
                "site": s["site"],
                "layer": s["layer"] if s["layer"] is not None else -1,
                "op": s["op"],
                "bytes": s["bytes"],
                "dtype": s["dtype"],
            }
            for i, s in enumerate(slots)
        ]
    )
    c = c.merge(meta, on="call_idx", how="left").assign(group="tp", group_size=rec["world_size"])
    a = align(c)
    return a.assign(**key)[COLL_COLUMNS], rs.assign(**key)


def step_table(coll: pd.DataFrame, rank_steps: pd.DataFrame) -> pd.DataFrame:
    """Per-rank step time split into compute / transfer / wait, then averaged over ranks per step."""
    key = ["backend", "mode", "timing", "rank", "step"]
    per = (
        collective_sums(coll, key)
        if len(coll)
        else pd.DataFrame(columns=key + ["coll_us", "transfer_us", "wait_us", "n_collectives"])
    )
    s = rank_steps.merge(per, on=key, how="left")
    if "cpu_wait_us" not in s.columns:  # records written before steps carried it: not known, counted as 0
        s["cpu_wait_us"] = 0.0
    for col in ("coll_us", "transfer_us", "wait_us", "n_collectives"):
        s[col] = s[col].fillna(0).astype(np.float64)
    s["compute_us"] = s["step_us"] - s["coll_us"]
    g = s.groupby(["backend", "mode", "timing", "step"], sort=True)
    out = g.agg(
        step_us=("step_us", "mean"),
        compute_us=("compute_us", "mean"),
        transfer_us=("transfer_us", "mean"),
        wait_us=("wait_us", "mean"),
        n_collectives=("n_collectives", "max"),
        ranks=("rank", "nunique"),
        step_us_max=("step_us", "max"),
        cpu_wait_us_max=("cpu_wait_us", "max"),
    ).reset_index()
    # preempted: some rank waited for a CPU for over a tenth of the step (its times hold that wait)
    out["preempted"] = out["cpu_wait_us_max"] > PREEMPTED_SHARE * out["step_us_max"]
    out["n_collectives"] = out["n_collectives"].astype(np.int64)
    return out[STEP_COLUMNS]


def _pct(x: pd.Series, q: float) -> float | None:
    return float(x.quantile(q)) if len(x) else None


def _trimmed(df: pd.DataFrame) -> pd.DataFrame:
    """Steps between the p5 and p95 step time, as attribute's per-token means are taken
    (tpcomm/analysis/split.py): one descheduled step must not move a mean."""
    if len(df) < 10:
        return df
    lo, hi = df["step_us"].quantile([0.05, 0.95])
    return df[(df["step_us"] >= lo) & (df["step_us"] <= hi)]


def summarize(steps: pd.DataFrame, coll: pd.DataFrame, batch: int) -> list[dict]:
    """One entry per (backend, mode): the three timings (p50/p99 over all steps, mean over
    the p5..p95 steps), the interconnect's cost per token in context, the in-step split
    (trimmed means, so it sums to the trimmed mean step), per-op latencies, the ceilings."""
    out = []
    for (be, mode), st in steps.groupby(["backend", "mode"], sort=False):
        t = dict(tuple(st.groupby("timing")))
        timings = {
            k: {
                "p50_us": _pct(v["step_us"], 0.5),
                "p99_us": _pct(v["step_us"], 0.99),
                "mean_us": float(_trimmed(v)["step_us"].mean()),
                "steps": int(len(v)),
                # steps in which the scheduler took some rank's core (a busy host): their times hold its slices
                "preempted_steps": int(v["preempted"].sum()) if "preempted" in v else None,
                "cpu_wait_us_p50": _pct(v["cpu_wait_us_max"], 0.5) if "cpu_wait_us_max" in v else None,
            }
            for k, v in t.items()
        }
        e = {"backend": be, "mode": mode, "timings": timings}
        full, comp, comm = (timings.get(k) for k in ("full", "compute", "comm"))
        if "full" in t:
            f = _trimmed(t["full"])
            split = {k: float(f[k].mean()) for k in ("compute_us", "transfer_us", "wait_us")}
            e["full_step_split_us"] = {
                **split,
                "step_us": float(f["step_us"].mean()),
                "collectives_per_step": int(f["n_collectives"].max()),
            }
            e["in_step_comm_us_per_token"] = (split["transfer_us"] + split["wait_us"]) / batch
        if full and comp:
            e["interconnect_cost_us_per_token"] = (full["p50_us"] - comp["p50_us"]) / batch
            e["interconnect_cost_us_per_token_mean"] = (full["mean_us"] - comp["mean_us"]) / batch
        e["tok_per_s"] = {
            k: batch / (v["p50_us"] / 1e6) if v and v["p50_us"] else None
            for k, v in (("with_collectives", full), ("compute_only", comp), ("comm_only", comm))
        }
        c = coll[(coll["backend"] == be) & (coll["mode"] == mode)]
        e["ops"] = op_table(c)
        out.append(e)
    return out


def op_table(c: pd.DataFrame) -> list[dict]:
    """Per (timing, op, bytes): calls per step, in-step duration p50/p99, transfer and wait p50/mean."""
    rows = []
    for (timing, op, nbytes), g in c.groupby(["timing", "op", "bytes"], sort=True):
        per_step = len(g) / max(g.groupby("rank")["step"].nunique().sum(), 1)
        rows.append(
            {
                "timing": timing,
                "op": op,
                "bytes": int(nbytes),
                "count_per_step": per_step,
                "duration_us_p50": _pct(g["duration_us"], 0.5),
                "duration_us_p99": _pct(g["duration_us"], 0.99),
                "transfer_us_p50": _pct(g["transfer_us"], 0.5),
                "wait_us_p50": _pct(g["wait_us"], 0.5),
                "transfer_us_mean": float(g["transfer_us"].mean()),
                "wait_us_mean": float(g["wait_us"].mean()),
                "complete_pct": float(g["complete"].mean() * 100),
            }
        )
    return rows


def in_context_latencies(doc: dict) -> dict:
    """{(op, bytes, world_size): p50 us} of the collectives inside the full step, preferring
    graph mode and vLLM's pick on GPU (pynccl) -- what `predict --probe` uses."""
    pref = ["flashinfer-ipc", "custom-ar", "pynccl", "nccl", "shm", "gloo"]
    n = (doc.get("conditions") or {}).get("world_size")
    best: dict = {}
    for e in doc.get("results") or []:
        rank = (pref.index(e["backend"]) if e["backend"] in pref else 99, e["mode"] != "graph")
        for o in e.get("ops") or []:
            if o["timing"] != "full" or o["duration_us_p50"] is None:
                continue
            k = (o["op"], int(o["bytes"]), n)
            if k not in best or rank < best[k][0]:
                best[k] = (rank, o["duration_us_p50"], e["backend"], e["mode"])
    return {k: {"us": v[1], "backend": v[2], "mode": v[3]} for k, v in best.items()}
