"""FlashInfer's fused all-reduce + RMSNorm (hook/fused.py): the names the patch relies on exist in the
installed vLLM, and the install path times a stand-in for `flashinfer.comm.allreduce_fusion` on a real
vLLM TP group (world size 1, gloo) with the host clock, rows carrying the fused path."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpcomm.hook import fused


def _source(module: str) -> ast.Module:
    return ast.parse(Path(importlib.util.find_spec(module).origin).read_text())


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _attr_call(call: ast.Call, obj: str, attr: str) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == attr and isinstance(f.value, ast.Name) and f.value.id == obj


def test_patch_targets_exist_in_the_installed_vllm():
    """A vLLM that renames the op, its implementation or the FlashInfer call it makes fails here."""
    tree = _source(fused.FUSION_MODULE)
    impl = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fused.FUSED_IMPL)
    # The implementation looks the FlashInfer entry point up at call time on the module global.
    assert any(_attr_call(c, "flashinfer_comm", fused.TARGET_ATTR) for c in _calls(impl))
    reg = [c for c in _calls(tree) if getattr(c.func, "id", None) == "direct_register_custom_op"]
    kw = [{k.arg: k.value for k in c.keywords} for c in reg]
    assert any(
        getattr(k.get("op_name"), "value", None) == fused.FUSED_OP
        and getattr(k.get("op_func"), "id", None) == fused.FUSED_IMPL
        for k in kw
    )
    assert any(
        isinstance(n, (ast.Assign, ast.AnnAssign))
        and getattr(n.targets[0] if isinstance(n, ast.Assign) else n.target, "id", None) == "flashinfer_comm"
        for n in tree.body
    )
    # vLLM's standalone FlashInfer all-reduce calls the same function (nested under GroupCoordinator).
    fi = _source("vllm.distributed.device_communicators.flashinfer_all_reduce")
    assert any(_attr_call(c, "flashinfer_comm", fused.TARGET_ATTR) for c in _calls(fi))
    # What status reads, and the switch that turns the fusion on.
    from vllm.config.compilation import PassConfig
    from vllm.config.vllm import enable_allreduce_rms_fusion  # noqa: F401

    assert {"fuse_allreduce_rms", "fi_allreduce_fusion_max_size_mb"} <= set(PassConfig.__dataclass_fields__)


def test_tpcomm_copy_of_the_vllm_tables_matches_the_installed_vllm():
    from vllm.distributed.device_communicators.all_reduce_utils import (
        CUSTOM_ALL_REDUCE_MAX_SIZES,
        FI_MNNVL_ALLREDUCE_MAX_SIZE_MB,
        SYMM_MEM_ALL_REDUCE_MAX_SIZES,
    )

    from tpcomm.topo.rules import fi_fusion_sizes
    from tpcomm.topo.vllm_tables import TABLES

    sizes, where = fi_fusion_sizes()
    assert where in ("import", "source")  # read from the installed vLLM, not the copy
    assert sizes == TABLES["fi_fusion_max_size_mb"] and sizes[90][8] == 0.5
    assert CUSTOM_ALL_REDUCE_MAX_SIZES == TABLES["custom_ar_max_sizes"]
    assert SYMM_MEM_ALL_REDUCE_MAX_SIZES == TABLES["symm_mem_max_sizes"]
    assert FI_MNNVL_ALLREDUCE_MAX_SIZE_MB == TABLES["fi_mnnvl_max_size_mb"]


_STAND_IN = r"""
import json, types
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel, get_tp_group
from tpcomm.hook import fused
from tpcomm.hook.core import HOOK

with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:%d",
                                 local_rank=0, backend="gloo")
    initialize_model_parallel(1, 1)

class AllReduceFusionPattern:
    kAllReduce, kARResidualRMSNorm, kARResidualRMSNormFP8Quant, kARResidualRMSNormFP4Quant = 0, 1, 2, 3

def allreduce_fusion(input, workspace, pattern, launch_with_pdl, output, residual_out, norm_out, quant_out,
                     scale_out, residual_in, rms_gamma, rms_eps, **kw):
    # what FlashInfer's kernel computes at world size 1: residual add, RMSNorm, in place
    s = input + residual_in
    residual_out.copy_(s)
    norm_out.copy_(s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + rms_eps) * rms_gamma)

comm = types.ModuleType("flashinfer.comm")  # stand-in for the module vLLM's fused op calls into
comm.AllReduceFusionPattern, comm.allreduce_fusion = AllReduceFusionPattern, allreduce_fusion
orig = comm.allreduce_fusion

