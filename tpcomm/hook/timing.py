"""How the hook times a collective, and the name each record carries in `timing`.

- ``host-sync``: CPU tensors. CPU collectives (vLLM's shared-memory all-reduce,
  gloo) return when the data is there, so two `time.time_ns()` calls bracket
  the whole transfer including the wait for the slowest rank.
- ``cuda-event-eager``: CUDA tensors outside graph capture. A pair of timing
  events from a pool brackets the call on the current stream; the pair is read
  later without blocking (Event.query() at a later step's begin, or at stop/records
  time), and the row's end is filled in as ``t_start_ns + device duration``.
- ``cuda-event-graph``: CUDA tensors captured into a CUDA graph, with graph timing
  on (TPCOMM_GRAPH_TIMING=1 at server start; off by default, see below). Events
  created with ``external=True`` are recorded *into* the graph, and every replay
  re-records them. One step in TPCOMM_GRAPH_SAMPLE_EVERY (default 8; the same steps
  on every rank) is sampled; its replays are read later without a wait (graphs.py).
- ``host-enqueue``: a CUDA call for which no event pair was free (pool exhausted):
  host time of the enqueue only, not a transfer time.

Graph timing is a start-up choice (TPCOMM_GRAPH_TIMING, default off): graphs are
captured once, at start-up, before anyone arms the hook, so events captured into
them are replayed at every step whether recording is on or off, and around the
PDL-launched fused all-reduce + RMSNorm kernel (fused.py) they may cost its overlap.
Off, an installed plugin adds no GPU work at all; the hook still counts the
collectives captured into each graph (`untimed_collectives` of sampled steps) so
that a split knows they ran untimed, and status says graph timing is off.

Start times (`ClockAnchor`): the host runs ahead of the GPU, so the host time at
which a call or a graph was *enqueued* is early by the GPU queue lag. Event rows
(and the GPU step columns, gpuclock.py) are placed on the host clock through an
anchor: a timing event whose GPU completion time is known on the host clock. It is
recorded on a side stream of the device that nothing else uses (so it does not
wait for vLLM's queued work) and polled with Event.query(), bracketed by host times
taken right before the record and right when query() first says done: the event
completed inside that bracket, so its midpoint is the event's host time to within
half the bracket. Only a bracket tighter than ANCHOR_TIGHT_NS is accepted (a few
tries, a few tens of microseconds of polling); at start() the anchor falls back to
waiting on the current stream (`sync`, outside any step) when no side-stream try
is tight. Any other event ``e`` on that device is at ``anchor_ns +
anchor.elapsed_time(e)``. While recording, the anchor is renewed the same way at
a step's begin at most once per ANCHOR_REFRESH_S; collective rows use an anchor no
older than ANCHOR_MAX_AGE_S (the GPU timer and the host clock drift apart by parts
per million), step rows any anchor (their periods are differences on one GPU
timer). Every collective start is at least its enqueue time (a collective cannot
start before it was launched). Durations come from the event pairs either way.

Units: ns for timestamps, ms from `Event.elapsed_time`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tpcomm.hook import failsafe

HOST_SYNC = "host-sync"
CUDA_EVENT_EAGER = "cuda-event-eager"
CUDA_EVENT_GRAPH = "cuda-event-graph"
HOST_ENQUEUE = "host-enqueue"

ANCHOR_MAX_AGE_S = 10.0  # collective rows: an older anchor may have drifted (GPU timer vs host clock)
ANCHOR_TIGHT_NS = 50_000  # an anchor bracket at most this wide is accepted
ANCHOR_REFRESH_S = 1.0  # while recording: renew the anchor at a step's begin at most this often
GRAPH_TIMING_ENV = "TPCOMM_GRAPH_TIMING"


def graph_timing_on() -> bool:
    """TPCOMM_GRAPH_TIMING at server start: capture timing events into CUDA graphs (default off)."""
    return os.environ.get(GRAPH_TIMING_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


class ClockAnchor:
    """A CUDA timing event whose completion time on the host clock is known (see the module docstring).

    `new_event` makes a timing event (default: torch.cuda.Event(enable_timing=True)) and `new_stream` a
    side stream (default: torch.cuda.Stream()); tests pass stand-ins with the CUDA interface."""

    TRIES = 3  # brackets tried per renewal

    def __init__(self, new_event: Callable[[], Any] | None = None, new_stream: Callable[[], Any] | None = None):
        self.event: Any = None
        self.host_ns = 0
        self.err_ns = 0  # half the accepted bracket: the anchor's own uncertainty
        self.mono_s = -1e18  # time.monotonic() of the last fresh anchor
        self.how = None  # "side-stream" | "sync"
        self._new_event = new_event
        self._new_stream = new_stream
        self._side = None

    def _event(self) -> Any:
        if self._new_event is None:
            import torch

            return torch.cuda.Event(enable_timing=True)
        return self._new_event()

    def _side_stream(self) -> Any:
        if self._side is None:
            if self._new_stream is None:
                import torch

                self._side = torch.cuda.Stream()
            else:
                self._side = self._new_stream()
        return self._side

    def _accept(self, ev: Any, h0: int, h1: int, how: str) -> bool:
        self.event, self.host_ns, self.err_ns = ev, (h0 + h1) // 2, (h1 - h0) // 2
        self.mono_s, self.how = time.monotonic(), how
        return True

    def refresh(self, tries: int | None = None) -> bool:
        """No wait on queued work: record an event on an idle side stream and poll it with query() for at most
        ANCHOR_TIGHT_NS, `tries` times (default TRIES). True (and the anchor is renewed) when a bracket was tight
        enough."""
        side = self._side_stream()
        for _ in range(self.TRIES if tries is None else tries):
            ev = self._event()
            h0 = time.time_ns()
            ev.record(side)
            while True:
                done = ev.query()
                h1 = time.time_ns()
                if done or h1 - h0 >= ANCHOR_TIGHT_NS:
                    break
            if done and h1 - h0 < ANCHOR_TIGHT_NS:
                return self._accept(ev, h0, h1, "side-stream")
        return False

    def sync(self) -> bool:
        """Wait for everything enqueued on the current stream, then anchor a second event recorded on the idle
        stream, bracketed by host times. Used at start() only (outside any step), when refresh() found no tight
        bracket. True (and the anchor is updated) when a bracket was tighter than ANCHOR_TIGHT_NS, or when there
        was no anchor at all (then the widest error is kept in err_ns: step periods do not depend on it)."""
        wait = self._event()
        wait.record()
        wait.synchronize()  # the wait: the stream is idle after it
        best = None
        for _ in range(self.TRIES):
            ev = self._event()
            h0 = time.time_ns()
            ev.record()
            ev.synchronize()
            h1 = time.time_ns()
            if h1 - h0 < ANCHOR_TIGHT_NS:
                return self._accept(ev, h0, h1, "sync")
            best = best or (ev, h0, h1)
        if self.event is None and best is not None:
            return self._accept(*best, "sync (loose)")
        return False

    def age_s(self) -> float:
        return time.monotonic() - self.mono_s

    def fresh(self) -> bool:
        return self.event is not None and self.age_s() < ANCHOR_MAX_AGE_S

    def host_ns_of(self, ev: Any) -> int:
        return self.host_ns + int(self.event.elapsed_time(ev) * 1e6)


class CudaEventTimer:
    """Event-based timing for CUDA collectives, eager and inside CUDA graphs."""

    def __init__(self, pool_size: int = 2048, sample_every: int | None = None, graph_timing: bool | None = None):
        self.sample_every = max(1, sample_every or int(os.environ.get("TPCOMM_GRAPH_SAMPLE_EVERY", "8")))
        self.graph_timing = graph_timing_on() if graph_timing is None else graph_timing
        self.pool_size = pool_size
        self._free: list[tuple[Any, Any]] = []
        self._made = 0
        self._pending: deque[tuple[int, tuple[Any, Any], int]] = deque()
        self._capturing: list | None = None  # slots of the graph being captured
        self._capture_untimed = 0  # collectives captured into it without events (graph timing off)
        self.graphs_with_slots = 0
        self.graphs_rotating = 0
        self.graphs_untimed = 0  # graphs holding collectives captured without events
        self.untimed_graph_calls = 0  # captured outside a torch.cuda.CUDAGraph we could see
        self.anchor = ClockAnchor()
        self._next_anchor_try = 0.0
        self.driver: Any = None  # cudadrv.CudaDriver when graph events can rotate
        self.driver_why: str | None = None  # why they cannot
        self.new_event: Callable[[], Any] | None = None  # spare graph events (default torch.cuda.Event)
        if self.graph_timing:
            self._load_driver()

    def _load_driver(self) -> None:
        try:
            from tpcomm.hook.cudadrv import CudaDriver

            self.driver = CudaDriver()
        except Exception as e:  # noqa: BLE001 - graphs are then read the fallback way (graphs.py)
            self.driver, self.driver_why = None, f"{type(e).__name__}: {e}"

    def make_event(self) -> Any:
        if self.new_event is not None:
            return self.new_event()
        import torch

        return torch.cuda.Event(enable_timing=True)

    # ---- eager ----------------------------------------------------------
    def eager_begin(self) -> tuple[Any, Any] | None:
        import torch

        if self._free:
            pair = self._free.pop()
        elif self._made < self.pool_size:
            pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._made += 1
        else:
            return None
        pair[0].record()
        return pair

    def eager_end(self, pair: tuple[Any, Any], row: int, t_start_ns: int) -> None:
        pair[1].record()
        self._pending.append((row, pair, t_start_ns))

    def release(self, pair: tuple[Any, Any]) -> None:
        """Give back a pair whose row was dropped (buffer full)."""
        self._free.append(pair)

    def poll(self, fill_span: Callable[[int, int, int], None], block: bool = False) -> None:
        """Read finished eager event pairs in order; ``fill_span(row, t_start_ns, t_end_ns)`` gets both ends:
        the start placed with the anchor when it is fresh (else the enqueue time), the end start + duration.
        `block` waits for each pair (stop/records time only, never in a step)."""
        anchor = self.anchor if self.anchor.fresh() else None
        while self._pending:
            row, (e0, e1), t0 = self._pending[0]
            if block:
                e1.synchronize()
            elif not e1.query():
                return
            self._pending.popleft()
            dur_ns = int(e0.elapsed_time(e1) * 1e6)
            start = max(t0, anchor.host_ns_of(e0)) if anchor is not None else t0
            fill_span(row, start, start + dur_ns)
            self._free.append((e0, e1))

    def maybe_refresh_anchor(self) -> bool:
        """At a step's begin while recording: renew the clock anchor once per ANCHOR_REFRESH_S, without waiting
        on the step's work (ClockAnchor.refresh polls an event on a side stream)."""
        now = time.monotonic()
        if self.anchor.age_s() < ANCHOR_REFRESH_S or now < self._next_anchor_try:
            return False
        self._next_anchor_try = now + ANCHOR_REFRESH_S  # a failed try is not retried at every step
        return self.anchor.refresh(tries=1)  # in a step: at most one ANCHOR_TIGHT_NS of polling

    # ---- CUDA graphs ----------------------------------------------------
    @property
    def capturing(self) -> bool:
        return self._capturing is not None

    def graph_begin(self) -> Any:
        import torch

        ev = torch.cuda.Event(enable_timing=True, external=True)
        ev.record()
        return ev

    def graph_end(self, ev0: Any, meta: Any) -> None:
        import torch

        ev1 = torch.cuda.Event(enable_timing=True, external=True)
        ev1.record()
        self._capturing.append((meta, ev0, ev1))

    def capture_untimed(self) -> None:
        """A collective captured without events (graph timing off): counted for the graph's replays."""
        if self._capturing is not None:
            self._capture_untimed += 1

    def on_capture_begin(self) -> None:
        self._capturing, self._capture_untimed = [], 0

    def on_capture_end(self, graph: Any) -> None:
        from tpcomm.hook.graphs import GraphEvents, find_nodes

        slots, self._capturing = self._capturing, None
        untimed, self._capture_untimed = self._capture_untimed, 0
        if untimed:
            graph._tpcomm_untimed = untimed
            self.graphs_untimed += 1
        if not slots:
            return
        nodes, why = None, self.driver_why or "graph timing off"
        if self.driver is not None and getattr(graph, "_tpcomm_kept", False):
            try:
                nodes = find_nodes(slots, self.driver.record_nodes(graph.raw_cuda_graph()))
                why = None if nodes is not None else "its event-record nodes were not found at the graph's top level"
            except Exception as e:  # noqa: BLE001 - read the fallback way
                why = f"{type(e).__name__}: {e}"
        elif self.driver is not None:
            why = "captured with keep_graph=False before the hook could keep it"
        graph._tpcomm_slots = slots
        graph._tpcomm_events = GraphEvents(slots, nodes, why)
        self.graphs_with_slots += 1
        self.graphs_rotating += nodes is not None

    def rotate(self, graph: Any) -> Callable:
        """The rotation callback for GraphSampler.note: point `graph`'s nodes at a free event set."""
        return lambda ge: ge.rotate(graph.raw_cuda_graph_exec(), self.driver, self.make_event)

    def due(self, step: int) -> bool:
        return step % self.sample_every == 0

    def status(self) -> dict:
        return {
            "graph_timing": self.graph_timing,
            "graphs_timed": self.graphs_with_slots,
            "graphs_rotating": self.graphs_rotating,
            "graphs_untimed": self.graphs_untimed,
            "graph_timing_off_why": failsafe.disabled().get("graph_capture"),
            "rotation": "off: graph timing off"
            if not self.graph_timing
            else ("on" if self.driver is not None else f"off: {self.driver_why}"),
        }


