"""CUDA checks run in this process: the CUDA-event timer against a kernel of known
length (eager, and recorded inside a CUDA graph that is replayed on another stream
and read at 1 replay in N), what timing events cost inside a graph, and NVML.

The known length: `torch.cuda._sleep(cycles)` spins a fixed number of SM clock
cycles; its length in microseconds is measured with the host clock over many
back-to-back launches (launch gaps vanish in the queue), right before use, after a
warm-up that brings the clocks up. The events are then held against that length.

Units: *_us microseconds; Event.elapsed_time is in ms (x 1e3).
"""

from __future__ import annotations

import time

from tpcomm.selfcheck.result import FAIL, PASS, Check, judge_at_most, judge_ratio, sabotaged, timer_eager_check

TIMER_TOL = 0.05  # events vs the host-measured length of a ~1 ms kernel
EVENT_PAIR_LIMIT_US = (
    5.0  # graph cost of one event pair (two record nodes) above which timing inside graphs is too dear
)


class SleepKernel:
    """A kernel of known length: `run(us)` enqueues a spin of that many microseconds."""

    def __init__(self, us: float = 1000.0):
        import torch

        self.us = us
        torch.cuda._sleep(1000)  # load the kernel
        end = time.monotonic() + 0.2  # warm-up: let the SM clock settle at its working speed
        while time.monotonic() < end:
            torch.cuda._sleep(1_000_000)
            torch.cuda.synchronize()
        self.cycles_per_us = 1e6 / self.host_us(1_000_000)

    def host_us(self, cycles: int, n: int = 20) -> float:
        """Host-clock length of one `_sleep(cycles)`, from n back-to-back launches."""
        import torch

        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1e3 / n

    def run(self, us: float | None = None) -> None:
        import torch

        torch.cuda._sleep(int((self.us if us is None else us) * self.cycles_per_us))


def check_timer_eager(k: SleepKernel, n: int = 20) -> Check:
    import torch

    ref = k.host_us(int(k.us * k.cycles_per_us))
    factor = sabotaged("timer-eager")
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in evs:
        a.record()
        k.run(k.us * factor)
        b.record()
    torch.cuda.synchronize()
    return timer_eager_check([a.elapsed_time(b) * 1e3 for a, b in evs], ref, TIMER_TOL)


