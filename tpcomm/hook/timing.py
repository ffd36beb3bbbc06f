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
  waits for the graph's last event and reads each pair; rows are stamped with the
  host time of the replay call plus the device offset from the graph's first event.
- ``host-enqueue``: a CUDA call for which no event pair was free (pool exhausted):
  host time of the enqueue only, not a transfer time.

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

    def poll(self, fill: Callable[[int, int], None], block: bool = False) -> None:
        """Read finished eager event pairs in order; ``fill(row, t_end_ns)`` updates the row."""
        while self._pending:
            row, (e0, e1), t0 = self._pending[0]
            if block:
                e1.synchronize()
            elif not e1.query():
                return
            self._pending.popleft()
            fill(row, t0 + int(e0.elapsed_time(e1) * 1e6))
            self._free.append((e0, e1))

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
    def read_replay(graph: Any, t_replay_ns: int, emit: GraphEmit) -> int:
        """After a replay: wait for the graph's last event, emit one row per captured collective."""
        slots = getattr(graph, "_tpcomm_slots", None)
        if not slots:
            return 0
        slots[-1][2].synchronize()
        base = slots[0][1]
        for meta, e0, e1 in slots:
            off_ms = base.elapsed_time(e0)
            dur_ms = e0.elapsed_time(e1)
            t0 = t_replay_ns + int(off_ms * 1e6)
            emit(meta, t0, t0 + int(dur_ms * 1e6))
        return len(slots)


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
