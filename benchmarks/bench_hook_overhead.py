"""Hook overhead: median inter-token latency with recording on vs off, one server, one run.

ITL here is each request's mean inter-token latency, (E2E - TTFT) / (tokens - 1)
as `vllm bench serve` defines TPOT; the median is over requests. Batches of
single-stream requests alternate between recording off and on
(POST /tpcomm/v1/stop and /start between batches, the order flipped every
round), so drift on a shared machine hits both sides alike. Target: on/off
ratio of the median ITL <= 1.02 on the CPU TP-2 tiny model.

    .venv/bin/python benchmarks/bench_hook_overhead.py              # starts its own server
    .venv/bin/python benchmarks/bench_hook_overhead.py --server-url http://127.0.0.1:8000 [--api-key K]

Also prints the record buffer's bytes per worker (the hook's memory bound).

    .venv/bin/python benchmarks/bench_hook_overhead.py --graph-events   # GPU only, no server

measures what the hook's timing events cost inside CUDA graphs, where they are captured
whether recording is on or off (graphs are captured once at start-up, before anyone arms
the hook, so leaving them out while disarmed would leave graph replays untimed for good):
a graph of 200 tiny kernels, captured without events and with an event pair around each
of N of them (one pair per collective as the hook captures), replay time per replay and
per event pair. Skips with a message (exit 0) without CUDA.

It also measures what the events do to programmatic dependent launch (PDL): vLLM launches
FlashInfer's fused all-reduce + RMSNorm with launch_with_pdl=True, and the hook captures an
event pair around it (hook/fused.py; TPCOMM_FUSED_GRAPH_EVENTS=0 leaves them out). A graph of
a chain of FlashInfer RMSNorm kernels launched with PDL (one GPU: the all-reduce itself needs
several) is replayed with PDL and no events, with PDL and an event pair around each kernel,
and without PDL: if "with events" is near "without PDL", the events cost the overlap. Skips
with a message without CUDA or FlashInfer.
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

from tpcomm.hook.client import HookClient  # noqa: E402


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
    return {"collective_armed_us": on, "collective_disarmed_us": off, "step_armed_us": step}


def run(url: str, key: str | None, model: str, rounds: int, per_batch: int, output_len: int) -> dict:
    hook = HookClient(url, api_key=key)
    status = hook.status()
    itl: dict[str, list[float]] = {"off": [], "on": []}
    per_tok: dict[str, list[float]] = {"off": [], "on": []}
    paired: list[float] = []  # per round: median E2E/token on / off (drift cancels within a round)
    stream_request(url, key, model, 16)  # warm-up
    for rnd in range(rounds):
        this: dict[str, list[float]] = {"off": [], "on": []}
        for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
            hook.start() if mode == "on" else hook.stop()
            for _ in range(per_batch):
                a, b = stream_request(url, key, model, output_len)
                itl[mode].append(a)
                per_tok[mode].append(b)
                this[mode].append(b)
        paired.append(statistics.median(this["on"]) / statistics.median(this["off"]))
    recorded = hook.stop()
    med = {m: statistics.median(v) for m, v in itl.items()}
    med_tok = {m: statistics.median(v) for m, v in per_tok.items()}
    return {
        "median_itl_ms": med,
        "ratio_on_off": med["on"] / med["off"],
        "requests": {m: len(v) for m, v in itl.items()},
        "spread_ms": {m: (min(v), max(v)) for m, v in itl.items()},
        "median_e2e_per_token_ms": med_tok,
        "ratio_e2e_per_token": med_tok["on"] / med_tok["off"],
        "paired_ratio_median": statistics.median(paired),
        "paired_ratios": paired,
        "status": status,
        "last_records": recorded["records"],
        "dropped": recorded["dropped"],
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
            "(paid on every replay, recording on or off)"
        )
        if isinstance(pdl, str):
            print(f"PDL with/without events: skipped ({pdl})")
            return
        print(
            f"PDL: {pdl['chain']} FlashInfer RMSNorm kernels {pdl['shape']} bf16 in one graph, {pdl['gpu']}: "
            f"PDL {pdl['replay_us_pdl']:.2f} us, PDL + an event pair per kernel {pdl['replay_us_pdl_with_events']:.2f} us, "
            f"no PDL {pdl['replay_us_no_pdl']:.2f} us per replay; events cost {pdl['us_per_kernel_events_cost']:.3f} us "
            f"per kernel against a PDL gain of {pdl['us_per_kernel_pdl_gain']:.3f} us per kernel "
            "(TPCOMM_FUSED_GRAPH_EVENTS=0 leaves the events out of the fused all-reduce's graphs)"
        )
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-url", help="use this running server (plugin on) instead of starting one")
    ap.add_argument("--api-key", default=None, help="the server's --api-key, if any")
    ap.add_argument("--model", default="tiny", help="served model name")
    ap.add_argument("--rounds", type=int, default=8, help="off/on rounds (each round runs both modes)")
    ap.add_argument("--per-batch", type=int, default=3, help="requests per mode per round")
    ap.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    ap.add_argument("--graph-events", action="store_true", help="GPU only: cost of the timing events in CUDA graphs")
    a = ap.parse_args()

    server = None
    url = a.server_url
    if url is None:
        from tpcomm.tinymodel import generate
        from tpcomm.vllm_server import VllmServer

        tmp = Path(tempfile.mkdtemp(prefix="tpcomm-bench-"))
        server = VllmServer(model=str(generate(tmp / "tiny")), tp=2, plugin=True, log_path=str(tmp / "server.log"))
        print(f"starting vLLM server (TP 2, tiny model, log {tmp / 'server.log'}) ...", flush=True)
        server.start()
        url = server.url
    try:
        res = run(url, a.api_key, a.model, a.rounds, a.per_batch, a.output_len)
    finally:
        if server is not None:
            server.stop()

    st, med = res["status"], res["median_itl_ms"]
    v = st["versions"]
    print(
        f"conditions: vLLM {v.get('vllm')} ({v.get('vllm_build')}), torch {v.get('torch')}, TP {len(st['ranks'])}, "
        f"{v.get('cpu_count')} cores, timing {','.join(st['timing'])}, model {a.model}, single stream, "
        f"{a.output_len} output tokens x {a.per_batch} requests x {a.rounds} rounds per mode"
    )
    print(f"{'mode':6s} {'requests':>8s} {'median ITL (ms)':>16s} {'min..max (ms)':>16s}")
    for m in ("off", "on"):
        lo, hi = res["spread_ms"][m]
        print(f"{m:6s} {res['requests'][m]:8d} {med[m]:16.3f} {lo:7.3f}..{hi:7.3f}")
    print(f"ratio on/off (median ITL): {res['ratio_on_off']:.4f}  (target <= 1.02)")
    et = res["median_e2e_per_token_ms"]
    print(
        f"median E2E/token (ms): off {et['off']:.3f}, on {et['on']:.3f}, ratio {res['ratio_e2e_per_token']:.4f}; "
        f"median of per-round ratios {res['paired_ratio_median']:.4f} "
        f"(rounds: {' '.join(f'{r:.3f}' for r in res['paired_ratios'])})"
    )
    cost = hook_cost_us()
    step_us = 1e3 * et["off"]
    per_step = 10 * cost["collective_armed_us"] + cost["step_armed_us"]
    print(
        f"hook's own cost (in-process, this machine): {cost['collective_armed_us']:.2f} us per collective armed, "
        f"{cost['collective_disarmed_us']:.2f} us disarmed, {cost['step_armed_us']:.2f} us per step; "
        f"10 collectives + 1 step = {per_step:.1f} us = {100 * per_step / step_us:.2f}% of a {step_us / 1e3:.2f} ms token"
    )
    print(
        f"record buffer per worker: {st['buffer_bytes_per_worker'] / 2**20:.1f} MiB "
        f"({st['buffer_capacity']} collective rows + {st['per_rank'][0]['step_capacity']} step rows, preallocated); "
        f"records in the last 'on' batch: {res['last_records']}, dropped: {res['dropped']}"
    )


if __name__ == "__main__":
    main()
