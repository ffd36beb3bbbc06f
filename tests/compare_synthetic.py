"""Synthetic inputs with a known answer for the comparison's tests.

- `sample(...)`: one level's LevelSample from per-step arrays (the real block sums and estimates of
  tpcomm/compare/samples.py), with AR(1) noise on the compute (a slow patch lasts many steps) and an optional
  offset for the whole repeat (what a restart or a neighbour does to a run);
- `run_dir(path, ...)`: a whole run directory from tpcomm/analysis/synthetic.py's records and client, analysed
  by attribute's own analyse_run_dir (so compare reads exactly what it reads from a real run).

Units: *_us microseconds, *_ms milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tpcomm.compare.samples import LevelSample, block_sums, point_estimate


def sample(
    seed: int,
    requests: int = 16,
    steps_per_request: int = 63,
    compute_us: float = 4000.0,
    shift_us: float = 0.0,
    offset_us: float = 0.0,
    sd_us: float = 600.0,
    ar: float = 0.95,
    transfer_us: float = 100.0,
    wait_us: float = 700.0,
    gap_us: float = 800.0,
    ranks: int = 2,
    block: str = "request",
    collectives: bool = True,
) -> LevelSample:
    """Decode pairs of one single-stream level: compute = compute_us + shift_us + offset_us + AR(1) noise per
    step (stationary sd `sd_us`, correlation `ar` step to step); `block`: "request" (each request's steps one
    block, as compare does at C=1) or "step" (every step its own block: what ignoring autocorrelation does)."""
    rng = np.random.default_rng(seed)
    n = requests * steps_per_request
    e = np.empty(n)
    e[0] = rng.normal(0, sd_us)
    innov = rng.normal(0, sd_us * np.sqrt(1 - ar**2), size=n)
    for i in range(1, n):
        e[i] = ar * e[i - 1] + innov[i]
    compute = compute_us + shift_us + offset_us + e
    if not collectives:
        ranks, transfer_us, wait_us = 1, 0.0, 0.0
    rows = []
    for r in range(ranks):
        tr = transfer_us * rng.uniform(0.9, 1.1, size=n)
        wa = wait_us * rng.gamma(4.0, 0.25, size=n)
        gap = gap_us * rng.gamma(8.0, 1 / 8.0, size=n)
        step = compute + tr + wa
        rows.append(
            pd.DataFrame(
                {
                    "rank": r,
                    "step": np.arange(n),
                    "step_us": step,
                    "gap_us": gap,
                    "period_us": step + gap,
                    "transfer_us": tr,
                    "wait_us": wa,
                    "n_collectives": 10 if collectives else 0,
                    "num_seqs": 1,
                }
            )
        )
    pairs = pd.concat(rows, ignore_index=True)
    if block == "request":
        idx, blocks, unit = pairs["step"].to_numpy() // steps_per_request, requests, "request"
    else:
        idx, blocks, unit = pairs["step"].to_numpy(), n, "steps"
    sums, r = block_sums(pairs, idx, blocks)
    delivery = rng.normal(0.1, 0.05, size=requests) if block == "request" else np.array([])
    s = LevelSample(
        concurrency=1,
        repeat=0,
        unit=unit,
        block_len=None if block == "request" else 1,
        blocks=blocks,
        ranks=r,
        sums=sums,
        collectives=collectives,
        delivery_ms=delivery,
        delivery_joint=block == "request",
    )
    s.point = point_estimate(s)
    return s


def run_dir(
    path: Path,
    seed: int,
    requests: int = 16,
    output_len: int = 64,
    compute_us: float = 3000.0,
    cpu_wait_ms: float | None = None,
    ranks: tuple[str, ...] = ("0", "1"),
    delivery_slope_us: float = 0.0,
    reference_ms: float | None = None,
    others_cpu_pct: float | None = None,
) -> Path:
    """A single-stream run directory (C=1) from make_records/make_client, analysed by attribute's own code;
    `cpu_wait_ms`: the ranks' CPU wait per engine step the level doc states (as the hook's status gives it);
    `delivery_slope_us`: each token reaches the client that much later than the one before it, beyond the
    engine's pace (an API server falling behind over a stream: the delivery term); `reference_ms`: the host's
    reference work's trimmed mean time the level doc states (the host's speed, as attribute's client measures it);
    `others_cpu_pct`: the CPU others took on the server's machine during the level (with `reference_ms`)."""
    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.analysis.synthetic import make_client, make_records
    from tpcomm.rundir import contract as C
    from tpcomm.rundir.layout import RunDir

    coll, steps, _ = make_records(
        steps=requests * output_len, prefill_every=output_len, compute_us=compute_us, seed=seed, idle_us=2000.0
    )
    req, tok = make_client(steps)
    if delivery_slope_us:
        tok["t_ns"] = tok["t_ns"] + (tok["token_idx"] * delivery_slope_us * 1e3).astype("int64")
        last = tok.groupby("request_id")["t_ns"].max()
        req["t_end_ns"] = req["request_id"].map(last).to_numpy()
        req["e2e_ms"] = (req["t_end_ns"] - req["t_start_ns"]) / 1e6
        req["tpot_ms"] = (req["e2e_ms"] - req["ttft_ms"]) / (req["output_tokens"] - 1)
    rd = RunDir(path)
    rd.write_table(C.HOOK_COLLECTIVES, coll)
    rd.write_table(C.HOOK_STEPS, steps)
    rd.write_table(C.LOAD_REQUESTS, req)
    rd.write_table(C.LOAD_TOKENS, tok)
    level = {"concurrency": 1, "repeat": 0, "conditions": {"output_len": output_len}}
    if cpu_wait_ms is not None:
        n = int(steps["step"].nunique())
        per = {"ms": cpu_wait_ms / len(ranks) * n, "steps": n}
        level["cpu_wait"] = {"ms_per_step": cpu_wait_ms, "per_rank": {r: per for r in ranks}}
    if reference_ms is not None:
        level["host_load"] = {
            "cpus": 2,
            "loadavg_1m": None,
            "cpu_pressure_pct": None,
            "api_server_wait_ms_per_token": None,
            "high": False,
            "reference_ms": reference_ms,
            "reference_median_ms": reference_ms,
            "others_cpu_pct": others_cpu_pct,
            "steal_pct": 0.0 if others_cpu_pct is not None else None,
        }
    rd.write_json(C.LOAD_LEVELS, [level])
    analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": output_len, "tp": 2})
    return path


