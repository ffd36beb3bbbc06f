"""The plugin must not touch the CUDA runtime where vLLM loads it before forking workers (issue 13, item 1).

vLLM calls general plugins in the API server and in EngineCore.__init__, then
forks the workers. `torch.cuda.is_available()` there initialises the CUDA driver
("poisons fork") while `torch.cuda.is_initialized()` stays False, so vLLM keeps
fork and the workers die at their first CUDA call. On a CPU machine we cannot
see the poisoning, but we can see the call: every CUDA runtime entry point is
replaced by a recorder in a fresh process that loads plugins exactly as vLLM
does (`vllm.plugins.load_general_plugins`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, traceback
import torch
# vLLM's own modules (and libraries they import, e.g. tvm_ffi) ask torch about CUDA at import time in every
# process anyway; import them first so that what is recorded below is what loading the plugin adds.
import vllm.distributed.parallel_state, vllm.v1.worker.worker_base  # noqa: E401,F401

calls = []
def recorder(name, orig):
    def f(*a, **k):
        calls.append({"name": name, "stack": "".join(traceback.format_stack())})
        return orig(*a, **k)
    return f

for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_capability",
             "is_initialized"):
    if name != "is_initialized":
        setattr(torch.cuda, name, recorder("torch.cuda." + name, getattr(torch.cuda, name)))
for name in ("_cuda_getDeviceCount", "_cuda_init"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, recorder("torch._C." + name, getattr(torch._C, name)))

from vllm.plugins import load_general_plugins
load_general_plugins()

from tpcomm.hook.core import HOOK
print(json.dumps({"calls": calls, "patched": HOOK.patched, "cuda_timer": HOOK.cuda is not None,
                  "disabled": HOOK.disabled_reason}))
"""


def _load_plugins(env_extra: dict) -> dict:
    env = {**os.environ, **env_extra}
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_registering_the_plugin_never_calls_the_cuda_runtime():
    out = _load_plugins({"VLLM_PLUGINS": "tpcomm"})
    assert out["disabled"] is None
    # The plugin really was installed in this process (so the check below is not vacuous) ...
    assert "GroupCoordinator._all_reduce_out_place" in out["patched"]
    assert "WorkerWrapperBase.init_device" in out["patched"]
    # ... and loading it asked torch nothing about CUDA (from tpcomm's code or from anything it imported).
    assert out["calls"] == [], "\n\n".join(c["name"] + "\n" + c["stack"] for c in out["calls"])
    assert out["cuda_timer"] is False  # CUDA timing waits for a worker's init_device


def test_cuda_timing_stays_off_on_the_cpu_platform_after_init_device():
    """The deferred install decides by vLLM's platform (CPU here): no timer, no CUDA call, no failure."""
    script = SCRIPT.replace(
        "from tpcomm.hook.core import HOOK",
        "from tpcomm.hook.core import HOOK\n"
        "from tpcomm.hook.plugin import _install_cuda_timing\n_install_cuda_timing()",
    )
    env = {**os.environ, "VLLM_PLUGINS": "tpcomm"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cuda_timer"] is False and out["disabled"] is None
    assert [c["name"] for c in out["calls"]] == []
