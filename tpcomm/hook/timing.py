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
  re-records them. After a replay in a sampled step (one step in
  TPCOMM_GRAPH_SAMPLE_EVERY, default 8; the same steps on every rank) the hook
  waits for the graph to finish and reads each pair.
- ``host-enqueue``: a CUDA call for which no event pair was free (pool exhausted):
  host time of the enqueue only, not a transfer time.

Start times (`ClockAnchor`): the host runs ahead of the GPU, so the host time at
which a call or a graph was *enqueued* is early by the GPU queue lag. Event rows
are therefore placed on the host clock through an anchor: a plain timing event
recorded on the stream and waited for at once; when the host had to wait for it
(``query()`` False before ``synchronize()``), the host time on return is the
event's completion time to within the wake-up latency (microseconds), and any
other event ``e`` on that device is at ``anchor_ns + anchor.elapsed_time(e)``.
After a sampled replay the anchor is the wait the hook needs anyway (a reference
event recorded right behind the graph replaces the wait on the graph's last
event): no extra sync. If the graph had already finished when the host looked
(no queue lag to speak of), rows keep the enqueue-based placement. Eager pairs
are placed with the newest anchor no older than ANCHOR_MAX_AGE_S, refreshed at
most once a second at a step start while eager pairs are in use (one short wait
per second). Every start is at least the enqueue time (a collective cannot start
before it was launched), so graph and eager rows share one clock: the host wall
clock at which the GPU began the collective. Durations come from the event pairs
either way.

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
ANCHOR_TIGHT_NS = 50_000  # an anchor whose whole record-and-wait took less is exact enough
ANCHOR_REFRESH_S = 1.0  # eager mode: refresh the anchor at a step start at most this often


class ClockAnchor:
    """A CUDA timing event whose completion time on the host clock is known (see the module docstring)."""

    def __init__(self) -> None:
        self.event: Any = None
        self.host_ns = 0
        self.mono_s = -1e18  # time.monotonic() of the last fresh anchor

    def sync(self) -> bool:
        """Record a reference event on the current stream and wait for it. True (and the anchor is
        updated) when the host had to wait, i.e. the host time on return is the event's time."""
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        t_rec = time.time_ns()
        ev.record()
        # Done before we looked: its time is only known to lie in [t_rec, now]; fine when that is short.
        fresh = not ev.query()
        ev.synchronize()
        t = time.time_ns()
        fresh = fresh or t - t_rec < ANCHOR_TIGHT_NS
        if fresh:
            self.event, self.host_ns, self.mono_s = ev, t, time.monotonic()
        return fresh

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

    def poll(
        self,
        fill: Callable[[int, int], None],
        block: bool = False,
        fill_span: Callable[[int, int, int], None] | None = None,
    ) -> None:
        """Read finished eager event pairs in order; ``fill(row, t_end_ns)`` updates the row's end from its
        enqueue time, or, given ``fill_span(row, t_start_ns, t_end_ns)``, both ends placed with the anchor."""
        anchor = self.anchor if fill_span is not None else None
        if anchor is not None and (anchor.event is None or anchor.age_s() > ANCHOR_MAX_AGE_S):
            anchor = None
        while self._pending:
            row, (e0, e1), t0 = self._pending[0]
            if block:
                e1.synchronize()
            elif not e1.query():
                return
            self._pending.popleft()
            dur_ns = int(e0.elapsed_time(e1) * 1e6)
            if fill_span is None:
                fill(row, t0 + dur_ns)
            else:
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
    def read_replay(graph: Any, t_replay_ns: int, emit: GraphEmit, anchor: ClockAnchor | None = None) -> int:
        """One graph's rows right after its replay (one wait); see read_replays."""
        return CudaEventTimer.read_replays([(graph, t_replay_ns, emit)], anchor)

    @staticmethod
    def read_replays(replays: list[tuple[Any, int, GraphEmit]], anchor: ClockAnchor | None = None) -> int:
        """After a sampled step's replays (vLLM's piecewise mode replays one graph per piece): one wait
        for all of them, then one row per captured collective through each replay's `emit`.

        The wait is the anchor's reference event, recorded on the current stream behind every replay
        made on it; a replay made on another stream is waited for on its own last event (no wait when
        it is already done). Start = max(enqueue bound, anchored time): the enqueue bound is the host
        time of the replay call plus the event's offset from the graph's first event (what a row would
        be with no queue lag); the anchored time comes from the reference event (see the module
        docstring). ``anchor`` keeps that reference for eager rows; a private one if None."""
        replays = [r for r in replays if getattr(r[0], "_tpcomm_slots", None)]
        if not replays:
            return 0
        anchor = anchor if anchor is not None else ClockAnchor()
        fresh = anchor.sync()  # also waits for every graph replayed on this stream: the reference is behind them
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


def patch_cuda_graphs(timer: CudaEventTimer, after_replay: Callable[[Any, int], None]) -> bool:
    """Bracket torch.cuda.CUDAGraph capture and replay (vLLM's CUDAGraphWrapper uses this class)."""
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

    def replay(self, *a, **k):
        t = time.time_ns()
        orig_replay(self, *a, **k)
        if getattr(self, "_tpcomm_slots", None):
            after_replay(self, t)

    cls.capture_begin, cls.capture_end, cls.replay = capture_begin, capture_end, replay
    cls._tpcomm_patched = True
    cls._tpcomm_originals = (orig_begin, orig_end, orig_replay)
    return True