def call(fn, x, r, workspace=None):
    n = torch.empty_like(x)
    fn(input=x, workspace=workspace, pattern=AllReduceFusionPattern.kARResidualRMSNorm, launch_with_pdl=True,
       output=None, residual_out=r, norm_out=n, quant_out=None, scale_out=None, residual_in=r,
       rms_gamma=torch.ones(x.shape[-1]), rms_eps=1e-6, use_oneshot=True)
    return n, r

torch.manual_seed(0)
x, r = torch.randn(3, 64), torch.randn(3, 64)
want = call(orig, x.clone(), r.clone())
ok = fused.install(comm)
HOOK.start()
HOOK.step_begin(types.SimpleNamespace(num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1, scheduled_new_reqs=[]))
got = call(comm.allreduce_fusion, x.clone(), r.clone(), types.SimpleNamespace(backend="mnnvl"))
# inside a timed GroupCoordinator collective (vLLM's standalone FlashInfer all-reduce): one row, not two
g = get_tp_group()
HOOK.timed(g, "all_reduce", x, lambda t: call(comm.allreduce_fusion, t.clone(), r.clone())[0], x)
cols = HOOK.rec.columns(0)["collectives"]
worker = types.SimpleNamespace(vllm_config=VllmConfig())
print(json.dumps({
    "installed": ok,
    "same": all(torch.equal(a, b) for a, b in zip(want, got)),
    "wrapped_original": comm.allreduce_fusion._tpcomm_original is orig,
    "rows": [{k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in cols.items()} for i in range(len(cols["op"]))],
    "nbytes": x.nbytes,
    "status": fused.status(worker),
    "bad_install": fused.install(types.ModuleType("no_flashinfer_here")),
    "bad_error": fused.STATE["error"],
    "hook_enabled": HOOK.disabled_reason is None,
}))
"""


def test_install_times_a_stand_in_fused_call_on_a_real_tp_group():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-c", _STAND_IN % port], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["same"] and out["wrapped_original"]
    rows = out["rows"]
    # backend: the FlashInfer workspace's (vLLM reads workspace.backend), "trtllm" when it does not say; the
    # GroupCoordinator row of the standalone FlashInfer all-reduce gets it too (not the group's "gloo")
    assert [(x["path"], x["op"], x["group"], x["timing"], x["backend"]) for x in rows] == [
        ("flashinfer_fused_ar_rmsnorm", "all_reduce", "tp", "host-sync", "flashinfer_mnnvl"),
        ("group_coordinator", "all_reduce", "tp", "host-sync", "flashinfer_trtllm"),
    ]
    assert rows[0]["bytes"] == out["nbytes"] and rows[0]["step"] == 0 and rows[0]["t_end_ns"] >= rows[0]["t_start_ns"]
    st = out["status"]
    assert st["fused_timed"] and st["fused_calls"] == 1  # the nested call is GroupCoordinator's, not counted
    assert st["allreduce_paths"] == ["group_coordinator", "flashinfer_fused_ar_rmsnorm"]
    assert st["fusion_pass_configured"] is False and st["fusion_pass_flag"] is False  # a CPU VllmConfig: off
    assert st["fusion_seen_running"] and st["fused_backends"] == ["flashinfer_mnnvl"]
    # graph timing is off by default (TPCOMM_GRAPH_TIMING): no events around the fused op in graphs, and status says so
    assert not st["fused_graph_events"] and "TPCOMM_GRAPH_TIMING" in st["fused_graph_note"]
    assert st["batch_invariant"] is False
    # the paths that bypass the hook are named, with whether this worker has them loaded
    detail = {d["module"]: d for d in st["not_covered_detail"]}
    assert "vllm/model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py" in detail
    assert detail["vllm/models/common/ops/sequence_parallel.py"]["loaded_in_worker"] is False
    assert len(st["not_covered"]) == len(fused.UNCOVERED)
    # A module without the function: install says no, the hook stays enabled, status says why.
    assert out["bad_install"] is False and out["hook_enabled"] and "AttributeError" in out["bad_error"]


def test_records_without_the_path_column_still_load(tmp_path):
    """Records from a tpcomm before `path` existed pass the contract; a wrong kind in `path` does not."""
    import pandas as pd

    from tpcomm.errors import InputError
    from tpcomm.rundir import contract as C

    row = {c.name: ({"i": 1, "f": 1.0, "s": "x", "b": True}[c.kind],) for c in C.HOOK_COLLECTIVES.columns}
    C.check_table(C.HOOK_COLLECTIVES, pd.DataFrame(row))
    C.check_table(C.HOOK_COLLECTIVES, pd.DataFrame({**row, "path": ["flashinfer_fused_ar_rmsnorm"]}))
    with pytest.raises(InputError):
        C.check_table(C.HOOK_COLLECTIVES, pd.DataFrame({**row, "path": [1.5]}))


def _impl_from_installed_source(ns: dict):
    """vLLM's own `call_trtllm_fused_allreduce_norm` (and the helper and tables it uses), compiled from the
    installed file into namespace `ns`: its module imports only on CUDA builds with FlashInfer."""
    tree = _source(fused.FUSION_MODULE)
    want = {fused.FUSED_IMPL, "_select_flashinfer_allreduce_use_oneshot"}
    consts = {"PDL_ADVANCE_LAUNCH_TOKENS", "MiB", "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB"}
    body = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in want]
    body += [
        n
        for n in tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        and getattr(n.targets[0] if isinstance(n, ast.Assign) else n.target, "id", None) in consts
    ]
    assert len(body) == len(want) + len(consts)
    mod = ast.Module(body=body, type_ignores=[])
    exec(compile(mod, importlib.util.find_spec(fused.FUSION_MODULE).origin, "exec"), ns)
    return ns[fused.FUSED_IMPL]


def _drive_real_impl(impl, set_global, device: str) -> tuple[list, dict]:
    """Call vLLM's fused-op implementation with the module globals it needs stubbed (FlashInfer's module,
    the workspace, the TP group) over a recording `allreduce_fusion`, with tpcomm's wrapper installed on
    that module; a fresh Hook, armed. Returns the recorded calls and the rows."""
    import types

    import torch

    from tpcomm.hook import core

    calls: list = []

    class Pattern:
        kAllReduce, kARResidualRMSNorm, kARResidualRMSNormFP8Quant, kARResidualRMSNormFP4Quant = 0, 1, 2, 3

    comm = types.ModuleType("flashinfer.comm")
    comm.AllReduceFusionPattern = Pattern
    comm.QuantizationSFLayout = types.SimpleNamespace(SWIZZLED_128x4=1)
    comm.allreduce_fusion = lambda **kw: calls.append(kw)
    ws = types.SimpleNamespace(backend="mnnvl")
    dev = torch.device(device)

    class Group:
        unique_name, rank_in_group, world_size = "tp:0", 0, 2
        device = dev
        cpu_group = object()
        _tpcomm_backends = {"all_reduce": "nccl"}

    for name, value in {
        "flashinfer_comm": comm,
        "ar_fusion_patterns": Pattern,
        "get_fi_ar_workspace": lambda **kw: ws,
        "get_fi_ar_quant_workspace": lambda **kw: ws,
        "get_tensor_model_parallel_rank": lambda: 0,
        "get_tp_group": lambda: Group(),
    }.items():
        set_global(name, value)
    assert fused.install(comm, group_fn=Group)
    try:
        x = torch.randn(4, 64, device=device, dtype=torch.bfloat16)
        r, gamma = torch.randn_like(x), torch.ones(64, device=device, dtype=torch.bfloat16)
        before = fused.STATE["calls"]
        core.HOOK.start()
        core.HOOK.step_begin(
            types.SimpleNamespace(num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1, scheduled_new_reqs=[])
        )
        impl(x, r, gamma, 1e-6, 2, True, True, 64, Pattern.kARResidualRMSNorm, norm_out=torch.empty_like(x))
        core.HOOK.stop()
        assert fused.STATE["calls"] == before + 1  # the wrapper was reached and counted
        assert calls and calls[0]["input"] is x and calls[0]["workspace"] is ws and calls[0]["launch_with_pdl"]
        cols = core.HOOK.rec.columns(0)["collectives"]
        return calls, {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in cols.items()}
    finally:
        fused.uninstall(comm)


@pytest.fixture
def fresh_hook(monkeypatch):
    from tpcomm.hook import core

    h = core.Hook()
    monkeypatch.setattr(core, "HOOK", h)
    monkeypatch.setattr(fused, "HOOK", h)
    monkeypatch.setattr(fused, "STATE", {**fused.STATE, "paths": [], "backends": []})
    return h


def test_real_fused_op_implementation_reaches_the_wrapper(fresh_hook):
    """vLLM's call_trtllm_fused_allreduce_norm, as installed, looks `flashinfer_comm.allreduce_fusion` up at
    call time: with tpcomm's wrapper on that module, the real implementation goes through it (one counted
    call, one row with the fused path and the workspace's backend) and the original still runs."""
    ns: dict = {"torch": __import__("torch")}
    from vllm.platforms import current_platform

    ns["current_platform"] = current_platform
    impl = _impl_from_installed_source(ns)
    calls, cols = _drive_real_impl(impl, ns.__setitem__, "cpu")
    assert len(calls) == 1
    assert cols["path"] == ["flashinfer_fused_ar_rmsnorm"] and cols["backend"] == ["flashinfer_mnnvl"]
    assert cols["bytes"] == [4 * 64 * 2]