def patch_cuda_graphs(
    timer: CudaEventTimer,
    after_replay: Callable[[Any, int], None],
    before_replay: Callable[[Any], None] | None = None,
    cls: Any = None,
) -> bool:
    """Bracket torch.cuda.CUDAGraph capture and replay (vLLM's CUDAGraphWrapper uses this class); see
    patch_graph_class. `cls`: the class to patch (default torch.cuda.graphs.CUDAGraph). False where torch
    has no CUDA."""
    if cls is None:
        try:
            import torch

            if not torch.cuda.is_available():
                return False
            cls = torch.cuda.graphs.CUDAGraph
        except Exception:  # noqa: BLE001
            return False
    return patch_graph_class(cls, timer, after_replay, before_replay)


def patch_graph_class(
    cls: type,
    timer: CudaEventTimer,
    after_replay: Callable[[Any, int], None],
    before_replay: Callable[[Any], None] | None = None,
) -> bool:
    """Bracket `cls`'s capture and replay (torch.cuda.graphs.CUDAGraph, or a test's stand-in).

    For a graph holding captured collectives, `before_replay(graph)` runs before the replay is
    enqueued (the last chance to read a noted replay that this one would re-record) and
    `after_replay(graph, host time of the call)` after it. With graph timing on and the driver
    loaded, graphs are made with keep_graph=True (their cudaGraph_t holds the node handles that
    rotation needs, cudadrv.py) and instantiated right after capture, as torch does otherwise.

    Where keep_graph is taken: torch binds the C++ class as `_CUDAGraph` with
    `.def(py::init<bool>(), py::arg("keep_graph") = false)` (torch/csrc/cuda/Graph.cpp), so the flag
    reaches the C++ object through pybind's `__init__`; `__new__` (torch/cuda/graphs.py:
    `super().__new__(cls, keep_graph)`) goes to pybind's generic object allocator, which ignores its
    arguments. type.__call__ then calls `__init__` with the caller's own arguments, so a changed
    `__new__` argument never arrives: `__init__` is patched. If keep_graph stayed False, capture_end
    instantiates and frees the graph, and a second instantiate() fails torch's TORCH_CHECK(keep_graph_)
    (aten/src/ATen/cuda/CUDAGraph.cpp).

    Each method goes through failsafe.patch: torch's call runs exactly once whatever the hook's part
    does, and a failure switches `graph_capture` (creation, capture) or `graph_replay` off for the
    process; the timer then puts no more events into graphs (core.py checks failsafe.off)."""
    from tpcomm.hook import failsafe

    if cls.__dict__.get("_tpcomm_patched", False):
        return True
    keep = timer.graph_timing and timer.driver is not None

    def init_part(call, self, keep_graph: bool = False, *a, **k):
        out = call(self, True if keep else keep_graph, *a, **k)
        if keep_graph:
            self._tpcomm_kept = self._tpcomm_user_kept = True
        elif keep:
            self._tpcomm_kept = True  # kept for the hook: instantiated at capture end as torch would
        return out

    def begin_part(call, self, *a, **k):
        out = call(self, *a, **k)
        timer.on_capture_begin()
        return out

    def end_part(call, self, *a, **k):
        try:
            out = call(self, *a, **k)
            if getattr(self, "_tpcomm_kept", False) and not getattr(self, "_tpcomm_user_kept", False):
                self.instantiate()  # keep_graph=True was the hook's doing: instantiate as torch would have
        finally:
            timer.on_capture_end(self)
        return out

    if keep:
        failsafe.patch(cls, "__init__", "graph_capture", init_part)
    failsafe.patch(cls, "capture_begin", "graph_capture", begin_part)
    failsafe.patch(cls, "capture_end", "graph_capture", end_part)
    failsafe.patch(cls, "replay", "graph_replay", replay_part(after_replay, before_replay))
    cls._tpcomm_patched = True
    return True


def unpatch_cuda_graphs(cls: Any = None) -> None:
    """Undo patch_cuda_graphs (a selfcheck or a test that patched the class in its own process)."""
    from tpcomm.hook import failsafe

    if cls is None:
        import torch

        cls = torch.cuda.graphs.CUDAGraph
    if cls.__dict__.get("_tpcomm_patched", False):
        failsafe.unpatch(cls)
        cls._tpcomm_patched = False


def replay_part(
    after_replay: Callable[[Any, int], None], before_replay: Callable[[Any], None] | None = None
) -> Callable:
    """The hook's part around CUDAGraph.replay (failsafe.patch), for graphs that hold captured collectives
    (timed: `_tpcomm_slots`, or captured without events: `_tpcomm_untimed`)."""

    def replay(call, self, *a, **k):
        timed = getattr(self, "_tpcomm_slots", None)
        if timed and before_replay is not None:
            before_replay(self)
        t = time.time_ns()
        out = call(self, *a, **k)
        if timed or getattr(self, "_tpcomm_untimed", 0):
            after_replay(self, t)
        return out

    return replay
