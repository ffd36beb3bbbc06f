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
        SYMM_MEM_ALL_REDUCE_MAX_SIZES,
    )

    from tpcomm.topo.rules import fi_fusion_sizes
    from tpcomm.topo.vllm_tables import TABLES

    sizes, where = fi_fusion_sizes()
    assert where in ("import", "source")  # read from the installed vLLM, not the copy
    assert sizes == TABLES["fi_fusion_max_size_mb"] and sizes[90][8] == 0.5
    assert CUSTOM_ALL_REDUCE_MAX_SIZES == TABLES["custom_ar_max_sizes"]
    assert SYMM_MEM_ALL_REDUCE_MAX_SIZES == TABLES["symm_mem_max_sizes"]


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

def call(fn, x, r):
    n = torch.empty_like(x)
    fn(input=x, workspace=None, pattern=AllReduceFusionPattern.kARResidualRMSNorm, launch_with_pdl=True,
       output=None, residual_out=r, norm_out=n, quant_out=None, scale_out=None, residual_in=r,
       rms_gamma=torch.ones(x.shape[-1]), rms_eps=1e-6, use_oneshot=True)
    return n, r

torch.manual_seed(0)
x, r = torch.randn(3, 64), torch.randn(3, 64)
want = call(orig, x.clone(), r.clone())
ok = fused.install(comm)
HOOK.start()
HOOK.step_begin(types.SimpleNamespace(num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1, scheduled_new_reqs=[]))
got = call(comm.allreduce_fusion, x.clone(), r.clone())
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
    assert [(x["path"], x["op"], x["group"], x["timing"]) for x in rows] == [
        ("flashinfer_fused_ar_rmsnorm", "all_reduce", "tp", "host-sync"),
        ("group_coordinator", "all_reduce", "tp", "host-sync"),
    ]
    assert rows[0]["bytes"] == out["nbytes"] and rows[0]["step"] == 0 and rows[0]["t_end_ns"] >= rows[0]["t_start_ns"]
    st = out["status"]
    assert st["fused_timed"] and st["fused_calls"] == 1  # the nested call is GroupCoordinator's, not counted
    assert st["allreduce_paths"] == ["group_coordinator", "flashinfer_fused_ar_rmsnorm"]
    assert st["fusion_pass_enabled"] is False  # a CPU VllmConfig: the pass is off
    # A module without the function: install says no, the hook stays enabled, status says why.
    assert out["bad_install"] is False and out["hook_enabled"] and "AttributeError" in out["bad_error"]


def test_records_without_the_path_column_still_load(tmp_path):
    """Records from a tpcomm before `path` existed pass the contract; a wrong kind in `path` does not."""
    import pandas as pd

    from tpcomm import contract as C
    from tpcomm.errors import InputError

    row = {c.name: ({"i": 1, "f": 1.0, "s": "x", "b": True}[c.kind],) for c in C.HOOK_COLLECTIVES.columns}
    C.check_table(C.HOOK_COLLECTIVES, pd.DataFrame(row))
    C.check_table(C.HOOK_COLLECTIVES, pd.DataFrame({**row, "path": ["flashinfer_fused_ar_rmsnorm"]}))
    with pytest.raises(InputError):
        C.check_table(C.HOOK_COLLECTIVES, pd.DataFrame({**row, "path": [1.5]}))


@pytest.mark.gpu
def test_real_fused_op_looks_up_the_wrapped_function():
    """Where FlashInfer exists: the fused op's implementation calls our wrapper (the lookup it does at call time)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None:
        pytest.skip("needs CUDA and FlashInfer")
    mod = fused.fusion_module()
    if mod.flashinfer_comm is None:
        pytest.skip("this FlashInfer lacks allreduce_fusion")
    assert hasattr(torch.ops.vllm, fused.FUSED_OP)
    assert fused.install()
    impl = getattr(mod, fused.FUSED_IMPL)
    try:
        target = getattr(impl.__globals__["flashinfer_comm"], fused.TARGET_ATTR)
        assert getattr(target, "_tpcomm_original", None) is not None
    finally:
        fused.uninstall(mod.flashinfer_comm)
