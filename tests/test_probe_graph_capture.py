"""The plain probe's graph capture order against FlashInfer's single-stream PCIe IPC workspace (issue 27
defect 6), on CPU with a stand-in for CUDA streams and graphs.

FlashInfer's PcieIpcAllReduceWorkspace is bound to one stream: the first launch binds it, a launch on any
other stream raises (_check_stream); vLLM's FlashInferPcieIpcAllReduce.capture() rebinds it, so the first
launch inside capture() binds it to the capture stream (vLLM's graph_capture runs warm-up and capture there).
The probe runs eager items first (the default stream), then graph items: a warm-up on a side stream before
capture() raised and crashed the rank. The same path runs on GPUs in tests/test_probe_gpu.py (2+ GPUs with
FlashInfer)."""

from __future__ import annotations

import contextlib
import types

import pytest

from probes import collectives


class _Stream:
    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Cuda:
    """torch.cuda's stream and graph calls that _graph makes, with a current stream."""

    def __init__(self) -> None:
        self.default = _Stream()
        self.current = self.default
        self.Stream = _Stream

    def current_stream(self):
        return self.current

    @contextlib.contextmanager
    def stream(self, s):
        prev, self.current = self.current, s
        try:
            yield
        finally:
            self.current = prev

    class CUDAGraph:
        pass

    def graph(self, g, stream=None):
        return self.stream(stream or _Stream())  # torch.cuda.graph captures on its own side stream by default


class _PcieIpc:
    """A backend with FlashInfer PCIe IPC's stream binding (see the module docstring)."""

    def __init__(self, cuda: _Cuda) -> None:
        self.cuda, self.bound, self.runs = cuda, None, 0

    def run(self, op, b):
        s = self.cuda.current
        if self.bound is None:
            self.bound = s
        elif s is not self.bound:
            raise RuntimeError("PcieIpcAllReduceWorkspace: called on a stream other than the one it is bound to")
        self.runs += 1
        return b

    @contextlib.contextmanager
    def capture(self):
        self.bound = None  # vLLM's capture(): rebinds at the next launch
        yield


def test_graph_items_after_eager_items_warm_up_and_capture_on_the_capture_stream(monkeypatch):
    cuda = _Cuda()
    monkeypatch.setattr(collectives, "torch", types.SimpleNamespace(cuda=cuda))  # this module's torch only
    be = _PcieIpc(cuda)
    be.run("all_reduce", "buf")  # an eager item: the workspace is bound to the default stream
    g, res = collectives._graph(be, "all_reduce", "buf", 3)
    assert res == "buf" and be.runs == 1 + 2 + 3 and be.bound is not cuda.default
    with pytest.raises(RuntimeError, match="other than the one"):  # the stand-in does enforce the binding
        be.run("all_reduce", "buf")
