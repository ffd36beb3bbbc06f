"""Engine steps on the GPU timeline: an event when the GPU reaches a step, one when it leaves it.

Why: vLLM 0.32 turns async scheduling on by default on CUDA
(`scheduler_config.async_scheduling`, vllm/config/vllm.py). `execute_model` then
only enqueues the forward pass and returns, and `sample_tokens` enqueues the
sampler and a non-blocking copy: the worker's host span of a step is its enqueue
span, one step ahead of the GPU. Collective durations come from CUDA events, so a
split that subtracts them from host spans mixes two clocks (compute comes out small
or negative, the forward pass lands in the gap between steps).

How: at a step's begin the hook records a timing event on the current stream (vLLM
sets one stream per worker thread, vllm/utils/torch_utils.py `current_stream`,
through torch.cuda.set_stream, so torch.cuda.current_stream() is that stream), and
another at the step's real end (end of sample_tokens when it follows execute_model,
else end of execute_model). The begin event completes when the GPU has finished
everything enqueued before it (the previous step) and reaches this step's first work;
the end event when it has run the step's last. Both are read later with
`Event.query()` (never a wait) at a later step's begin, and at stop/records time
(between steps, where waiting is allowed), and placed on the host clock through the
hook's clock anchor (timing.ClockAnchor): gpu_start_ns, gpu_end_ns of the step row.

On that clock, per rank, for a decode step i and the step i-1 before it (analysis/split.py decode_pairs):
    GPU period = gpu_end(i) - gpu_end(i-1)          (the engine's time per token)
    GPU span   = gpu_end(i) - gpu_start(i)          (busy with step i, launch gaps inside included)
    GPU gap    = gpu_start(i) - gpu_end(i-1)        (GPU idle before step i)
and collective transfer and wait (CUDA events too) lie inside the span, so
compute = span - transfer - wait and the four terms add up to the period exactly.

Units: ns for timestamps; Event.elapsed_time is in ms.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

FillStep = Callable[[int, int, int], None]  # (step row, gpu_start_ns, gpu_end_ns)


class StepClock:
    """Begin/end timing events per engine step, from a bounded pool, read without blocking.

    `new_event` makes a timing event (default torch.cuda.Event(enable_timing=True)); tests pass stand-ins."""

    def __init__(self, new_event: Callable[[], Any] | None = None, pool_size: int = 512) -> None:
        self._new_event = new_event
        self.pool_size = pool_size
        self._free: list[Any] = []
        self._made = 0
        self._open: Any = None  # the begin event of the step in progress
        self._pending: deque[tuple[int, Any, Any]] = deque()  # (step row, begin, end), in stream order
        self.read = 0  # steps whose GPU span was read
        self.missed = 0  # steps left without a GPU span (pool exhausted, row dropped, no anchor)
        self.last_end: Any = None  # the newest end event recorded (is the stream idle?)

    def _take(self) -> Any:
        if self._free:
            return self._free.pop()
        if self._made >= self.pool_size:
            return None
        self._made += 1
        if self._new_event is None:
            import torch

            return torch.cuda.Event(enable_timing=True)
        return self._new_event()

    def begin(self) -> None:
        """At a step's begin (before vLLM enqueues anything of it)."""
        if self._open is not None:  # a step that never ended (an exception in vLLM): its event goes back
            self._free.append(self._open)
            self.missed += 1
        ev = self._take()
        if ev is None:
            self._open = None
            self.missed += 1
            return
        ev.record()
        self._open = ev

    def end(self, row: int) -> None:
        """At the step's real end; `row` is its step row (-1 when the row was dropped)."""
        b, self._open = self._open, None
        if b is None:
            return
        e = self._take() if row >= 0 else None
        if e is None:
            self._free.append(b)
            self.missed += 1
            return
        e.record()
        self.last_end = e
        self._pending.append((row, b, e))

    def discard_open(self) -> None:
        """A step with no row (nothing scheduled, or not armed): its begin event goes back unused."""
        if self._open is not None:
            self._free.append(self._open)
            self._open = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def is_pending(self, row: int) -> bool:
        """The step row's span is still to be read (its events are recorded, not yet done)."""
        return any(r == row for r, _, _ in self._pending)

    def poll(self, fill: FillStep, anchor: Any, block: bool = False) -> int:
        """Read finished steps in stream order; `fill(row, gpu_start_ns, gpu_end_ns)` places them on the host
        clock through `anchor` (a ClockAnchor with an event). `block` waits for each (stop/records time only)."""
        n = 0
        while self._pending:
            row, b, e = self._pending[0]
            if block:
                e.synchronize()
            elif not e.query():
                break
            self._pending.popleft()
            if anchor is not None and anchor.event is not None:
                fill(row, anchor.host_ns_of(b), anchor.host_ns_of(e))
                self.read += 1
                n += 1
            else:
                self.missed += 1
            self._free.extend((b, e))
        return n

    def clear(self) -> None:
        """Forget pending steps (a new recording): their events go back to the pool."""
        while self._pending:
            _, b, e = self._pending.popleft()
            self._free.extend((b, e))
        self.discard_open()
        self.read = self.missed = 0
        self.last_end = None

    def status(self) -> dict:
        return {"clock": "gpu", "steps_read": self.read, "steps_missed": self.missed, "pending": len(self._pending)}
