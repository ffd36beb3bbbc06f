"""Sampled CUDA graph replays, read later without waiting on the GPU.

The timing events captured into a graph (timing.CudaEventTimer.graph_begin/graph_end)
are re-recorded by every launch of the graph, and a launch resets them when it is
*enqueued* (see cudadrv.py). Under vLLM's async scheduling the worker enqueues step
i+1 while the GPU still runs step i, so the next replay of a graph is enqueued before
the sampled one has run: its events can never be read once complete. Two ways out,
both without a wait on the serving thread:

- Rotation (GraphEvents.rotating): right after a sampled replay is enqueued, the
  graph's event-record nodes are pointed at another set of events
  (cuGraphExecEventRecordNodeSetEvent, 2 driver calls per captured collective). The
  sampled replay still records into the old set, and nothing re-records that set until
  it has been read: it is read with Event.query() at any later step's begin. A graph
  replayed several times in one sampled step (vLLM's EAGLE/MTP drafter loop) rotates
  after each replay, so each replay keeps its own set. Sets are made on demand: a graph
  needs one per sampled replay not read yet (the steps in flight times the graph's
  replays per sampled step, e.g. 8 steps queued ahead of a GPU-bound server with 1 in 1
  sampled, or a drafter's 4+ replays) plus the installed one, so the count follows the
  steps in flight; the cap (max_sets) is sized from the graph's collectives so that one
  graph holds at most EVENT_BUDGET timing events.
- Without rotation (no driver access, or a graph whose nodes were not found): a noted
  replay is readable only until the graph is enqueued again. It is read at a later
  step's begin if its events are done by then, or just before the graph's next replay
  is enqueued if they are done then; otherwise it is dropped and counted. On a server
  where the host runs ahead of the GPU (async scheduling, GPU-bound) that drops most
  samples, and status says so.

Each read is checked against the step's GPU span (gpuclock.py): the first collective
must start and the last end inside it, else the sample is dropped and counted
("outside its step"): what a rotation that did not take effect would look like.

Units: ns for timestamps, Event.elapsed_time in ms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

EVENT_BUDGET = 4096  # timing events one graph may hold over all its sets (2 per captured collective per set)
MIN_SETS = 16  # at least this many sets, however many collectives: 8 steps in flight x 2 replays per step
MAX_NOTES = 256  # sampled replays waiting to be read; more are dropped (counted), never queued without bound
SPAN_TOL_NS = 2_000  # event timer resolution (~0.5 us) and rounding, when checking a sample against its step

# (meta, t_start_ns, t_end_ns, step, call_idx) for one collective row
Emit = Callable[[Any, int, int, int, int], None]
# step -> (gpu_start_ns, gpu_end_ns) once read; None while it may still be read; False when it never will be
SpanOf = Callable[[int], Any]


class EventSet:
    """One (start, end) event pair per captured collective of a graph."""

    __slots__ = ("pairs", "busy")

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs
        self.busy = False  # holds a sampled replay not read yet


class GraphEvents:
    """A captured graph's timing events: the set its nodes record into now, and spare sets to rotate to."""

    def __init__(self, slots: list, nodes: list[tuple[int, int]] | None = None, why_fixed: str | None = None):
        self.metas = [m for m, _, _ in slots]
        self.installed = EventSet([(e0, e1) for _, e0, e1 in slots])
        self.sets = [self.installed]
        self.nodes = nodes  # per collective: (start node, end node) handles; None: no rotation
        self.why_fixed = why_fixed  # why this graph cannot rotate (stated in status)

    @property
    def rotating(self) -> bool:
        return self.nodes is not None

    def rotate(self, graph_exec: int, driver: Any, new_event: Callable[[], Any]) -> bool:
        """Point the graph's event-record nodes at a set that holds no unread sample; False when none is free
        (then the installed set keeps the sample and the next replay may overwrite it)."""
        target = next((s for s in self.sets if not s.busy and s is not self.installed), None)
        if target is None:
            if len(self.sets) >= max_sets(len(self.metas)):
                return False
            target = EventSet([(_fresh(new_event), _fresh(new_event)) for _ in self.metas])
            self.sets.append(target)
        try:
            for (n0, n1), (e0, e1) in zip(self.nodes, target.pairs):
                driver.set_event(graph_exec, n0, e0.cuda_event)
                driver.set_event(graph_exec, n1, e1.cuda_event)
        except Exception:
            # Half the nodes may point at the new set: put every node back on the installed one, or stop rotating.
            try:
                for (n0, n1), (e0, e1) in zip(self.nodes, self.installed.pairs):
                    driver.set_event(graph_exec, n0, e0.cuda_event)
                    driver.set_event(graph_exec, n1, e1.cuda_event)
            except Exception:
                self.nodes, self.why_fixed = None, "a driver call failed while rotating its events"
            raise
        self.installed = target
        return True


