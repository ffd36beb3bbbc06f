"""The hook's CUDA paths on a real GPU: events captured into CUDA graphs and read without a wait while the
host runs ahead (event rotation), the GPU step clock, eager pairs, the side-stream clock anchor, graph
timing off. Needs CUDA (skipped without it); the same logic runs on CPU in tests/test_hook_gpu_clock.py."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class Group:
    unique_name, rank_in_group, world_size = "tp:0", 0, 2
    _tpcomm_backends = {"all_reduce": "nccl"}

    @property
    def device(self):
        return torch.device("cuda", torch.cuda.current_device())


class Sched:
    num_scheduled_tokens = {"r": 1}
    total_num_scheduled_tokens = 1
    scheduled_new_reqs: list = []


@pytest.fixture(scope="module")
def kernel():
    from tpcomm.selfcheck.cuda import SleepKernel

    return SleepKernel(us=500.0)


@pytest.fixture
def hook():
    from tpcomm.hook import timing
    from tpcomm.hook.core import Hook

    h = Hook()
    assert h.enable_cuda_timing(sample_every=1, graph_timing=True)
    yield h
    timing.unpatch_cuda_graphs()


def _capture(h, kernel, lengths_us):
    from tpcomm.selfcheck.cuda import warm_on_side_stream

    x = torch.zeros(8, device="cuda")
    g, grp = torch.cuda.CUDAGraph(), Group()

    def body():
        for us in lengths_us:
            kernel.run(200)  # "compute" between collectives
            h.timed(grp, "all_reduce", x, lambda t, us=us: kernel.run(us) or t, x)

    warm_on_side_stream(body)
    with torch.cuda.graph(g):
        body()
    return g


def test_graphs_are_kept_and_their_event_nodes_found(hook, kernel):
    """keep_graph forced by the hook, instantiated at capture end, and every captured event's node found in the
    graph (cuGraphGetNodes / cuGraphEventRecordNodeGetEvent): the precondition of rotation."""
    g = _capture(hook, kernel, [100, 300])
    assert hook.cuda.driver is not None, hook.cuda.driver_why
    assert getattr(g, "_tpcomm_kept", False) and g.raw_cuda_graph_exec()
    ge = g._tpcomm_events
    assert ge.rotating, ge.why_fixed
    assert len(ge.nodes) == 2 and len({n for pair in ge.nodes for n in pair}) == 4


def test_the_real_binding_keeps_the_graph_when_vllm_constructs_it_plainly(hook, kernel):
    """Issue 27 defect 1 on torch's real pybind class: vLLM's plain `torch.cuda.CUDAGraph()` (cuda_graph.py) with
    graph timing on gives a kept graph (raw_cuda_graph() needs keep_graph=True), captured, instantiated once
    (no TORCH_CHECK(keep_graph_) failure at capture end) and replayed; no timing path switched off."""
    from tpcomm.hook import failsafe

    g = _capture(hook, kernel, [100])
    assert g.raw_cuda_graph() and g.raw_cuda_graph_exec()
    g.replay()
    torch.cuda.synchronize()
    assert "graph_capture" not in failsafe.disabled()


def test_the_start_time_self_test_passes_on_a_gpu(hook):
    """The plugin's start-time self-test (tpcomm/hook/selftest.py) on real CUDA: passes, leaves graph timing on,
    counts no graph of its own."""
    from tpcomm.hook import failsafe
    from tpcomm.hook.selftest import graph_selftest

    assert graph_selftest(hook) is None, failsafe.disabled()
    assert hook.cuda.graph_timing and hook.cuda.graphs_with_slots == 0


def test_samples_are_read_while_the_host_runs_ahead_without_a_wait(hook, kernel):
    """Every step replays the graph again before the GPU has run the previous replay (a long sleep queued
    first): with rotation each sample keeps its own events; no synchronize between step begin and end."""
    from tpcomm.selfcheck.hookpath import SyncCounter

    lengths = [100.0, 300.0]
    g = _capture(hook, kernel, lengths)
    hook.start()
    kernel.run(30_000)  # 30 ms of queued work
    with SyncCounter() as waits:
        t0 = time.perf_counter()
        for _ in range(8):
            hook.step_begin(Sched())
            g.replay()
            hook.step_end(object())
        enqueue_ms = (time.perf_counter() - t0) * 1e3
    assert waits.count == 0
    assert enqueue_ms < 20, enqueue_ms  # the host was ahead: all 8 steps enqueued during the 30 ms sleep
    hook.stop()
    cols = hook.rec.columns(0)
    c, s = cols["collectives"], cols["steps"]
    assert sorted(zip(c["step"].tolist(), c["call_idx"].tolist())) == [(i, k) for i in range(8) for k in range(2)]
    for k, us in enumerate(lengths):
        d = [x for x, ci in zip(c["duration_us"].tolist(), c["call_idx"].tolist()) if ci == k]
        assert all(0.85 * us < v < 1.15 * us for v in d), (k, d)
    st = hook.graphs.status()
    assert st["samples_read"] == 8 and st["samples_dropped"] == 0 and st["rotations"] == 8
    span = s["gpu_duration_us"].tolist()
    want = sum(lengths) + 200 * len(lengths)
    assert all(0.85 * want < v < 1.2 * want for v in span), span
    g0 = s["gpu_start_ns"].tolist()
    assert all(0.85 * want < (b - a) / 1e3 < 1.2 * want for a, b in zip(g0, g0[1:]))  # back to back on the GPU


def test_without_rotation_overwritten_samples_are_dropped_never_misread(hook, kernel):
    g = _capture(hook, kernel, [100.0, 300.0])
    hook.cuda.driver = None  # as on a machine where libcuda's graph calls cannot be used
    hook.start()
    kernel.run(30_000)
    for _ in range(8):
        hook.step_begin(Sched())
        g.replay()
        hook.step_end(object())
    hook.stop()
    st = hook.graphs.status()
    assert st["samples_dropped"] >= 7 and st["samples_read"] + st["samples_dropped"] == 8
    c = hook.rec.columns(0)["collectives"]
    assert all(0.85 * 300 < v < 1.15 * 300 for v, k in zip(c["duration_us"], c["call_idx"]) if k == 1)


def test_a_graph_replayed_three_times_in_a_step_keeps_each_replay(hook, kernel):
    g = _capture(hook, kernel, [150.0])
    hook.start()
    kernel.run(20_000)
    hook.step_begin(Sched())
    for _ in range(3):
        g.replay()
    hook.step_end(object())
    hook.stop()
    c = hook.rec.columns(0)["collectives"]
    assert c["call_idx"].tolist() == [0, 1, 2]
    t0, t1 = c["t_start_ns"].tolist(), c["t_end_ns"].tolist()
    assert t0[1] >= t1[0] - 2_000 and t0[2] >= t1[1] - 2_000  # one after the other on the GPU


def test_graph_timing_off_captures_no_events(kernel):
    from tpcomm.hook import timing
    from tpcomm.hook.core import Hook

    h = Hook()
    assert h.enable_cuda_timing(sample_every=1, graph_timing=False)
    try:
        g = _capture(h, kernel, [100.0, 100.0])
        assert not hasattr(g, "_tpcomm_slots") and g._tpcomm_untimed == 2
        h.start()
        h.step_begin(Sched())
        g.replay()
        h.step_end(object())
        h.stop()
        cols = h.rec.columns(0)
        assert h.rec.n == 0 and cols["steps"]["untimed_collectives"].tolist() == [2]
    finally:
        timing.unpatch_cuda_graphs()


def test_eager_event_pairs_are_read_later_without_blocking_the_call():
    from tpcomm.hook.timing import CudaEventTimer

    timer = CudaEventTimer(pool_size=2, graph_timing=False)
    assert timer.anchor.refresh()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    got = {}
    pairs = [timer.eager_begin() for _ in range(3)]
    assert pairs[2] is None  # pool of 2: the third call is not event-timed (host-enqueue)
    for row, pair in enumerate(pairs[:2]):
        x @ x
        timer.eager_end(pair, row, 1_000)
    timer.poll(lambda row, a, b: got.__setitem__(row, (a, b)), block=True)
    assert set(got) == {0, 1} and all(b > a > 1_000 for a, b in got.values())
    assert len(timer._free) == 2


def test_the_anchor_does_not_wait_for_queued_work(kernel):
    """refresh() polls an event on a side stream: with 50 ms of work queued on the current stream it still
    anchors at once, and the anchor places an event recorded after that work ~50 ms later."""
    from tpcomm.hook.timing import ClockAnchor

    anchor = ClockAnchor()
    kernel.run(50_000)
    t = time.perf_counter()
    assert anchor.refresh(), "no side-stream bracket within the limit"
    assert time.perf_counter() - t < 0.01 and anchor.err_ns < 50_000
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    h_enq = time.time_ns()
    ev.synchronize()
    placed = anchor.host_ns_of(ev)
    assert 30e6 < placed - h_enq < 70e6, (placed - h_enq) / 1e6
