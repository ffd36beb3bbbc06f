"""The hook's CUDA step path on a simulated stream (tests/cuda_sim.py): no wait on the serving thread,
sampled graph replays read correctly while the host runs a step ahead of the GPU (vLLM's async
scheduling), the GPU step clock, and what is dropped and counted when a sample cannot be read.

The same code runs on real CUDA in tests/test_hook_timing_gpu.py (marked gpu)."""

from __future__ import annotations

import pytest
from cuda_sim import Dev, Driver, Ev, SideStream, capture

from tpcomm.hook.core import Hook
from tpcomm.hook.gpuclock import StepClock
from tpcomm.hook.timing import ClockAnchor, CudaEventTimer

COLL_MS = [0.05, 0.10, 0.15, 0.20]  # the graph's four collectives (known lengths)
COMPUTE_MS = 2.0  # before each collective: a GPU-bound forward pass of ~8.5 ms
PREP_MS, SAMPLE_MS = 0.05, 0.10


class _Group:
    unique_name, rank_in_group, world_size = "tp:0", 0, 2
    device = "cuda"
    _tpcomm_backends = {"all_reduce": "nccl"}


class _Sched:
    num_scheduled_tokens = {"r": 1}
    total_num_scheduled_tokens = 1
    scheduled_new_reqs: list = []


def sim_hook(dev: Dev, graphs: dict, rotation=True, broken=False, sample_every=2, graph_timing=True) -> Hook:
    h = Hook()
    h.gpu = True
    h.cuda = CudaEventTimer(sample_every=sample_every, graph_timing=graph_timing)
    h.cuda.driver = Driver(graphs, broken) if rotation and graph_timing else None
    h.cuda.new_event = lambda: Ev(dev)
    h.cuda.anchor = ClockAnchor(new_event=lambda: Ev(dev), new_stream=SideStream)
    h.clock = StepClock(new_event=lambda: Ev(dev))
    return h


def serve(h: Hook, dev: Dev, g, steps: int, host_ms: float, drafter=None, drafter_replays: int = 0) -> None:
    """vLLM's async-scheduling loop as the worker sees it: per step, execute_model (input prep, the graph
    replay) then sample_tokens (sampler, drafter replays); the engine keeps at most two steps in flight
    (its batch queue), so before step i the host waits for step i-2's output (vLLM's wait, not the hook's)."""
    marks = []
    for i in range(steps):
        if i >= 2:
            dev.until(marks[i - 2])
        dev.strict = True  # the serving thread's step path: no synchronize allowed from here ...
        h.step_begin(_Sched())
        dev.kernel(PREP_MS)
        h.before_replay(g)
        g.launch()
        h.after_replay(g, 0)
        h.step_end(None)
        dev.kernel(SAMPLE_MS)
        for _ in range(drafter_replays):
            h.before_replay(drafter)
            drafter.launch()
            h.after_replay(drafter, 0)
        h.sample_end()
        dev.strict = False  # ... to here
        m = Ev(dev)
        m.record()
        marks.append(m)
        dev.host(host_ms)


def rows(h: Hook):
    cols = h.rec.columns(0)
    c, s = cols["collectives"], cols["steps"]
    return (
        list(zip(c["step"].tolist(), c["call_idx"].tolist(), [round(d, 1) for d in c["duration_us"].tolist()])),
        s,
    )


def test_no_wait_in_the_step_path_and_every_sample_read_while_the_host_runs_ahead():
    """GPU-bound async scheduling: the host enqueues step i+1 (and replays the graph again) before the GPU
    has run step i. With event rotation every sampled replay is read, exactly, without one synchronize()
    between a step's begin and its end (begin, end, sample end, replay brackets); only stop() waits."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    assert g._tpcomm_events.rotating
    h.start()
    serve(h, dev, g, steps=12, host_ms=1.0)
    assert dev.violations == [] and h.disabled_reason is None
    # the host did run ahead: the graph was enqueued again before its sampled replay had run
    assert h.graphs.rotations == 6
    syncs = dev.syncs
    h.stop()
    assert dev.syncs > syncs  # stop() may wait: the last steps' events
    got, steps = rows(h)
    want = [(s, k, round(ms * 1e3, 1)) for s in range(0, 12, 2) for k, ms in enumerate(COLL_MS)]
    assert sorted(got) == want
    st = h.graphs.status()
    assert st["samples_read"] == 6 and st["samples_dropped"] == 0 and st["samples_pending"] == 0
    # the GPU step clock: each step's span is prep + forward + sampler, back to back (GPU-bound: no idle gap)
    span_ms = PREP_MS + len(COLL_MS) * COMPUTE_MS + sum(COLL_MS) + SAMPLE_MS
    gd = steps["gpu_duration_us"].tolist()
    assert gd[2:] == pytest.approx([span_ms * 1e3] * 10, abs=1)
    g0 = steps["gpu_start_ns"]
    periods = [(b - a) / 1e6 for a, b in zip(g0[2:-1], g0[3:])]
    assert periods == pytest.approx([span_ms] * 9, abs=1e-3)
    # the host's own span of a step is its enqueue span (real host time here), far shorter than the GPU's
    assert sorted(steps["duration_us"])[6] < 0.1 * span_ms * 1e3
    assert list(steps["untimed_collectives"]) == [0] * 12


def test_without_rotation_samples_the_next_replay_would_overwrite_are_dropped_and_counted():
    """No driver access: a sampled replay is readable only until the graph is enqueued again. GPU-bound, the
    host enqueues the next replay first: the sample is dropped (counted, and its collectives count as untimed
    in its step), never read as the wrong replay; still no wait in the step path."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs, rotation=False)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    assert not g._tpcomm_events.rotating
    h.start()
    serve(h, dev, g, steps=12, host_ms=1.0)
    h.stop()
    assert dev.violations == [] and h.disabled_reason is None
    got, steps = rows(h)
    st = h.graphs.status()
    assert st["samples_dropped"] >= 5 and st["samples_read"] + st["samples_dropped"] == 6
    assert "re-recorded by a later replay before it was read" in st["dropped_why"]
    # whatever was read is right (the last sample: nothing replayed after it)
    assert all(d == round(COLL_MS[k] * 1e3, 1) for _, k, d in got)
    dropped_steps = {s for s in range(0, 12, 2)} - {s for s, _, _ in got}
    unt = dict(zip(steps["step"].tolist(), steps["untimed_collectives"].tolist()))
    assert all(unt[s] == len(COLL_MS) for s in dropped_steps) and len(dropped_steps) >= 5