def max_sets(n_collectives: int) -> int:
    """Event sets one graph may have: EVENT_BUDGET events over its 2 per collective, at least MIN_SETS (a
    61-layer model's 122 all-reduces: 16 sets; a 2-collective graph: 1024)."""
    return max(MIN_SETS, EVENT_BUDGET // max(2 * n_collectives, 1))


def _fresh(new_event: Callable[[], Any]) -> Any:
    """A timing event whose CUDA event exists (torch creates it at the first record)."""
    ev = new_event()
    ev.record()
    return ev


def find_nodes(slots: list, record_nodes: dict[int, int]) -> list[tuple[int, int]] | None:
    """Each captured pair's (start, end) node from {event handle: node}; None if any is missing."""
    out = []
    for _, e0, e1 in slots:
        n0, n1 = record_nodes.get(int(e0.cuda_event or 0)), record_nodes.get(int(e1.cuda_event or 0))
        if n0 is None or n1 is None:
            return None
        out.append((n0, n1))
    return out


class Note:
    """A sampled replay waiting to be read."""

    __slots__ = ("graph", "evset", "step", "first", "t_replay_ns", "rotated")

    def __init__(self, graph, evset, step, first, t_replay_ns, rotated):
        self.graph, self.evset, self.step, self.first = graph, evset, step, first
        self.t_replay_ns, self.rotated = t_replay_ns, rotated


class GraphSampler:
    """The sampled replays of one worker: noted after their launch, read at later step begins."""

    def __init__(self) -> None:
        self.notes: list[Note] = []
        self.read = 0  # sampled replays read into rows
        self.rows = 0
        self.dropped: Counter = Counter()  # reason -> sampled replays dropped
        self.rotations = 0

    def clear(self) -> None:
        for n in self.notes:
            n.evset.busy = False
        self.notes = []
        self.read = self.rows = self.rotations = 0
        self.dropped = Counter()

    def note(
        self,
        graph: Any,
        step: int,
        first: int,
        t_replay_ns: int,
        rotate: Callable[[GraphEvents], bool] | None,
        on_drop: Callable[[Note], None] | None = None,
    ) -> bool:
        """After a sampled replay of `graph` was enqueued; False when it cannot be kept (counted as dropped)."""
        ge: GraphEvents = graph._tpcomm_events
        if len(self.notes) >= MAX_NOTES:
            self.dropped["too many unread samples"] += 1
            return False
        evset = ge.installed
        if evset.busy:  # a note of this graph still holds the installed set: the new replay re-recorded it
            for n in self.notes:
                if n.evset is evset:
                    self._drop(n, "re-recorded by a later replay before it was read", on_drop)
            self.notes = [n for n in self.notes if n.evset is not evset]
        evset.busy = True
        rotated = False
        if ge.rotating and rotate is not None:
            try:
                rotated = rotate(ge)
            except Exception:  # noqa: BLE001 - the sample stays in the installed set, read the fallback way
                rotated = False
            self.rotations += rotated
        self.notes.append(Note(graph, evset, step, first, t_replay_ns, rotated))
        return True

    def _drop(self, n: Note, why: str, on_drop: Callable[[Note], None] | None = None) -> None:
        n.evset.busy = False
        self.dropped[why] += 1
        if on_drop is not None:
            on_drop(n)

    def before_replay(self, graph: Any, emit: Emit, anchor: Any, on_drop: Callable[[Note], None]) -> None:
        """Before `graph` is enqueued again: a noted replay still in its installed set is read now if the GPU has
        run it (Event.query(), no wait), else dropped: the new launch would reset its events."""
        keep = []
        for n in self.notes:
            if n.graph is not graph or n.evset is not graph._tpcomm_events.installed:
                keep.append(n)
            elif n.evset.pairs[-1][1].query():
                self._read(n, emit, anchor, None, on_drop)
            else:
                self._drop(n, "re-recorded by a later replay before it was read", on_drop)
        self.notes = keep

    def poll(
        self, emit: Emit, anchor: Any, span_of: SpanOf, on_drop: Callable[[Note], None], block: bool = False
    ) -> int:
        """Read the notes whose events are done (Event.query(); `block` waits instead: stop/records time only).
        A note waits for its step's GPU span to be read, to be checked against it."""
        keep, n_read = [], 0
        for n in self.notes:
            last = n.evset.pairs[-1][1]
            if block:
                last.synchronize()
            elif not last.query():
                keep.append(n)
                continue
            span = span_of(n.step)
            if span is None and not block:
                keep.append(n)
                continue
            if self._read(n, emit, anchor, span or None, on_drop):
                n_read += 1
        self.notes = keep
        return n_read

    def _read(self, n: Note, emit: Emit, anchor: Any, span, on_drop=None) -> bool:
        pairs = n.evset.pairs
        anchored = anchor is not None and anchor.event is not None
        if span and anchored:
            first, last = anchor.host_ns_of(pairs[0][0]), anchor.host_ns_of(pairs[-1][1])
            if first < span[0] - SPAN_TOL_NS or last > span[1] + SPAN_TOL_NS:
                self._drop(n, "outside its step's GPU span", on_drop)
                return False
        base = pairs[0][0]
        rows = []
        try:
            for k, (meta, (e0, e1)) in enumerate(zip(n.graph._tpcomm_events.metas, pairs)):
                # Enqueue bound: the replay call's host time plus the event's offset in the graph (no queue lag).
                t0 = n.t_replay_ns + int(base.elapsed_time(e0) * 1e6)
                if anchored:
                    t0 = max(t0, anchor.host_ns_of(e0))
                rows.append((meta, t0, t0 + int(e0.elapsed_time(e1) * 1e6), n.step, n.first + k))
        except RuntimeError:  # an event not done after all (cudaErrorNotReady): this sample is not readable
            self._drop(n, "its events could not be read", on_drop)
            return False
        n.evset.busy = False
        for r in rows:
            emit(*r)
        self.read += 1
        self.rows += len(rows)
        return True

    def status(self) -> dict:
        return {
            "samples_read": self.read,
            "samples_dropped": int(sum(self.dropped.values())),
            "dropped_why": dict(self.dropped),
            "samples_pending": len(self.notes),
            "rotations": self.rotations,
            "rows": self.rows,
        }
