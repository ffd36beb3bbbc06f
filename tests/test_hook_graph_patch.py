"""The CUDAGraph patch against torch's real binding semantics, on CPU (issue 27, defect 1).

torch binds the C++ graph as `_CUDAGraph` with pybind11 (torch/csrc/cuda/Graph.cpp, torch 2.13):

    shared_ptr_class_<::at::cuda::CUDAGraph>(torch_C_m, "_CUDAGraph")
        .def(py::init<bool>(), py::arg("keep_graph") = false)

so `keep_graph` reaches the C++ object through `__init__`; pybind11's `__new__` (pybind11_object_new)
allocates and ignores its arguments. torch/cuda/graphs.py subclasses it and forwards `keep_graph` in
`__new__` (`super().__new__(cls, keep_graph)`), which therefore decides nothing. In
aten/src/ATen/cuda/CUDAGraph.cpp, capture_end() instantiates and destroys the graph when
!keep_graph_, and instantiate() on an instantiated graph fails `TORCH_CHECK(keep_graph_,
"instantiate() is intended to be called by the user only when keep_graph=true")`.

`_PybindGraph` below behaves as that binding does (only what the patch touches), and `CUDAGraph`
is torch/cuda/graphs.py's subclass as written there. The real binding runs in
tests/test_hook_timing_gpu.py (marked gpu) and in scripts/gpu-check.sh.
"""

from __future__ import annotations

import pytest

from tpcomm.hook import failsafe, timing


class _PybindGraph:
    """torch._C._CUDAGraph's constructor and keep_graph semantics (see the module docstring)."""

    def __new__(cls, *args, **kwargs):  # pybind11_object_new: allocation only, arguments ignored
        return object.__new__(cls)

    def __init__(self, keep_graph: bool = False) -> None:  # py::init<bool>(), py::arg("keep_graph") = false
        self.keep_graph_ = bool(keep_graph)
        self.capture_ended_ = self.has_graph_ = self.has_graph_exec_ = False
        self.replays = 0

    def capture_begin(self, pool=None, capture_error_mode="global") -> None:
        pass

    def capture_end(self) -> None:
        self.capture_ended_ = self.has_graph_ = True
        if not self.keep_graph_:
            self.instantiate()
            self.has_graph_ = False  # cudaGraphDestroy(graph_)

    def instantiate(self) -> None:
        if not self.capture_ended_:
            raise RuntimeError("capture_end() must have been called before calling instantiate")
        if self.has_graph_exec_ and not self.keep_graph_:
            raise RuntimeError("instantiate() is intended to be called by the user only when keep_graph=true")
        self.has_graph_exec_ = True

    def replay(self) -> None:
        if not self.has_graph_exec_:
            self.instantiate()
        self.replays += 1

    def raw_cuda_graph(self) -> int:
        if not (self.keep_graph_ and self.has_graph_):
            raise RuntimeError(
                "You cannot access the raw cudaGraph_t instance unless CUDAGraph was initialized with keep_graph=true"
            )
        return 0x1234


def _torch_like_class() -> type:
    class CUDAGraph(_PybindGraph):  # torch/cuda/graphs.py, torch 2.13
        def __new__(cls, keep_graph: bool = False):
            instance = super().__new__(cls, keep_graph)
            instance._tracker = None
            return instance

        def capture_begin(self, pool=None, capture_error_mode="global") -> None:
            super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

        def capture_end(self) -> None:
            super().capture_end()

        def instantiate(self) -> None:
            super().instantiate()

        def replay(self) -> None:
            super().replay()

    return CUDAGraph


def _timer(graph_timing: bool = True) -> timing.CudaEventTimer:
    t = timing.CudaEventTimer(graph_timing=graph_timing)
    t.driver = object() if graph_timing else None  # rotation possible: the hook wants the raw graph kept
    return t


@pytest.fixture(autouse=True)
def _clean_failsafe(monkeypatch):
    monkeypatch.delenv(failsafe.FAULT_ENV, raising=False)
    failsafe.reload_faults()
    failsafe._off.clear()
    yield
    failsafe._off.clear()
    monkeypatch.delenv(failsafe.FAULT_ENV, raising=False)
    failsafe.reload_faults()


def test_installed_torch_takes_keep_graph_in_the_bindings_init():
    """The precondition of the patch, on the installed torch: graphs.py's CUDAGraph defines __new__ (forwarding
    keep_graph) and no __init__ of its own, so the binding's __init__ is what receives keep_graph."""
    import torch.cuda.graphs as g

    assert "__new__" in g.CUDAGraph.__dict__ and "__init__" not in g.CUDAGraph.__dict__
    assert g.CUDAGraph.__mro__[1].__name__ == "_CUDAGraph"