def test_without_rotation_a_host_bound_server_is_read_at_the_next_step():
    """Host-bound (the GPU finishes each step before the host starts the next): the GPU is idle between
    steps, the samples are read with query() at the next step's begin, and the GPU gap shows the idle time."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs, rotation=False)
    g = capture(h, dev, _Group(), 0.1, COLL_MS, graphs)
    h.start()
    serve(h, dev, g, steps=8, host_ms=5.0)
    h.stop()
    assert dev.violations == []
    got, steps = rows(h)
    assert sorted(got) == [(s, k, round(ms * 1e3, 1)) for s in range(0, 8, 2) for k, ms in enumerate(COLL_MS)]
    g0, g1 = steps["gpu_start_ns"].tolist(), steps["gpu_end_ns"].tolist()
    gaps_ms = [(b - a) / 1e6 for a, b in zip(g1[:-1], g0[1:])]
    busy_ms = PREP_MS + len(COLL_MS) * 0.1 + sum(COLL_MS) + SAMPLE_MS
    assert gaps_ms == pytest.approx([5.0 - busy_ms] * 7, abs=1e-3)


def test_a_rotation_that_does_not_take_effect_is_caught_by_the_step_span():
    """A driver call that reports success and changes nothing: the sampled replay's events then hold the
    next replay's times. The check against the sampled step's GPU span drops them (counted); no wrong row."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs, broken=True)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    h.start()
    serve(h, dev, g, steps=12, host_ms=1.0)
    h.stop()
    got, _ = rows(h)
    st = h.graphs.status()
    assert got == [] or all(s % 2 == 0 for s, _, _ in got)
    assert st["samples_read"] == len({s for s, _, _ in got}) and st["samples_dropped"] >= 5
    assert set(st["dropped_why"]) <= {"outside its step's GPU span", "re-recorded by a later replay before it was read"}
    assert "outside its step's GPU span" in st["dropped_why"]


def test_a_drafter_graph_replayed_three_times_in_a_step_gives_each_replay_its_rows():
    """vLLM's EAGLE/MTP drafter replays one graph several times inside sample_tokens: each sampled replay
    rotates to its own event set, so all three are read, in order, none waited for."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs, sample_every=4)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    d = capture(h, dev, _Group(), 0.3, [0.02], graphs)
    h.start()
    serve(h, dev, g, steps=8, host_ms=1.0, drafter=d, drafter_replays=3)
    h.stop()
    assert dev.violations == [] and h.disabled_reason is None
    got, _ = rows(h)
    for s in (0, 4):
        mine = sorted(r for r in got if r[0] == s)
        # the target model's 4 collectives, then the drafter's one per replay, call indices in replay order
        assert mine == [(s, k, round(ms * 1e3, 1)) for k, ms in enumerate(COLL_MS)] + [
            (s, 4 + j, 20.0) for j in range(3)
        ]
    assert h.graphs.status()["samples_dropped"] == 0


def test_graph_timing_off_counts_the_collectives_it_did_not_time():
    """TPCOMM_GRAPH_TIMING off (the default): no events in the graph, no graph rows, and each sampled step's
    untimed_collectives says how many collectives ran in it untimed, so the split cannot read them as 0."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs, graph_timing=False)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    assert not hasattr(g, "_tpcomm_slots") and g._tpcomm_untimed == 4
    h.start()
    serve(h, dev, g, steps=6, host_ms=1.0)
    h.stop()
    got, steps = rows(h)
    assert got == []
    assert steps["untimed_collectives"].tolist() == [4, 0, 4, 0, 4, 0]
    assert not h.cuda.status()["graph_timing"] and h.cuda.status()["rotation"].startswith("off")