def check_timer_graph(k: SleepKernel, replays: int = 32, sample_every: int = 4) -> Check:
    """Events recorded inside a graph (external=True) re-record at every replay; the graph is replayed on a
    stream other than the capture stream, and read only after 1 replay in `sample_every` (as the hook does)."""
    import torch

    ref = k.host_us(int(k.us * k.cycles_per_us))
    factor = sabotaged("timer-graph")
    e0, e1 = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
    warm_on_side_stream(lambda: k.run(10))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        e0.record()
        k.run(k.us * factor)
        e1.record()
    other = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(other):
        for i in range(replays):
            g.replay()
            if i % sample_every == 0:
                e1.synchronize()
                got.append(e0.elapsed_time(e1) * 1e3)
    torch.cuda.synchronize()
    want = -(-replays // sample_every)
    bad = [x for x in got if judge_ratio(x, ref, TIMER_TOL) != PASS]
    status = PASS if len(got) == want and not bad else FAIL
    med = sorted(got)[len(got) // 2] if got else 0.0
    return Check(
        "timer-graph",
        status,
        f"events inside a CUDA graph replayed on another stream, read at 1 in {sample_every} of {replays} replays: "
        f"{len(got)} readings, median {med:.1f} us against {ref:.1f} us (host clock), {len(bad)} outside "
        f"{TIMER_TOL:.0%}",
        {"readings_us": got, "host_us": ref, "sample_every": sample_every, "replays": replays},
    )


def warm_on_side_stream(fn) -> None:
    """Run `fn` once on a side stream and wait for it: what PyTorch asks before capturing `fn` into a graph."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()


def graph_replay_us(g, replays: int, warmup: int = 5) -> float:
    """Mean GPU time of one replay of CUDA graph `g` (us): `warmup` replays, then `replays` between two events."""
    import torch

    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / replays


def check_graph_event_overhead(kernels: int = 200, replays: int = 50) -> Check:
    """A graph of `kernels` tiny kernels, with and without an event pair around each (what the hook captures
    around each collective): the replay time difference per pair."""
    import torch

    x = torch.zeros(1, device="cuda")

    def build(with_events: bool):
        keep = []
        warm_on_side_stream(lambda: x.add_(1))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(kernels):
                if with_events:
                    a, b = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
                    keep.append((a, b))
                    a.record()
                x.add_(1)
                if with_events:
                    b.record()
        return g, keep

    def per_replay_us(g) -> float:
        return graph_replay_us(g, replays, warmup=5)

    plain, _ = build(False)
    timed, keep = build(True)
    # interleave and take the best of 3, so a clock change between the two does not read as overhead
    pairs = [(per_replay_us(plain), per_replay_us(timed)) for _ in range(3)]
    t_plain, t_timed = min(p for p, _ in pairs), min(t for _, t in pairs)
    per_pair = (t_timed - t_plain) / kernels
    return Check(
        "graph-event-overhead",
        judge_at_most(per_pair, EVENT_PAIR_LIMIT_US),
        f"graph of {kernels} tiny kernels: {t_plain:.1f} us per replay, {t_timed:.1f} us with an event pair around "
        f"each: {per_pair:+.2f} us per pair (limit {EVENT_PAIR_LIMIT_US:g}); with TPCOMM_GRAPH_TIMING=1 a server pays "
        f"this per captured collective on every replay, recording or not (at 160 collectives per step: "
        f"{160 * per_pair:+.0f} us per step)",
        {"plain_us": t_plain, "with_events_us": t_timed, "per_pair_us": per_pair, "kernels": kernels},
    )


def _norm_uuid(u) -> str:
    s = str(u or "").lower()
    for p in ("gpu-", "mig-"):
        s = s.removeprefix(p)
    return s


def check_nvml() -> Check:
    """NVML's reading (tpcomm/topo/nvml.py) against CUDA's own view: every visible GPU found by UUID, and each
    off-diagonal P2P cell equal to torch.cuda.can_device_access_peer for that pair."""
    import os

    import torch

    from tpcomm.topo.nvml import read_gpus

    info, why = read_gpus(os.cpu_count() or 1)
    if info is None:
        return Check("nvml", FAIL, f"NVML unreadable with CUDA present: {why}")
    by_uuid = {_norm_uuid(g["uuid"]): g["index"] for g in info["gpus"]}
    n = torch.cuda.device_count()
    idx = [by_uuid.get(_norm_uuid(getattr(torch.cuda.get_device_properties(i), "uuid", ""))) for i in range(n)]
    missing = [i for i, j in enumerate(idx) if j is None]
    pairs = mismatch = 0
    for i in range(n):
        for j in range(n):
            if i == j or idx[i] is None or idx[j] is None:
                continue
            pairs += 1
            if bool(info["p2p_read"][idx[i]][idx[j]]) != bool(torch.cuda.can_device_access_peer(i, j)):
                mismatch += 1
    names = sorted({g["name"] for g in info["gpus"]})
    status = PASS if not missing and not mismatch else FAIL
    return Check(
        "nvml",
        status,
        f"driver {info['driver']}, {len(info['gpus'])} GPU(s) ({', '.join(map(str, names))}); {n - len(missing)}/{n} "
        f"CUDA devices found by UUID; {pairs} off-diagonal P2P cells, {mismatch} differ from CUDA's peer access",
        {"driver": info["driver"], "p2p_read": info["p2p_read"], "mismatch": mismatch, "pairs": pairs},
    )