def test_graph_timing_keeps_the_raw_graph_and_capture_does_not_raise():
    """vLLM's `torch.cuda.CUDAGraph()` (cuda_graph.py) with graph timing on: the graph is kept (its cudaGraph_t
    readable for rotation), instantiated once at capture end, and replays. Before the fix keep_graph stayed
    False and the hook's extra instantiate() raised at every capture."""
    cls = _torch_like_class()
    replays = []
    assert timing.patch_graph_class(cls, _timer(), lambda g, t: replays.append(g))
    g = cls()
    assert g.keep_graph_ and g._tpcomm_kept
    g.capture_begin()
    g.capture_end()
    assert g.has_graph_exec_ and g.raw_cuda_graph() == 0x1234
    g.replay()
    assert g.replays == 1 and failsafe.disabled() == {}
    timing.unpatch_cuda_graphs(cls)
    assert "__init__" not in cls.__dict__ and not cls()._tpcomm_patched and not cls().keep_graph_


def test_a_user_kept_graph_is_left_for_the_user_to_instantiate():
    cls = _torch_like_class()
    timing.patch_graph_class(cls, _timer(), lambda g, t: None)
    g = cls(keep_graph=True)
    g.capture_begin()
    g.capture_end()
    assert g._tpcomm_user_kept and not g.has_graph_exec_
    g.instantiate()
    g.replay()
    assert g.replays == 1


def test_graph_timing_off_changes_nothing_in_the_constructor():
    cls = _torch_like_class()
    timing.patch_graph_class(cls, _timer(graph_timing=False), lambda g, t: None)
    assert "__init__" not in cls.__dict__
    g = cls()
    g.capture_begin()
    g.capture_end()
    assert not g.keep_graph_ and g.has_graph_exec_


def test_a_fault_in_the_hooks_capture_part_switches_graph_timing_off_and_the_capture_completes(monkeypatch):
    monkeypatch.setenv(failsafe.FAULT_ENV, "graph_capture")
    failsafe.reload_faults()
    cls = _torch_like_class()
    t = _timer()
    timing.patch_graph_class(cls, t, lambda g, t: None)
    g = cls()
    g.capture_begin()
    g.capture_end()
    g.replay()
    assert g.replays == 1 and failsafe.off("graph_capture")
    assert "injected fault at graph_capture" in failsafe.disabled()["graph_capture"]


def _hook_with_graph_timing():
    from tpcomm.hook.core import Hook

    h = Hook()
    h.gpu, h.cuda = True, _timer()
    return h


def test_a_failing_start_time_self_test_switches_graph_timing_off(monkeypatch):
    """The start-time self-test (tpcomm/hook/selftest.py) in a worker whose graph path fails (here: no CUDA in
    this torch; the fault switch likewise): graph timing off for the process, one reason in failsafe and in
    status, nothing raised. On a GPU it passes (tests/test_hook_timing_gpu.py)."""
    from tpcomm.hook.selftest import graph_selftest

    h = _hook_with_graph_timing()
    why = graph_selftest(h)
    assert why.startswith("start-time self-test failed: ") and not h.cuda.graph_timing
    assert failsafe.disabled()["graph_capture"] == why and h.cuda.status()["graph_timing_off_why"] == why
    assert h.cuda.graphs_with_slots == 0
    failsafe._off.clear()
    monkeypatch.setenv(failsafe.FAULT_ENV, "graph_selftest")
    failsafe.reload_faults()
    h = _hook_with_graph_timing()
    assert "injected fault at graph_selftest" in graph_selftest(h) and not h.cuda.graph_timing
    assert graph_selftest(h) is None  # graph timing now off: nothing to test


def test_attribute_names_why_graph_timing_went_off():
    """What attribute's page one and summary list (analysis/coverage.py) when the workers switched graph timing
    off themselves: the reason, not "off when the server started"."""
    from tpcomm.analysis.coverage import not_timed

    why = "start-time self-test failed: RuntimeError: a timing event was not done after a synchronize"
    gt = {"applies": True, "enabled": False, "graph_timing_off_why": why}
    assert not_timed({"per_rank": [{"graph_timing": gt}]}) == [
        f"collectives inside CUDA graphs: graph timing off: {why}"
    ]
    gt = {"applies": True, "enabled": False, "graph_timing_off_why": None}
    assert "off when the server started" in not_timed({"per_rank": [{"graph_timing": gt}]})[0]
