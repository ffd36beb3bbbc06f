"""How the hook times a collective, and the name each record carries in `timing`.

- ``host-sync``: CPU tensors. CPU collectives (vLLM's shared-memory all-reduce,
  gloo) return when the data is there, so two `time.time_ns()` calls bracket
  the whole transfer including the wait for the slowest rank.
- ``cuda-event-eager``: CUDA tensors outside graph capture. A pair of timing
  events from a pool brackets the call on the current stream; the pair is read
  later without blocking (at the next step, or at stop/records time), and the
  row's end is filled in as ``t_start_ns + device duration``. ``t_start_ns`` is
  the host time at which the call was enqueued.
- ``cuda-event-graph``: CUDA tensors while a CUDA graph is being captured. Events
  created with ``external=True`` are recorded *into* the graph, so every replay
  re-records them. The replays of a sampled step (one step in
  TPCOMM_GRAPH_SAMPLE_EVERY, default 8; the same steps on every rank) are read
  with one wait at the step's end (or at sample_end), or just before the same
  graph is replayed again within the step (the drafter loop).
- ``host-enqueue``: a CUDA call for which no event pair was free (pool exhausted):
  host time of the enqueue only, not a transfer time.

Start times (`ClockAnchor`): the host runs ahead of the GPU, so the host time at
which a call or a graph was *enqueued* is early by the GPU queue lag. Event rows
are therefore placed on the host clock through an anchor. A sync records an event
on the stream and waits for it (the wait a sampled step needs anyway: that event
is behind every replay made on the stream); the host time on return from that wait
is not used, since a thread switch (GIL) between the wake-up and `time.time_ns()`
can make it late by milliseconds. Instead, on the stream now idle, a second event
is recorded and waited for, bracketed by host times taken right before the record
and right after the wait: the event ran inside that bracket, so its midpoint is the
event's host time to within half the bracket. Only a bracket tighter than
ANCHOR_TIGHT_NS is accepted (a few tries); else the anchor is not renewed and rows
keep the enqueue-based placement. Any other event ``e`` on that device is at
``anchor_ns + anchor.elapsed_time(e)``. Eager pairs are placed with the newest
anchor no older than ANCHOR_MAX_AGE_S, refreshed at most once a second at a step
start while eager pairs are in use (one short wait per second). Every start is at
least the enqueue time (a collective cannot start before it was launched), so graph
and eager rows share one clock: the host wall clock at which the GPU began the
collective. Durations come from the event pairs either way.

Units: ns for timestamps, ms from `Event.elapsed_time`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

HOST_SYNC = "host-sync"
CUDA_EVENT_EAGER = "cuda-event-eager"
CUDA_EVENT_GRAPH = "cuda-event-graph"
HOST_ENQUEUE = "host-enqueue"

GraphEmit = Callable[[Any, int, int], None]  # (meta, t_start_ns, t_end_ns)
ANCHOR_MAX_AGE_S = 10.0  # eager rows: an older anchor may have drifted (GPU timer vs host clock)
ANCHOR_TIGHT_NS = 50_000  # an anchor bracket (record + wait on an idle stream) at most this wide is accepted
ANCHOR_REFRESH_S = 1.0  # eager mode: refresh the anchor at a step start at most this often


class ClockAnchor:
    """A CUDA timing event whose completion time on the host clock is known (see the module docstring).

    `new_event` makes a timing event (default: torch.cuda.Event(enable_timing=True)); tests pass
    stand-ins with CUDA events' interface."""

    TRIES = 3  # brackets tried per sync before giving up on renewing the anchor

    def __init__(self, new_event: Callable[[], Any] | None = None) -> None:
        self.event: Any = None
        self.host_ns = 0
        self.err_ns = 0  # half the accepted bracket: the anchor's own uncertainty
        self.mono_s = -1e18  # time.monotonic() of the last fresh anchor
        self._new_event = new_event

    def _event(self) -> Any:
        if self._new_event is None:
            import torch

            return torch.cuda.Event(enable_timing=True)
        return self._new_event()

    def sync(self) -> bool:
        """Wait for everything enqueued on the current stream, then anchor a second event recorded on
        the idle stream, bracketed by host times. True (and the anchor is updated) when a bracket was
        tighter than ANCHOR_TIGHT_NS."""
        wait = self._event()
        wait.record()
        wait.synchronize()  # the wait: the stream is idle after it
        for _ in range(self.TRIES):
            ev = self._event()
            h0 = time.time_ns()
            ev.record()
            ev.synchronize()
            h1 = time.time_ns()
            if h1 - h0 < ANCHOR_TIGHT_NS:
                self.event, self.host_ns, self.err_ns = ev, (h0 + h1) // 2, (h1 - h0) // 2
                self.mono_s = time.monotonic()
                return True
        return False

    def age_s(self) -> float:
        return time.monotonic() - self.mono_s

    def host_ns_of(self, ev: Any) -> int:
        return self.host_ns + int(self.event.elapsed_time(ev) * 1e6)