def test_fused_graph_events_switch_leaves_captured_calls_untimed(fresh_hook, monkeypatch):
    """Graph timing off (the default) or TPCOMM_FUSED_GRAPH_EVENTS=0: a call being captured into a CUDA graph runs the original directly (no
    event nodes next to the PDL kernel) and is counted as untimed; eager calls still go through the hook.
    The capture state is a stand-in here (no CUDA); the GPU test captures a real graph."""
    import types

    import torch

    seen = []
    orig = lambda **kw: seen.append("orig")  # noqa: E731
    timed = []
    monkeypatch.setattr(
        fresh_hook, "timed_path", lambda path, g, op, probe, fn, *a, **k: timed.append(path) or fn(*a, **k)
    )
    probe = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    for events, want_timed in ((False, []), (True, [fused.PATH])):
        fused.STATE["untimed_graph_calls"] = 0
        timed.clear()
        wrapper = fused._wrapped(orig, {}, lambda: object(), graph_events=events)
        wrapper(input=probe, workspace=None, pattern=None)
        assert timed == want_timed and fused.STATE["untimed_graph_calls"] == (0 if events else 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    timed.clear()
    fused._wrapped(orig, {}, lambda: object(), graph_events=False)(input=probe, workspace=None, pattern=None)
    assert timed == [fused.PATH] and seen == ["orig"] * 3
    monkeypatch.setenv("TPCOMM_GRAPH_TIMING", "1")  # one switch for all graph timing: on, the fused op is timed
    assert fused.graph_events_on()
    monkeypatch.setenv("TPCOMM_FUSED_GRAPH_EVENTS", "0")  # ... unless left out for this op alone
    assert not fused.graph_events_on()
    monkeypatch.delenv("TPCOMM_FUSED_GRAPH_EVENTS")
    monkeypatch.delenv("TPCOMM_GRAPH_TIMING")
    assert not fused.graph_events_on()  # the default: off
    fused.STATE["graph_events"] = False
    st = fused.status(None)
    assert not st["fused_graph_events"] and "not timed" in st["fused_graph_note"]


def test_status_says_configured_only_when_the_passes_run():
    """--enforce-eager sets compilation mode NONE: no pass runs, whatever pass_config says."""
    import types

    from vllm.config.compilation import CompilationConfig, CompilationMode, PassConfig

    def st(mode, flag):
        cc = CompilationConfig(mode=mode, pass_config=PassConfig(fuse_allreduce_rms=flag))
        return fused.status(types.SimpleNamespace(vllm_config=types.SimpleNamespace(compilation_config=cc)))

    on = st(CompilationMode.VLLM_COMPILE, True)
    assert on["fusion_pass_configured"] is True and on["compilation_mode"] == "VLLM_COMPILE"
    eager = st(CompilationMode.NONE, True)
    assert eager["fusion_pass_configured"] is False and eager["fusion_pass_flag"] is True
    assert st(CompilationMode.VLLM_COMPILE, False)["fusion_pass_configured"] is False
    assert fused.status(None)["fusion_pass_configured"] is None  # no config to read


def test_uncovered_fused_kernels_exist_in_the_installed_vllm():
    root = Path(importlib.util.find_spec("vllm").origin).parent
    for model, mod, _ in fused.UNCOVERED:
        assert (root / mod).is_file(), (model, mod)


@pytest.mark.gpu
def test_real_fused_op_looks_up_the_wrapped_function(fresh_hook, monkeypatch):
    """Where vLLM's fusion module imports (CUDA build with FlashInfer): its real implementation, with the
    workspace and group stubbed, goes through the wrapper on CUDA tensors."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None:
        pytest.skip("needs CUDA and FlashInfer")
    mod = fused.fusion_module()
    if mod.flashinfer_comm is None:
        pytest.skip("this FlashInfer lacks allreduce_fusion")
    assert hasattr(torch.ops.vllm, fused.FUSED_OP)
    fresh_hook.gpu = True
    from tpcomm.hook import timing

    fresh_hook.cuda = timing.CudaEventTimer()
    calls, cols = _drive_real_impl(getattr(mod, fused.FUSED_IMPL), lambda k, v: monkeypatch.setattr(mod, k, v), "cuda")
    assert cols["path"] == ["flashinfer_fused_ar_rmsnorm"] and cols["backend"] == ["flashinfer_mnnvl"]
    assert cols["timing"] == ["cuda-event-eager"]
