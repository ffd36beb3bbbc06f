"""The CUDA timer: events captured inside a CUDA graph and read after replays, and
eager event pairs read without blocking. Needs CUDA (skipped without it)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture
def patched_timer():
    from tpcomm.hook.timing import CudaEventTimer, patch_cuda_graphs, unpatch_cuda_graphs

    timer = CudaEventTimer(sample_every=1)
    replays: list = []
    patch_cuda_graphs(timer, lambda g, t: replays.append((g, t)))
    yield timer, replays
    unpatch_cuda_graphs()


def _eager_ms(fn, reps: int = 20) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def test_events_recorded_into_a_cuda_graph_time_each_replay(patched_timer):
    timer, replays = patched_timer
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x @ x
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ev = timer.graph_begin()
        y = x @ x
        timer.graph_end(ev, "matmul")
        ev = timer.graph_begin()
        z = y[:16] + 1
        timer.graph_end(ev, "small add")
    assert timer.graphs_with_slots == 1 and len(g._tpcomm_slots) == 2
    mm_ms = _eager_ms(lambda: x @ x)
    rows = []
    for _ in range(5):
        g.replay()
        graph, t_host = replays[-1]
        n = timer.read_replays([(graph, t_host, lambda meta, t0, t1: rows.append((meta, t0, t1)))])
        assert n == 2
    assert len(rows) == 10 and torch.isfinite(z).all()
    mm = [(t1 - t0) / 1e6 for meta, t0, t1 in rows if meta == "matmul"]
    add = [(t1 - t0) / 1e6 for meta, t0, t1 in rows if meta == "small add"]
    assert all(0.3 * mm_ms < d < 3 * mm_ms for d in mm), (mm, mm_ms)
    assert max(add) < min(mm)
    # the add starts after the matmul ends (same stream), stamped on the host clock of the replay
    for i in range(0, 10, 2):
        assert rows[i + 1][1] >= rows[i][2] - 1_000 and abs(rows[i][1] - time.time_ns()) < 60e9


def test_eager_event_pairs_are_read_later_without_blocking_the_call():
    from tpcomm.hook.timing import CudaEventTimer

    timer = CudaEventTimer(pool_size=2)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    got = {}
    pairs = [timer.eager_begin() for _ in range(3)]
    assert pairs[2] is None  # pool of 2: the third call is not event-timed (host-enqueue)
    for row, pair in enumerate(pairs[:2]):
        x @ x
    # record the end events after the work, then read
    for row, pair in enumerate(pairs[:2]):
        timer.eager_end(pair, row, 1_000)
    timer.poll(lambda row, t_end: got.__setitem__(row, t_end), block=True)
    assert set(got) == {0, 1} and all(t > 1_000 for t in got.values())
    assert len(timer._free) == 2


def test_graph_rows_start_when_the_gpu_ran_them_not_when_the_host_enqueued(patched_timer):
    """Queue lag: a replay enqueued behind ~tens of ms of work starts that much later on the GPU. Rows must
    say so (anchored on a host-synced reference event), not the host time of the replay call."""
    from tpcomm.hook.timing import ClockAnchor

    timer, replays = patched_timer
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ev = timer.graph_begin()
        y = x[:64] + 1
        timer.graph_end(ev, "small")
    mm_ms = _eager_ms(lambda: x @ x)
    n = max(4, int(40 / max(mm_ms, 1e-3)))  # ~40 ms of work queued ahead of the replay
    torch.cuda.synchronize()
    t_queue = time.time_ns()
    for _ in range(n):
        x @ x
    g.replay()
    graph, t_host = replays[-1]
    anchor, rows = ClockAnchor(), []
    timer.read_replays([(graph, t_host, lambda meta, t0, t1: rows.append((t0, t1)))], anchor)
    lag_ns = n * mm_ms * 1e6
    ((t0, t1),) = rows
    assert t0 - t_host > 0.5 * lag_ns, (t0 - t_host, lag_ns)  # enqueue time would be ~0 after t_host
    assert t0 - t_queue < 1.5 * lag_ns + 5e6 and t1 >= t0 and torch.isfinite(y).all()
    # The anchor also places eager pairs: a pair enqueued behind the same kind of queue.
    for _ in range(n):
        x @ x
    t_enq = time.time_ns()
    pair = timer.eager_begin()
    x[:64] + 1
    timer.eager_end(pair, 7, t_enq)
    timer.anchor = anchor
    got = {}
    timer.poll(lambda row, a, b: got.__setitem__(row, (a, b)), block=True)
    assert got[7][0] - t_enq > 0.5 * lag_ns, (got[7][0] - t_enq, lag_ns)


def test_a_graph_replayed_twice_in_a_sampled_step_gives_two_rows():
    """The drafter's loop replays one graph several times per step: with the hook's before/after callbacks
    on the real CUDAGraph, each replay is its own row, the second starting after the first ended."""
    from tpcomm.hook import timing
    from tpcomm.hook.core import Hook

    class Group:
        unique_name, rank_in_group, world_size = "tp:0", 0, 2
        device = torch.device("cuda")
        _tpcomm_backends = {"all_reduce": "nccl"}

    h = Hook()
    assert h.enable_cuda_timing(sample_every=1)
    try:
        big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        g, x = Group(), torch.zeros(8, device="cuda")

        def work(t):
            big @ big
            return t

        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            h.timed(g, "all_reduce", x, work, x)
        h.start()
        h.step_begin(
            type("S", (), {"num_scheduled_tokens": {}, "total_num_scheduled_tokens": 0, "scheduled_new_reqs": []})()
        )
        graph.replay()
        graph.replay()
        h.step_end(object())
        cols = h.rec.columns(0)["collectives"]
        assert cols["call_idx"].tolist() == [0, 1]
        (_, s1), (e0, _) = cols["t_start_ns"].tolist(), cols["t_end_ns"].tolist()
        assert s1 >= e0 - 1_000 and h.replays_overwritten == 0
    finally:
        timing.unpatch_cuda_graphs()
