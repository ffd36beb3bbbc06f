"""Hook overhead: single-stream TPOT with no plugin, with the plugin installed and not recording, and with
the plugin recording, in separate server starts in ABBA order (plain, plugin, plugin, plain).

TPOT here is each request's (E2E - TTFT) / (tokens - 1), as `vllm bench serve` defines it; the median is over
requests. Each plugin start runs batches alternating not recording / recording (POST /tpcomm/v1/stop and
/start between batches, the order flipped every round), so drift within a start hits both alike; the plain
starts around them bracket drift between starts. Printed: the three ratios of median TPOT,
plugin-not-recording / plain, plugin-recording / plain and recording / not recording, each also as the
median of per-pair ratios (start k of the plugin against the plain start beside it). Targets: not
recording / plain <= 1.005 ("off costs nothing measurable"), recording / plain <= 1.02.

    .venv/bin/python benchmarks/bench_hook_overhead.py                    # tiny DeepSeek-V3, TP 2 (vLLM-CPU here)
    .venv/bin/python benchmarks/bench_hook_overhead.py --tp 1 --arch llama --graph-timing   # e.g. one GPU
    .venv/bin/python benchmarks/bench_hook_overhead.py --server-url http://127.0.0.1:8000 [--api-key K]

--server-url measures recording vs not recording on a running server only (no plain start possible).
--graph-timing starts the plugin servers with TPCOMM_GRAPH_TIMING=1 (events captured into CUDA graphs,
paid on every replay: the cost the "not recording" ratio shows on a GPU with TP >= 2).

Also prints the record buffer's bytes per worker (the hook's memory bound) and the hook's own Python cost.

    .venv/bin/python benchmarks/bench_hook_overhead.py --graph-events   # GPU only, no server

measures what the hook's timing events cost inside CUDA graphs (TPCOMM_GRAPH_TIMING=1): a graph of 200 tiny
kernels, captured without events and with an event pair around each of N of them (one pair per collective as
the hook captures), replay time per replay and per event pair. Skips with a message (exit 0) without CUDA.

It also measures what the events do to programmatic dependent launch (PDL): vLLM launches FlashInfer's fused
all-reduce + RMSNorm with launch_with_pdl=True, and with graph timing on the hook captures an event pair around
it (hook/fused.py). A graph of a chain of FlashInfer RMSNorm kernels launched with PDL (one GPU: the all-reduce
itself needs several) is replayed with PDL and no events, with PDL and an event pair around each kernel, and
without PDL: if "with events" is near "without PDL", the events cost the overlap. Skips with a message
without CUDA or FlashInfer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpcomm.attribute.hook_client import HookClient  # noqa: E402


def stream_request(url: str, key: str | None, model: str, output_len: int) -> tuple[float, float]:
    """One streaming completion -> (mean ITL = (E2E - TTFT) / (tokens - 1), E2E / tokens), in ms.

    Per-chunk arrival gaps are not used: on a busy 2-core machine the API server
    often delivers several tokens in one read, which makes single gaps near zero
    (and can squeeze a whole stream into one burst: E2E / tokens is robust to that).
    """
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": model,
        "prompt": "tensor parallel inference splits every layer",
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = None
    tokens = 0
    t_send = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if first is None or tokens < 2:
        raise RuntimeError(f"request produced {tokens} tokens; cannot measure inter-token latency")
    return (last - first) * 1e3 / (tokens - 1), (last - t_send) * 1e3 / tokens


def hook_cost_us(n: int = 100_000) -> dict[str, float]:
    """In-process cost of the hook's Python around one collective and one step, in us.

    Uses the real Hook on a stand-in group (the attributes the hook reads) and a
    no-op collective, so only the hook's own work is timed: the deterministic
    part of the overhead, independent of the machine's load.
    """
    import torch

    from tpcomm.hook.core import Hook

    class Group:
        unique_name, rank_in_group, world_size = "tp:0", 0, 2
        _tpcomm_backends = {"all_reduce": "shm"}

    class Sched:
        num_scheduled_tokens = {"r0": 1}
        total_num_scheduled_tokens = 1
        scheduled_new_reqs: list = []

    h, g, x, sched = Hook(), Group(), torch.zeros(256, dtype=torch.bfloat16), Sched()

    def per_call(fn) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6

    noop = lambda t: t  # noqa: E731
    base = per_call(lambda: noop(x))
    off = per_call(lambda: h.timed(g, "all_reduce", x, noop, x)) - base
    h.start()
    on = per_call(lambda: h.timed(g, "all_reduce", x, noop, x)) - base
    h.start()
    step = per_call(lambda: (h.step_begin(sched), h.step_end(None), h.sample_end()))
    # The fail-safe wrapper every patch goes through (hook/failsafe.py), around the same no-op: a pass-through
    # part, and a site switched off (the original straight away).
    from tpcomm.hook import failsafe

    guarded = failsafe.wrap(noop, "collective", lambda call, t: call(t))
    wrapper = per_call(lambda: guarded(x)) - base
    failsafe.disable("bench_site_off", "benchmark")
    off_site = failsafe.wrap(noop, "bench_site_off", lambda call, t: call(t))
    wrapper_off = per_call(lambda: off_site(x)) - base
    return {
        "collective_armed_us": on,
        "collective_disarmed_us": off,
        "step_armed_us": step,
        "failsafe_wrapper_us": wrapper,
        "failsafe_site_off_us": wrapper_off,
    }


def alternate(url: str, key: str | None, model: str, rounds: int, per_batch: int, output_len: int) -> dict:
    """On a running plugin server: batches alternating not recording / recording, order flipped every round.
    Returns {"off": [TPOT ms], "on": [TPOT ms], "status": ..., "records": ..., "dropped": ...}."""
    hook = HookClient(url, api_key=key)
    status = hook.status()
    got: dict[str, list[float]] = {"off": [], "on": []}
    for rnd in range(rounds):
        for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
            hook.start() if mode == "on" else hook.stop()
            got[mode] += [stream_request(url, key, model, output_len)[0] for _ in range(per_batch)]
    recorded = hook.stop()
    return {**got, "status": status, "records": recorded["records"], "dropped": recorded["dropped"]}


def abba(a, log_dir: Path) -> dict:
    """Four starts, plain / plugin / plugin / plain; per start the same number of requests per mode."""
    from tpcomm.tinymodel import generate
    from tpcomm.vllm_server import VllmServer

    model_dir = a.model_path or str(generate(log_dir / f"tiny-{a.arch}", arch=a.arch))
    env = {"TPCOMM_GRAPH_TIMING": "1" if a.graph_timing else "0"}
    extra = a.extra_args.split() if a.extra_args else []
    starts: list[dict] = []
    for i, kind in enumerate(("plain", "plugin", "plugin", "plain")):
        srv = VllmServer(
            model=model_dir,
            tp=a.tp,
            plugin=kind == "plugin",
            extra_env=env,
            extra_args=extra,
            log_path=str(log_dir / f"server{i}-{kind}.log"),
        )
        print(f"start {i + 1}/4: {kind} (TP {a.tp}, log {srv.log_path}) ...", flush=True)
        srv.start()
        try:
            name = "tiny" if Path(model_dir, ".tpcomm-tiny-model").exists() else model_dir
            for _ in range(2):
                stream_request(srv.url, None, name, 16)  # warm-up
            if kind == "plain":
                n = a.rounds * a.per_batch
                starts.append(
                    {"kind": kind, "plain": [stream_request(srv.url, None, name, a.output_len)[0] for _ in range(n)]}
                )
            else:
                starts.append({"kind": kind, **alternate(srv.url, None, name, a.rounds, a.per_batch, a.output_len)})
        finally:
            srv.stop()
    return {"starts": starts}


def ratios(starts: list[dict]) -> dict:
    """Median TPOT per mode over all starts, the three ratios, and the per-pair ratios (plugin start k against
    the plain start beside it: 2 with 1, 3 with 4)."""
    pool = {m: [x for s in starts for x in s.get(m, [])] for m in ("plain", "off", "on")}
    med = {m: statistics.median(v) for m, v in pool.items() if v}
    pairs = [(starts[1], starts[0]), (starts[2], starts[3])] if len(starts) == 4 else []
    per_pair = {
        "off/plain": [statistics.median(p["off"]) / statistics.median(q["plain"]) for p, q in pairs],
        "on/plain": [statistics.median(p["on"]) / statistics.median(q["plain"]) for p, q in pairs],
        "on/off": [statistics.median(p["on"]) / statistics.median(p["off"]) for p, _ in pairs],
    }
    return {
        "median_tpot_ms": med,
        "requests": {m: len(v) for m, v in pool.items()},
        "off/plain": med["off"] / med["plain"] if "plain" in med and "off" in med else None,
        "on/plain": med["on"] / med["plain"] if "plain" in med and "on" in med else None,
        "on/off": med["on"] / med["off"] if "off" in med and "on" in med else None,
        "per_pair": per_pair,
    }


def graph_event_cost(kernels: int = 200, pairs: int = 64, replays: int = 2000) -> dict | None:
    """Replay time of a graph of `kernels` tiny kernels, without and with `pairs` timing-event pairs
    captured the way the hook captures them (timing.CudaEventTimer.graph_begin/graph_end). None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    from tpcomm.hook.timing import CudaEventTimer

    x = torch.zeros(256, device="cuda")
    every = max(1, kernels // max(pairs, 1))

    def capture(with_events: bool):
        timer = CudaEventTimer()
        timer.on_capture_begin()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x.add_(1)  # warm-up outside the graph
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for i in range(kernels):
                ev = timer.graph_begin() if with_events and i % every == 0 else None
                x.add_(1)
                if ev is not None:
                    timer.graph_end(ev, i)
        n = len(timer._capturing or [])
        timer.on_capture_end(g)
        return g, n

    def per_replay_us(g) -> float:
        from tpcomm.selfcheck.cuda import graph_replay_us

        return graph_replay_us(g, replays, warmup=50)

    plain, _ = capture(False)
    timed, n = capture(True)
    a = [per_replay_us(plain), per_replay_us(timed), per_replay_us(plain), per_replay_us(timed)]
    off, on = min(a[0], a[2]), min(a[1], a[3])
    return {
        "gpu": torch.cuda.get_device_name(),
        "kernels": kernels,
        "event_pairs": n,
        "replay_us_without": off,
        "replay_us_with": on,
        "us_per_event_pair": (on - off) / max(n, 1),
    }


def pdl_event_cost(chain: int = 64, tokens: int = 16, hidden: int = 4096, replays: int = 1000) -> dict | str:
    """Replay time of a graph of `chain` PDL-launched FlashInfer RMSNorm kernels: with PDL and no events,
    with PDL and the hook's event pair around each kernel, and without PDL. A string (why not) without
    CUDA or FlashInfer."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from flashinfer.norm import rmsnorm
    except Exception as e:  # noqa: BLE001
        return f"FlashInfer not importable ({type(e).__name__}: {e})"
    from tpcomm.hook.timing import CudaEventTimer

    bufs = [torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)

    def body(pdl: bool, timer: CudaEventTimer | None):
        for i in range(chain):
            ev = timer.graph_begin() if timer is not None else None
            rmsnorm(bufs[i % 2], w, out=bufs[(i + 1) % 2], enable_pdl=pdl)
            if ev is not None:
                timer.graph_end(ev, i)

    def capture(pdl: bool, events: bool):
        timer = CudaEventTimer() if events else None
        if timer is not None:
            timer.on_capture_begin()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body(pdl, None)  # warm-up (and JIT) outside the graph
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body(pdl, timer)
        if timer is not None:
            timer.on_capture_end(g)
        return g

    def per_replay_us(g) -> float:
        from tpcomm.selfcheck.cuda import graph_replay_us

        return graph_replay_us(g, replays, warmup=20)

    graphs = {"pdl": capture(True, False), "pdl_events": capture(True, True), "no_pdl": capture(False, False)}
    best = {k: min(per_replay_us(g) for _ in range(2)) for k, g in graphs.items()}
    return {
        "gpu": torch.cuda.get_device_name(),
        "chain": chain,
        "shape": [tokens, hidden],
        "replay_us_pdl": best["pdl"],
        "replay_us_pdl_with_events": best["pdl_events"],
        "replay_us_no_pdl": best["no_pdl"],
        "us_per_kernel_events_cost": (best["pdl_events"] - best["pdl"]) / chain,
        "us_per_kernel_pdl_gain": (best["no_pdl"] - best["pdl"]) / chain,
    }


def main() -> None:
    if "--graph-events" in sys.argv:
        r = graph_event_cost()
        if r is None:
            print("graph-event cost: skipped (no CUDA device)")
            return
        pdl = pdl_event_cost()
        print(
            f"conditions: {r['gpu']}, one graph of {r['kernels']} tiny kernels, replayed back to back, "
            f"GPU time per replay (CUDA events around 2000 replays), best of 2"
        )
        print(
            f"without events {r['replay_us_without']:.2f} us, with {r['event_pairs']} event pairs "
            f"{r['replay_us_with']:.2f} us: {r['us_per_event_pair']:.3f} us per captured pair "
            "(paid on every replay with TPCOMM_GRAPH_TIMING=1, recording on or off)"
        )
        if isinstance(pdl, str):
            print(f"PDL with/without events: skipped ({pdl})")
            return
        print(
            f"PDL: {pdl['chain']} FlashInfer RMSNorm kernels {pdl['shape']} bf16 in one graph, {pdl['gpu']}: "
            f"PDL {pdl['replay_us_pdl']:.2f} us, PDL + an event pair per kernel {pdl['replay_us_pdl_with_events']:.2f} us, "
            f"no PDL {pdl['replay_us_no_pdl']:.2f} us per replay; events cost {pdl['us_per_kernel_events_cost']:.3f} us "
            f"per kernel against a PDL gain of {pdl['us_per_kernel_pdl_gain']:.3f} us per kernel "
            "(graph timing off, the default, or TPCOMM_FUSED_GRAPH_EVENTS=0 leaves them out of the fused all-reduce)"
        )
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-url", help="a running server (plugin on): recording vs not recording only")
    ap.add_argument("--api-key", default=None, help="the server's --api-key, if any (with --server-url)")
    ap.add_argument("--model", default="tiny", help="served model name (with --server-url)")
    ap.add_argument("--model-path", default=None, help="model to start (default: the generated tiny model)")
    ap.add_argument("--arch", default="deepseek_v3", help="tiny model architecture: deepseek_v3 or llama")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel size of the servers started")
    ap.add_argument("--extra-args", default="", help="more vllm serve arguments for every start (one string)")
    ap.add_argument("--graph-timing", action="store_true", help="plugin starts with TPCOMM_GRAPH_TIMING=1")
    ap.add_argument(
        "--rounds", type=int, default=4, help="off/on rounds per plugin start (plain starts: same requests)"
    )
    ap.add_argument("--per-batch", type=int, default=3, help="requests per mode per round")
    ap.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    ap.add_argument("--graph-events", action="store_true", help="GPU only: cost of the timing events in CUDA graphs")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = ap.parse_args()

    if a.server_url:
        res = alternate(a.server_url, a.api_key, a.model, a.rounds, a.per_batch, a.output_len)
        st, r = res["status"], ratios([{"kind": "plugin", **res}])
        print(_conditions(st, a, "one running server, recording vs not"))
        print(
            f"median TPOT (ms): not recording {r['median_tpot_ms']['off']:.3f}, recording {r['median_tpot_ms']['on']:.3f}"
        )
        print(f"ratio recording / not recording: {r['on/off']:.4f} (target <= 1.02)")
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="tpcomm-bench-overhead-"))
        out = abba(a, log_dir)
        r = ratios(out["starts"])
        st = out["starts"][1]["status"]
        print(_conditions(st, a, "4 starts ABBA: plain, plugin, plugin, plain"))
        print(f"{'mode':28s} {'requests':>8s} {'median TPOT (ms)':>17s}")
        for m, name in (("plain", "no plugin"), ("off", "plugin, not recording"), ("on", "plugin, recording")):
            print(f"{name:28s} {r['requests'][m]:8d} {r['median_tpot_ms'][m]:17.3f}")
        pp = r["per_pair"]
        fmt = lambda v: " ".join(f"{x:.4f}" for x in v)  # noqa: E731
        print(
            f"plugin not recording / no plugin: {r['off/plain']:.4f} (per pair {fmt(pp['off/plain'])}; target <= 1.005)"
        )
        print(f"plugin recording / no plugin:     {r['on/plain']:.4f} (per pair {fmt(pp['on/plain'])}; target <= 1.02)")
        print(f"recording / not recording:        {r['on/off']:.4f} (per start {fmt(pp['on/off'])})")
        res = {**out, "ratios": r}
        print(f"server logs: {log_dir}")
    cost = hook_cost_us()
    tok_ms = r["median_tpot_ms"].get("plain") or r["median_tpot_ms"]["off"]
    per_step = 10 * cost["collective_armed_us"] + cost["step_armed_us"]
    print(
        f"hook's own cost (in-process, this machine, host clock): {cost['collective_armed_us']:.2f} us per collective "
        f"armed, {cost['collective_disarmed_us']:.2f} us disarmed, {cost['step_armed_us']:.2f} us per step; "
        f"10 collectives + 1 step = {per_step:.1f} us = {100 * per_step / (1e3 * tok_ms):.2f}% of a {tok_ms:.2f} ms token"
    )
    print(
        f"fail-safe wrapper around each patched call (hook/failsafe.py, included in the TPOT ratios above, not in "
        f"the per-collective cost): {cost['failsafe_wrapper_us']:.2f} us on, {cost['failsafe_site_off_us']:.2f} us "
        "with its site off"
    )
    print(
        f"record buffer per worker: {st['buffer_bytes_per_worker'] / 2**20:.1f} MiB "
        f"({st['buffer_capacity']} collective rows + {st['per_rank'][0]['step_capacity']} step rows, preallocated)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps({"ratios": r, "hook_cost_us": cost, "args": vars(a)}, indent=1, default=str))


def _conditions(st: dict, a, how: str) -> str:
    v = st.get("versions") or {}
    per = (st.get("per_rank") or [{}])[0]
    gt = (per.get("graph_timing") or {}).get("enabled")
    return (
        f"conditions: vLLM {v.get('vllm')} ({v.get('vllm_build')}), torch {v.get('torch')}, TP {len(st.get('ranks') or [])}, "
        f"{v.get('cpu_count')} cores, timing {','.join(st.get('timing') or [])}, async scheduling "
        f"{per.get('async_scheduling')}, graph timing {gt}, single stream, {a.output_len} output tokens x "
        f"{a.per_batch} requests x {a.rounds} rounds per mode per start; {how}"
    )


if __name__ == "__main__":
    main()
