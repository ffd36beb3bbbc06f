"""A Prometheus-style scrape loop must not slow serving: TPOT with GET /tpcomm/v1/metrics every 100 ms vs without.

One server, one run, a full record buffer (recording stays armed, so every
further record is dropped and counted: the worst case for a scrape that pulled
the buffer, which is what scrapes used to do). Batches of single-stream
requests rotate between three modes (the order rotates every round, so drift
hits all alike): no scraping; a loop in a separate process requesting
GET /tpcomm/v1/metrics every --interval-ms; and, as the control, the same loop
on vLLM's own GET /health (what any HTTP request at that rate costs this
machine). Per request: E2E / tokens (robust to the bursty token delivery of a
starved 2-core API server, which makes (E2E - TTFT) / (tokens - 1) swing from
0.01 to 15 ms here); each figure is the median of the per-round ratios of the
median. TPOT medians are printed beside it. Target: metrics/off <= 1.02.
On a 2-core machine whose two TP workers own both cores, any request the API
server handles takes CPU from them, so the control shows that floor; the
metrics/health ratio is what tpcomm's scrape adds beyond it. Also prints the
scrape's own latency (p50/p99) and size.

    .venv/bin/python benchmarks/bench_metrics_scrape.py                  # starts its own server
    .venv/bin/python benchmarks/bench_metrics_scrape.py --max-records 262144   # the default buffer (slow to fill)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_hook_overhead import stream_request  # noqa: E402
from tpcomm.attribute.hook_client import HookClient  # noqa: E402


def _scrape_loop(url: str, headers: dict, interval_s: float, stop, out) -> None:
    lat, size = [], 0
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            t = time.perf_counter()
            r = c.get(url, headers=headers)
            r.raise_for_status()
            lat.append((time.perf_counter() - t) * 1e3)
            size = len(r.content)
            stop.wait(max(0.0, interval_s - (time.perf_counter() - t)))
    out.put((lat, size))


class Scraper:
    """The scrape loop in its own process: the client measuring TPOT shares no interpreter with it."""

    def __init__(self, url: str, key: str | None, interval_s: float):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.stop_evt, self.q = ctx.Event(), ctx.Queue()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.proc = ctx.Process(
            target=_scrape_loop, args=(url, headers, interval_s, self.stop_evt, self.q), daemon=True
        )
        self.lat_ms: list[float] = []
        self.size = 0

    def start(self) -> None:
        self.proc.start()
        time.sleep(1.0)  # the process is up and scraping before the measured requests

    def join(self) -> None:
        self.stop_evt.set()
        self.lat_ms, self.size = self.q.get(timeout=60)
        self.proc.join(timeout=30)


def fill(hook: HookClient, url: str, key: str | None, model: str) -> dict:
    hook.start()
    while True:
        st = hook.status()
        if all(v > 0 for v in st["dropped"].values()):
            return st
        for _ in range(4):
            stream_request(url, key, model, 256)


MODES = ("off", "metrics", "health")


def run(url: str, key: str | None, model: str, rounds: int, per_batch: int, output_len: int, interval_s: float) -> dict:
    hook = HookClient(url, api_key=key)
    stream_request(url, key, model, 16)  # warm-up
    t0 = time.perf_counter()
    full = fill(hook, url, key, model)
    fill_s = time.perf_counter() - t0
    tpot: dict[str, list[float]] = {m: [] for m in MODES}
    paired: dict[str, list[float]] = {"metrics": [], "health": [], "metrics/health": []}
    scrape_ms: list[float] = []
    size = 0
    for rnd in range(rounds):
        this: dict[str, list[float]] = {m: [] for m in MODES}
        for mode in MODES[rnd % 3 :] + MODES[: rnd % 3]:
            path = {"metrics": "/tpcomm/v1/metrics", "health": "/health"}.get(mode)
            sc = Scraper(url + path, key, interval_s) if path else None
            if sc:
                sc.start()
            for _ in range(per_batch):
                itl, per_tok = stream_request(url, key, model, output_len)
                tpot[mode].append(itl)
                this[mode].append(per_tok)
            if sc:
                sc.join()
                if mode == "metrics":
                    scrape_ms += sc.lat_ms
                    size = max(size, sc.size)
        med = {m: statistics.median(v) for m, v in this.items()}
        paired["metrics"].append(med["metrics"] / med["off"])
        paired["health"].append(med["health"] / med["off"])
        paired["metrics/health"].append(med["metrics"] / med["health"])
    end = hook.stop()
    q = statistics.quantiles(scrape_ms, n=100) if len(scrape_ms) >= 2 else [float("nan")] * 99
    return {
        "full": full,
        "fill_s": fill_s,
        "tpot_ms": {m: statistics.median(v) for m, v in tpot.items()},
        "paired": paired,
        "ratio": {k: statistics.median(v) for k, v in paired.items()},
        "scrapes": len(scrape_ms),
        "scrape_ms_p50": statistics.median(scrape_ms) if scrape_ms else float("nan"),
        "scrape_ms_p99": q[98],
        "scrape_bytes": size,
        "dropped_end": end["dropped"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-url", help="use this running server (plugin on) instead of starting one")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--per-batch", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    ap.add_argument(
        "--max-records",
        type=int,
        default=20_000,
        help="record buffer rows per worker for the started server (TPCOMM_HOOK_MAX_RECORDS)",
    )
    a = ap.parse_args()
    server, url = None, a.server_url
    if url is None:
        from tpcomm.tinymodel import generate
        from tpcomm.vllm_server import VllmServer

        tmp = Path(tempfile.mkdtemp(prefix="tpcomm-bench-"))
        server = VllmServer(
            model=str(generate(tmp / "tiny")),
            tp=2,
            plugin=True,
            log_path=str(tmp / "server.log"),
            extra_env={"TPCOMM_HOOK_MAX_RECORDS": str(a.max_records)},
        )
        print(
            f"starting vLLM server (TP 2, tiny model, buffer {a.max_records} rows, log {tmp / 'server.log'}) ...",
            flush=True,
        )
        server.start()
        url = server.url
    try:
        res = run(url, a.api_key, a.model, a.rounds, a.per_batch, a.output_len, a.interval_ms / 1e3)
    finally:
        if server is not None:
            server.stop()
    st = res["full"]
    v = st["versions"]
    print(
        f"conditions: vLLM {v.get('vllm')} ({v.get('vllm_build')}), torch {v.get('torch')}, TP {len(st['ranks'])}, "
        f"{v.get('cpu_count')} cores, timing {','.join(st['timing'])}, single stream, {a.output_len} output tokens "
        f"x {a.per_batch} requests x {a.rounds} rounds per mode; buffer {st['buffer_capacity']} rows per worker, "
        f"full (filled in {res['fill_s']:.0f} s; dropped at the end {res['dropped_end']})"
    )
    t, r = res["tpot_ms"], res["ratio"]
    print(
        f"median TPOT (ms, bursty here): no scraping {t['off']:.3f}, /tpcomm/v1/metrics every {a.interval_ms:.0f} ms "
        f"{t['metrics']:.3f}, /health every {a.interval_ms:.0f} ms (control) {t['health']:.3f}"
    )
    print(
        f"E2E/token ratio metrics/off: {r['metrics']:.4f} (target <= 1.02); control health/off: {r['health']:.4f}; "
        f"metrics/health (what the scrape adds beyond any request): {r['metrics/health']:.4f}"
    )
    for k, v in res["paired"].items():
        print(f"  rounds {k}: {' '.join(f'{x:.3f}' for x in v)}")
    print(
        f"scrape latency: p50 {res['scrape_ms_p50']:.2f} ms, p99 {res['scrape_ms_p99']:.2f} ms over "
        f"{res['scrapes']} scrapes; {res['scrape_bytes']} bytes each"
    )


if __name__ == "__main__":
    main()
