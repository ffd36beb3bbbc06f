"""The four CUDA driver calls the hook needs to give a captured graph fresh timing events.

A CUDA graph's event-record nodes re-record their events at every launch, and a launch
resets them the moment it is enqueued (cudaGraphLaunch "records" at enqueue, as
cudaEventRecord does: torchcomms' graph watchdog, comms/torchcomms/ncclx/docs/
graph_timeout_design.md, handles "events reset by a queued cudaGraphLaunch"). Under
async scheduling the next replay of a graph is enqueued before the GPU has run the
previous one, so a replay's events can never be read once it is done. The driver can
swap the event of an event-record node in an *instantiated* graph:
cuGraphExecEventRecordNodeSetEvent, which "only affect[s] future launches of hGraphExec.
Already enqueued or running launches of hGraphExec are not affected". After a sampled
replay the hook points the graph's nodes at another set of events; the sampled replay
keeps recording into the old set, which nothing re-records until it has been read.

Handles: torch's CUDAGraph(keep_graph=True) keeps the cudaGraph_t (raw_cuda_graph())
that the node handles belong to, and raw_cuda_graph_exec() gives the cudaGraphExec_t;
runtime and driver handles are the same objects (CUgraph == cudaGraph_t, CUevent ==
cudaEvent_t). libcuda.so.1 ships with every NVIDIA driver; nothing is imported for it.
"""

from __future__ import annotations

import ctypes

# CUgraphNodeType (cuda.h): KERNEL 0, MEMCPY 1, MEMSET 2, HOST 3, GRAPH 4, EMPTY 5, WAIT_EVENT 6, EVENT_RECORD 7
CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7


class DriverError(RuntimeError):
    pass


class CudaDriver:
    """ctypes bindings of cuGraphGetNodes, cuGraphNodeGetType, cuGraphEventRecordNodeGetEvent and
    cuGraphExecEventRecordNodeSetEvent. Raises DriverError when libcuda cannot be loaded."""

    def __init__(self, lib: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(lib)
        except OSError as e:
            raise DriverError(f"{lib} not loadable ({e})") from None
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self._get_nodes = self._fn("cuGraphGetNodes", [vp, ctypes.POINTER(vp), ctypes.POINTER(sz)])
        self._node_type = self._fn("cuGraphNodeGetType", [vp, ctypes.POINTER(ctypes.c_int)])
        self._get_event = self._fn("cuGraphEventRecordNodeGetEvent", [vp, ctypes.POINTER(vp)])
        self._set_event = self._fn("cuGraphExecEventRecordNodeSetEvent", [vp, vp, vp])

    def _fn(self, name: str, argtypes: list):
        try:
            f = getattr(self._lib, name)
        except AttributeError:
            raise DriverError(f"this driver has no {name}") from None
        f.argtypes, f.restype = argtypes, ctypes.c_int
        return f

    def record_nodes(self, graph: int) -> dict[int, int]:
        """{event handle: node handle} of the event-record nodes at the top level of cudaGraph_t `graph`."""
        n = ctypes.c_size_t(0)
        self._check(self._get_nodes(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        nodes = (ctypes.c_void_p * max(n.value, 1))()
        self._check(self._get_nodes(graph, nodes, ctypes.byref(n)), "cuGraphGetNodes")
        out: dict[int, int] = {}
        kind, ev = ctypes.c_int(0), ctypes.c_void_p(0)
        for i in range(n.value):
            if self._node_type(nodes[i], ctypes.byref(kind)) != 0 or kind.value != CU_GRAPH_NODE_TYPE_EVENT_RECORD:
                continue
            if self._get_event(nodes[i], ctypes.byref(ev)) == 0 and ev.value:
                out[int(ev.value)] = int(nodes[i])
        return out

    def set_event(self, graph_exec: int, node: int, event: int) -> None:
        self._check(self._set_event(graph_exec, node, event), "cuGraphExecEventRecordNodeSetEvent")

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != 0:
            raise DriverError(f"{what} returned CUresult {code}")