def run_dir_repeats(
    path: Path,
    transfer_us: list[float],
    seed: int = 7,
    requests: int = 6,
    output_len: int = 32,
    compute_us: list[float] | None = None,
    cpu_wait_ms: list[float] | None = None,
) -> Path:
    """A TP-2 single-stream run directory with one C=1 repeat per entry of `transfer_us` (the all-reduce's
    transfer per call in that repeat: windows a minute apart whose collectives cost differently, as a host's
    load makes them), analysed by attribute's own analyse_run_dir. `compute_us`, `cpu_wait_ms`: per repeat,
    its compute per step and the ranks' CPU wait per step its level doc states."""
    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.analysis.synthetic import T0_NS, make_client, make_records
    from tpcomm.rundir import contract as C
    from tpcomm.rundir.layout import RunDir
    from tpcomm.tinymodel import TINY_CONFIG

    colls, stepss, reqs, toks, levels = [], [], [], [], []
    n = requests * output_len
    for i, us in enumerate(transfer_us):
        coll, steps, _ = make_records(
            steps=n,
            prefill_every=output_len,
            transfer_us=us,
            compute_us=compute_us[i] if compute_us else 3000.0,
            seed=seed + i,
            idle_us=2000.0,
            t0_ns=T0_NS + i * 60 * 10**9,
        )
        req, tok = make_client(steps)
        coll["step"] += i * n
        steps["step"] += i * n
        for df in (req, tok):
            df["repeat"] = i
            df["request_id"] += i * requests
        colls.append(coll)
        stepss.append(steps)
        reqs.append(req)
        toks.append(tok)
        levels.append({"concurrency": 1, "repeat": i, "conditions": {"output_len": output_len}})
        if cpu_wait_ms is not None:
            per = {"ms": cpu_wait_ms[i] / 2 * n, "steps": n}
            levels[-1]["cpu_wait"] = {"ms_per_step": cpu_wait_ms[i], "per_rank": {"0": per, "1": per}}
    rd = RunDir(path)
    rd.write_table(C.HOOK_COLLECTIVES, pd.concat(colls, ignore_index=True))
    rd.write_table(C.HOOK_STEPS, pd.concat(stepss, ignore_index=True))
    rd.write_table(C.LOAD_REQUESTS, pd.concat(reqs, ignore_index=True))
    rd.write_table(C.LOAD_TOKENS, pd.concat(toks, ignore_index=True))
    rd.write_json(C.LOAD_LEVELS, levels)
    rd.write_json(C.HOOK_STATUS, {"enabled": True, "ranks": [0, 1], "model_config": TINY_CONFIG})
    analyse_run_dir(rd, conditions={"model": "synthetic", "output_len": output_len, "tp": 2})
    return path
