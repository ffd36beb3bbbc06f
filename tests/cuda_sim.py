"""A CUDA stream, its GPU and CUDA graphs simulated on the CPU, with the semantics the hook depends on.

No CUDA on this machine: the hook's GPU paths run here against stand-ins with torch.cuda.Event's interface
(record / query / synchronize / elapsed_time / cuda_event) and torch.cuda.CUDAGraph's (raw_cuda_graph,
raw_cuda_graph_exec), and a driver stand-in for cudadrv.CudaDriver. The semantics modelled:

- one timeline in ms for host and GPU; the host moves only when the test says so (`Dev.host`);
- the GPU runs queued work in order, an item starting no earlier than it was enqueued and than the
  previous item ended; an event completes when the GPU reaches it;
- recording an event again (eagerly, or by launching a graph holding it) resets it when *enqueued*: it
  is not done until the GPU reaches the new record (CUDA: "Each launch of the graph will record event";
  torchcomms' graph watchdog sees events "reset by a queued cudaGraphLaunch"); elapsed_time on an event
  not done raises, as torch does (cudaErrorNotReady);
- cuGraphExecEventRecordNodeSetEvent changes the event a graph node records into for later launches only.

`Dev.strict` marks the serving thread's step path: a synchronize() then is logged in `Dev.violations`.
"""

from __future__ import annotations

import itertools
from collections import deque

_handles = itertools.count(0x1000, 0x10)


class Dev:
    def __init__(self) -> None:
        self.host_ms = 0.0
        self.gpu_ms = 0.0  # when the GPU is free
        self.queue: deque = deque()  # (enqueued at host ms, kind, payload)
        self.handles: dict[int, Ev] = {}
        self.strict = False
        self.violations: list[str] = []
        self.syncs = 0

    def enqueue(self, kind: str, payload) -> None:
        self.queue.append((self.host_ms, kind, payload))
        self.run()

    def kernel(self, ms: float) -> None:
        self.enqueue("k", ms)

    def run(self, unbounded: bool = False) -> None:
        """Let the GPU run what has started by now (everything, if `unbounded`)."""
        while self.queue:
            enq, kind, payload = self.queue[0]
            start = max(self.gpu_ms, enq)
            if start > self.host_ms and not unbounded:
                return
            self.queue.popleft()
            if kind == "k":
                self.gpu_ms = start + payload
            else:
                ev, gen = payload
                self.gpu_ms = start
                if ev.gen == gen:  # else re-recorded since: this record no longer counts
                    ev.done, ev.ms = True, start

    def host(self, ms: float) -> None:
        self.host_ms += ms
        self.run()

    def until(self, ev: Ev) -> None:
        """The host blocks until `ev` is done (a wait: the hook's at stop time, or vLLM's own back-pressure)."""
        while not ev.done and self.queue:
            self.host_ms = max(self.host_ms, self.gpu_ms, self.queue[0][0])
            self.run()
        if ev.ms is not None:
            self.host_ms = max(self.host_ms, ev.ms)


class Ev:
    """torch.cuda.Event(enable_timing=True) on the simulated stream."""

    def __init__(self, dev: Dev, side: bool = False) -> None:
        self.dev, self.side = dev, side
        self.done, self.ms, self.gen = True, None, 0
        self.cuda_event = next(_handles)
        dev.handles[self.cuda_event] = self

    def record(self, stream=None) -> None:
        self.gen += 1
        if stream is not None and getattr(stream, "side", False):  # an idle side stream: done at once
            self.done, self.ms = True, self.dev.host_ms
            return
        self.done, self.ms = False, None
        self.dev.enqueue("e", (self, self.gen))

    def query(self) -> bool:
        self.dev.run()
        return self.done

    def synchronize(self) -> None:
        self.dev.syncs += 1
        if self.dev.strict:
            self.dev.violations.append("Event.synchronize in the step path")
        self.dev.until(self)

    def elapsed_time(self, other: Ev) -> float:
        if not (self.done and other.done) or self.ms is None or other.ms is None:
            raise RuntimeError("CUDA error: device not ready (cudaErrorNotReady)")
        return other.ms - self.ms


class SideStream:
    side = True


class Graph:
    """A captured CUDA graph: `items` are ("k", ms) kernels and ("n", node) event-record nodes; `table` is the
    instantiated graph's node -> event binding, `template` the captured one."""

    def __init__(self, dev: Dev) -> None:
        self.dev, self.items, self.table, self.template = dev, [], {}, {}
        self._tpcomm_kept = True  # as patch_cuda_graphs leaves a graph it keeps
        self.launches = 0

    def node(self, ev: Ev) -> None:
        n = len(self.items)
        self.items.append(("n", n))
        self.table[n] = self.template[n] = ev

    def raw_cuda_graph(self) -> int:
        return id(self)

    def raw_cuda_graph_exec(self) -> int:
        return id(self) + 1

    def launch(self) -> None:
        self.launches += 1
        for kind, x in self.items:
            if kind == "k":
                self.dev.kernel(x)
            else:
                self.table[x].record()  # re-recorded when enqueued


class Driver:
    """cudadrv.CudaDriver on simulated graphs. `broken`: set_event returns success and changes nothing."""

    def __init__(self, graphs: dict[int, Graph], broken: bool = False) -> None:
        self.graphs, self.broken, self.calls = graphs, broken, 0

    def record_nodes(self, graph: int) -> dict[int, int]:
        g = self.graphs[graph]
        return {ev.cuda_event: n for n, ev in g.template.items()}

    def set_event(self, graph_exec: int, node: int, event: int) -> None:
        self.calls += 1
        if not self.broken:
            g = self.graphs[graph_exec - 1]
            g.table[node] = g.dev.handles[event]


def capture(hook, dev: Dev, group, compute_ms: float, coll_ms: list[float], graphs: dict) -> Graph:
    """A graph of `len(coll_ms)` collectives between compute kernels, captured the way the hook captures
    (timing.CudaEventTimer: slots of (meta, start event, end event)), then handed to on_capture_end."""
    from tpcomm.hook.core import Sized

    g = Graph(dev)
    graphs[id(g)] = g
    timer = hook.cuda
    timer.on_capture_begin()
    for k, ms in enumerate(coll_ms):
        g.items.append(("k", compute_ms))
        if timer.graph_timing:
            e0, e1 = Ev(dev), Ev(dev)
            g.node(e0)
            g.items.append(("k", ms))
            g.node(e1)
            timer._capturing.append(
                ((group, "all_reduce", Sized(1024, "bfloat16"), "nccl", "group_coordinator"), e0, e1)
            )
        else:
            g.items.append(("k", ms))
            timer.capture_untimed()
    timer.on_capture_end(g)
    return g