class CudaEventTimer:
    """Event-based timing for CUDA collectives, eager and inside CUDA graphs."""

    def __init__(self, pool_size: int = 2048, sample_every: int | None = None):
        self.sample_every = max(1, sample_every or int(os.environ.get("TPCOMM_GRAPH_SAMPLE_EVERY", "8")))
        self.pool_size = pool_size
        self._free: list[tuple[Any, Any]] = []
        self._made = 0
        self._pending: deque[tuple[int, tuple[Any, Any], int]] = deque()
        self._capturing: list | None = None  # slots of the graph being captured
        self.graphs_with_slots = 0
        self.untimed_graph_calls = 0  # captured outside a torch.cuda.CUDAGraph we could see
        self.anchor = ClockAnchor()
        self._eager_since_anchor = 0  # eager pairs handed out since the anchor was last refreshed

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
        self._eager_since_anchor += 1
        return pair

    def eager_end(self, pair: tuple[Any, Any], row: int, t_start_ns: int) -> None:
        pair[1].record()
        self._pending.append((row, pair, t_start_ns))

    def release(self, pair: tuple[Any, Any]) -> None:
        """Give back a pair whose row was dropped (buffer full)."""
        self._free.append(pair)

    def poll(self, fill_span: Callable[[int, int, int], None], block: bool = False) -> None:
        """Read finished eager event pairs in order; ``fill_span(row, t_start_ns, t_end_ns)`` gets both ends:
        the start placed with the anchor when it is fresh (else the enqueue time), the end start + duration."""
        anchor = self.anchor
        if anchor.event is None or anchor.age_s() > ANCHOR_MAX_AGE_S:
            anchor = None
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
        """At a step start in eager mode: refresh the clock anchor once per ANCHOR_REFRESH_S (a short wait)."""
        if not self._eager_since_anchor or self.anchor.age_s() < ANCHOR_REFRESH_S:
            return False
        self._eager_since_anchor = 0
        return self.anchor.sync()

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

    def on_capture_begin(self) -> None:
        self._capturing = []

    def on_capture_end(self, graph: Any) -> None:
        slots, self._capturing = self._capturing, None
        if slots:
            graph._tpcomm_slots = slots
            self.graphs_with_slots += 1

    def due(self, step: int) -> bool:
        return step % self.sample_every == 0

    @staticmethod
    def read_replays(replays: list[tuple[Any, int, GraphEmit]], anchor: ClockAnchor | None = None) -> int:
        """After a sampled step's replays (vLLM's piecewise mode replays one graph per piece): one wait
        for all of them, then one row per captured collective through each replay's `emit`.

        The wait is the anchor's sync (ClockAnchor.sync), recorded on the current stream behind every
        replay made on it; a replay made on another stream is waited for on its own last event (no wait
        when it is already done). Start = max(enqueue bound, anchored time): the enqueue bound is the
        host time of the replay call plus the event's offset from the graph's first event (what a row
        would be with no queue lag); the anchored time comes from the anchor's reference event, renewed
        by this sync or else one younger than ANCHOR_MAX_AGE_S (see the module docstring). ``anchor``
        keeps that reference for eager rows; a private one if None."""
        replays = [r for r in replays if getattr(r[0], "_tpcomm_slots", None)]
        if not replays:
            return 0
        anchor = anchor if anchor is not None else ClockAnchor()
        fresh = anchor.sync() or (anchor.event is not None and anchor.age_s() < ANCHOR_MAX_AGE_S)
        n = 0
        for graph, t_replay_ns, emit in replays:
            slots = graph._tpcomm_slots
            last = slots[-1][2]
            if not last.query():
                last.synchronize()
            base = slots[0][1]
            for meta, e0, e1 in slots:
                t0 = t_replay_ns + int(base.elapsed_time(e0) * 1e6)
                if fresh:
                    t0 = max(t0, anchor.host_ns_of(e0))
                emit(meta, t0, t0 + int(e0.elapsed_time(e1) * 1e6))
            n += len(slots)
        return n


def patch_cuda_graphs(
    timer: CudaEventTimer,
    after_replay: Callable[[Any, int], None],
    before_replay: Callable[[Any], None] | None = None,
) -> bool:
    """Bracket torch.cuda.CUDAGraph capture and replay (vLLM's CUDAGraphWrapper uses this class).

    For a graph holding captured collectives, `before_replay(graph)` runs before the replay is
    enqueued (the last chance to read the events of its previous replay, which this one re-records)
    and `after_replay(graph, host time of the call)` after it."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        cls = torch.cuda.graphs.CUDAGraph
    except Exception:
        return False
    if getattr(cls, "_tpcomm_patched", False):
        return True
    orig_begin, orig_end, orig_replay = cls.capture_begin, cls.capture_end, cls.replay

    def capture_begin(self, *a, **k):
        orig_begin(self, *a, **k)
        timer.on_capture_begin()

    def capture_end(self, *a, **k):
        try:
            orig_end(self, *a, **k)
        finally:
            timer.on_capture_end(self)

    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    cls.replay = bracket_replay(orig_replay, after_replay, before_replay)
    cls._tpcomm_patched = True
    cls._tpcomm_originals = (orig_begin, orig_end, orig_replay)
    return True


def unpatch_cuda_graphs() -> None:
    """Undo patch_cuda_graphs (a selfcheck or a test that patched the class in its own process)."""
    import torch

    cls = torch.cuda.graphs.CUDAGraph
    if getattr(cls, "_tpcomm_originals", None):
        cls.capture_begin, cls.capture_end, cls.replay = cls._tpcomm_originals
        cls._tpcomm_patched = False


def bracket_replay(
    orig_replay: Callable, after_replay: Callable[[Any, int], None], before_replay: Callable[[Any], None] | None = None
) -> Callable:
    """CUDAGraph.replay with the callbacks of patch_cuda_graphs, for graphs that hold captured collectives."""

    def replay(self, *a, **k):
        timed = getattr(self, "_tpcomm_slots", None)
        if timed and before_replay is not None:
            before_replay(self)
        t = time.time_ns()
        orig_replay(self, *a, **k)
        if timed:
            after_replay(self, t)

    return replay
