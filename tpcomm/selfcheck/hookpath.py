"""The hook's `timed` path (tpcomm/hook/core.py) on a stand-in group, driven the way
vLLM's worker drives it: engine steps around collectives, eager calls, and a CUDA
graph captured once and replayed every step. The "collective" is work of known
length, so the recorded durations can be held against it.

CUDA: rows only at the sampled steps (one in `sample_every`), durations near the
kernel's. CPU: the host-sync path, one row per call, durations against a stopwatch
read inside the call itself (a second instrument on the same call: on a loaded host
the spin is stretched by preemption for both alike; a fixed 2 ms reference once read
3.2 ms with three busy processes on two cores, 2026-12-05).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from tpcomm.selfcheck.result import FAIL, PASS, Check, judge_ratio, judge_sampled_steps, sabotaged

ID = "hook-timed"
TOL = 0.15  # the hook against the call's own stopwatch, or events around a 1 ms kernel: well inside 15%


def _group(device):
    # What Hook._add reads from vLLM's GroupCoordinator; no device communicator: backend from the group.
    return SimpleNamespace(
        unique_name="tp:0", rank_in_group=0, world_size=1, device=device, device_communicator=None, device_group=None
    )


def _same(t):
    return t


def split_sampled_steps(coll: dict, steps: dict) -> int:
    """How many steps attribute's split counts as sampled on one rank's records (hook Recorder.columns: `coll`
    and `steps`), with split.sampled_mask: the steps whose graph replays were read, not every step with a row."""
    import pandas as pd

    from tpcomm.analysis.split import rank_steps, sampled_mask

    a = pd.DataFrame(coll)
    a = a.assign(transfer_us=a["duration_us"], wait_us=0.0)  # one rank: nothing to align across ranks
    return int(sampled_mask(rank_steps(a, pd.DataFrame(steps))).sum())


def _sched():
    return SimpleNamespace(num_scheduled_tokens={"req-0": 1}, total_num_scheduled_tokens=1, scheduled_new_reqs=[])


def _spin(us: float) -> None:
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


def check_host(steps: int = 12, work_us: float = 2000.0) -> Check:
    import numpy as np
    import torch

    from tpcomm.hook.core import Hook

    hook = Hook()
    hook.start()
    group, x = _group(torch.device("cpu")), torch.zeros(8)
    factor = sabotaged(ID)
    inner: list[float] = []

    def call(t):
        a = time.perf_counter_ns()
        _spin(work_us)
        inner.append((time.perf_counter_ns() - a) / 1e3)
        _spin(work_us * (factor - 1))  # test-only sabotage: time in the call that its stopwatch does not see
        return t

    for _ in range(steps):
        hook.step_begin(_sched())
        hook.timed(group, "all_reduce", x, call, x)
        hook.step_end(object())
    hook.stop()
    rows = hook.rec.columns(rank=0)["collectives"] if hook.rec is not None else {"step": [], "duration_us": []}
    dur = np.asarray(rows["duration_us"], dtype=float)
    med = float(np.median(dur)) if len(dur) else 0.0
    ref = float(np.median(inner)) if inner else 0.0
    ok = judge_sampled_steps(list(map(int, rows["step"])), steps, 1, 1) == PASS and len(dur) == steps
    status = PASS if ok and judge_ratio(med, ref, TOL) == PASS else FAIL
    timings = sorted(set(rows.get("timing", [])))
    return Check(
        ID,
        status,
        f"host clock, {len(dur)} rows for {steps} calls in {steps} steps; median {med:.0f} us against {ref:.0f} us "
        f"read by a stopwatch inside the call (a {work_us:.0f} us spin; tolerance {TOL:.0%}); timing "
        f"{','.join(timings) or '-'}",
        {
            "rows": len(dur),
            "median_us": med,
            "reference_us": ref,
            "spin_us": work_us,
            "timing": timings,
            "clock": "host",
        },
    )


class SyncCounter:
    """Counts the waits on the GPU made while active: torch.cuda.synchronize, Stream.synchronize and
    Event.synchronize (what the hook's step path must never call)."""

    def __enter__(self):
        import torch

        self.count, self._saved = 0, []
        for owner, name in (
            (torch.cuda, "synchronize"),
            (torch.cuda.Stream, "synchronize"),
            (torch.cuda.Event, "synchronize"),
        ):
            orig = getattr(owner, name)
            self._saved.append((owner, name, orig))

            def counted(*a, _orig=orig, **k):
                self.count += 1
                return _orig(*a, **k)

            setattr(owner, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)


def check_cuda(kernel, steps: int = 24, sample_every: int = 4) -> Check:
    """`kernel` (cuda.py's SleepKernel) gives a kernel of known length on the current stream. The graph is
    captured with graph timing on, and the steps are enqueued behind a long sleep: the host is far ahead of the
    GPU, as under vLLM's async scheduling, so a sampled replay's events are re-recorded by the next replay
    before the GPU has run it unless the hook rotates them (graphs.py). PASS needs every sample read, durations
    near the kernel's, the GPU step spans near it too, and no wait on the GPU while the steps were enqueued."""
    import numpy as np
    import torch

    from tpcomm.hook import timing
    from tpcomm.hook.core import Hook
    from tpcomm.selfcheck.cuda import warm_on_side_stream

    hook = Hook()
    if not hook.enable_cuda_timing(sample_every, graph_timing=True):
        return Check(ID, FAIL, "could not bracket torch.cuda.CUDAGraph capture/replay")
    try:
        group, x = _group(torch.device("cuda", torch.cuda.current_device())), torch.zeros(8, device="cuda")
        factor = sabotaged(ID)
        fn = lambda t: kernel.run(kernel.us * factor) or t  # noqa: E731
        warm_on_side_stream(lambda: fn(x))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            hook.timed(group, "all_reduce", x, fn, x)
        ge = getattr(g, "_tpcomm_events", None)
        rotating = bool(ge and ge.rotating)
        hook.start()
        # eager: every call of an armed hook is a row
        for _ in range(4):
            hook.timed(group, "all_reduce", x, fn, x)
        hook.poll(block=True)
        eager = hook.rec.columns(rank=0)["collectives"]
        hook.start()  # a fresh buffer for the graph part
        kernel.run(kernel.us * (steps + 10))  # the GPU is busy this long: the host enqueues every step first
        with SyncCounter() as waits:
            t0 = time.perf_counter()
            for _ in range(steps):
                hook.step_begin(_sched())
                g.replay()
                hook.timed(group, "all_gather", x, _same, x)  # eager in every step, as vLLM's logits gather
                hook.step_end(object())
            enqueue_s = time.perf_counter() - t0
        hook.stop()
        cols = hook.rec.columns(rank=0)
        every_step, st = cols["collectives"], cols["steps"]
        gst = hook.graphs.status()
    finally:
        timing.unpatch_cuda_graphs()
    split_sampled = split_sampled_steps(every_step, st)
    is_graph = np.asarray(every_step["timing"]) == timing.CUDA_EVENT_GRAPH
    graph = {k: np.asarray(v)[is_graph] for k, v in every_step.items()}
    eager_steps = len(set(np.asarray(every_step["step"])[~is_graph].tolist()))
    e_med = float(np.median(eager["duration_us"])) if len(eager["duration_us"]) else 0.0
    g_dur = np.asarray(graph["duration_us"], dtype=float)
    g_med = float(np.median(g_dur)) if len(g_dur) else 0.0
    span = np.asarray(st.get("gpu_duration_us", []), dtype=float)
    s_med = float(np.nanmedian(span)) if len(span) and np.isfinite(span).any() else 0.0
    sampled = judge_sampled_steps(list(map(int, graph["step"])), steps, sample_every, 1)
    ahead = enqueue_s * 1e6 < 0.5 * steps * kernel.us  # the host really ran ahead of the GPU
    ok = (
        len(eager["duration_us"]) == 4
        and judge_ratio(e_med, kernel.us, TOL) == PASS
        and sampled == PASS
        and judge_ratio(g_med, kernel.us, TOL) == PASS
        and judge_ratio(s_med, kernel.us, TOL) == PASS
        and waits.count == 0
        and gst["samples_dropped"] == 0
        and ahead
        and eager_steps == steps
        and split_sampled == len(range(0, steps, sample_every))
    )
    return Check(
        ID,
        PASS if ok else FAIL,
        f"CUDA events on a {kernel.us:.0f} us kernel: eager {len(eager['duration_us'])} rows, median {e_med:.0f} us; "
        f"graph, {steps} steps enqueued in {enqueue_s * 1e3:.1f} ms behind {(steps + 10) * kernel.us / 1e3:.0f} ms "
        f"of queued work, 1 in {sample_every} sampled: {len(g_dur)} rows at steps "
        f"{sorted(set(map(int, graph['step'])))} ({sampled}), median {g_med:.0f} us; samples read "
        f"{gst['samples_read']}, dropped {gst['samples_dropped']} {gst['dropped_why'] or ''}; event rotation "
        f"{'on' if rotating else 'off (' + str(ge.why_fixed if ge else 'no slots') + ')'}; GPU step span median "
        f"{s_med:.0f} us; waits on the GPU while enqueuing: {waits.count} (tolerance {TOL:.0%}); an eager gather read in "
        f"{eager_steps} of {steps} steps, and attribute's split counts {split_sampled} sampled steps (must be "
        f"{len(range(0, steps, sample_every))}: those whose graph replay was read)",
        {
            "eager_median_us": e_med,
            "graph_median_us": g_med,
            "graph_rows": len(g_dur),
            "graph_steps": sorted(set(map(int, graph["step"]))),
            "gpu_step_span_median_us": s_med,
            "reference_us": kernel.us,
            "sample_every": sample_every,
            "rotation": rotating,
            "samples": gst,
            "waits_in_steps": waits.count,
            "enqueue_ms": enqueue_s * 1e3,
            "clock": "cuda_event",
            "eager_gather_steps": eager_steps,
            "split_sampled_steps": split_sampled,
        },
    )