def test_start_forgets_samples_of_an_earlier_recording():
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    h.start()
    serve(h, dev, g, steps=1, host_ms=0.1)
    assert h.graphs.notes  # step 0's sample, not read yet (the GPU is still on it)
    h.start()
    assert h.graphs.notes == [] and h.rec.n == 0 and all(not s.busy for s in g._tpcomm_events.sets)


def test_step_clock_reads_only_finished_steps_and_bounds_its_pool():
    dev = Dev()
    clock = StepClock(new_event=lambda: Ev(dev), pool_size=4)
    anchor = ClockAnchor(new_event=lambda: Ev(dev), new_stream=SideStream)
    assert anchor.refresh() and anchor.how == "side-stream"
    got = {}
    for row in range(3):
        clock.begin()
        dev.kernel(1.0)
        clock.end(row)
    assert clock.missed == 1  # a pool of 4 events: the third step has no begin event left
    assert clock.poll(lambda r, a, b: got.__setitem__(r, (a, b)), anchor) == 0  # nothing has run yet
    dev.host(1.5)
    assert clock.poll(lambda r, a, b: got.__setitem__(r, (a, b)), anchor) == 1 and list(got) == [0]
    dev.host(5.0)
    clock.poll(lambda r, a, b: got.__setitem__(r, (a, b)), anchor)
    assert sorted(got) == [0, 1] and (got[1][1] - got[1][0]) == pytest.approx(1e6, abs=1)
    assert got[1][0] - got[0][0] == pytest.approx(1e6, abs=1)  # back to back on the GPU


def test_clock_anchor_refresh_never_waits_and_falls_back_to_sync_only_at_start(monkeypatch):
    """refresh() polls an event on an idle side stream (no synchronize); a bracket wider than the limit is
    refused. sync() (start only) keeps a loose anchor when there is none, and never replaces one with it."""
    import types

    from tpcomm.hook import timing

    dev = Dev()
    clock = iter([])
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(time_ns=lambda: next(clock), monotonic=lambda: 5.0))
    anchor = timing.ClockAnchor(new_event=lambda: Ev(dev), new_stream=SideStream)
    clock = iter([1_000_000, 1_010_000])
    assert anchor.refresh() and anchor.host_ns == 1_005_000 and anchor.err_ns == 5_000 and dev.syncs == 0
    old = anchor.event
    clock = iter([2_000_000, 2_000_000 + timing.ANCHOR_TIGHT_NS + 1] * timing.ClockAnchor.TRIES)
    assert not anchor.refresh() and anchor.event is old  # every bracket too wide: not renewed
    fresh = timing.ClockAnchor(new_event=lambda: Ev(dev), new_stream=SideStream)
    clock = iter([3_000_000 + i * 100_000 for i in range(2 * timing.ClockAnchor.TRIES)])
    assert fresh.sync() and fresh.how == "sync (loose)" and fresh.err_ns == 50_000  # no anchor yet: a loose one
    clock = iter([4_000_000 + i * 100_000 for i in range(2 * timing.ClockAnchor.TRIES)])
    kept = fresh.event
    assert not fresh.sync() and fresh.event is kept


def test_eight_steps_queued_ahead_each_sampled_keep_eight_event_sets_and_drop_nothing():
    """Issue 27 defect 3: what tests/test_hook_timing_gpu.py and the selfcheck do on a GPU: every step sampled,
    8 steps (or a drafter's 8 replays) enqueued before the GPU has run the first. Each sampled replay needs
    its own event set until it is read: 8 rotations, 8 samples read, none dropped (4 sets per graph dropped
    the rest). The drafter variant: one graph replayed 8 times in one sampled step."""
    dev, graphs = Dev(), {}
    h = sim_hook(dev, graphs, sample_every=1)
    g = capture(h, dev, _Group(), COMPUTE_MS, COLL_MS, graphs)
    h.start()
    dev.kernel(100 * COMPUTE_MS)  # the GPU is busy: every step below is enqueued before any of it runs
    dev.strict = True
    for _ in range(8):
        h.step_begin(_Sched())
        h.before_replay(g)
        g.launch()
        h.after_replay(g, 0)
        h.step_end(object())
    dev.strict = False
    h.stop()
    st = h.graphs.status()
    assert dev.violations == [] and h.disabled_reason is None
    assert st["rotations"] == 8 and st["samples_read"] == 8 and st["samples_dropped"] == 0
    got, _ = rows(h)
    assert sorted(got) == [(s, k, round(ms * 1e3, 1)) for s in range(8) for k, ms in enumerate(COLL_MS)]
    d = capture(h, dev, _Group(), 0.3, [0.02], graphs)
    h.start()
    dev.kernel(100 * COMPUTE_MS)
    h.step_begin(_Sched())
    for _ in range(8):
        h.before_replay(d)
        d.launch()
        h.after_replay(d, 0)
    h.step_end(object())
    h.stop()
    assert h.graphs.status()["samples_read"] == 8 and h.graphs.status()["samples_dropped"] == 0
