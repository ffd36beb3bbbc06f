"""Checks that need processes of their own: the plugin's fork safety (a fresh
interpreter), the probe's ops at world size 1 and across 2+ GPUs (real ranks,
started by the probe's own launcher), and the refusal of more ranks than the
machine can run (the real CLI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from tpcomm.selfcheck.result import FAIL, PASS, SKIP, Check, judge_wrong

# Every CUDA runtime entry point torch offers is replaced by a recorder; then the plugin loads as vLLM loads it
# (or, without vLLM, as its entry point is called). With CUDA, a forked child then uses the GPU: it fails if the
# driver was initialised in the parent ("poisons fork"), which is what killed vLLM's forked workers.
_FORK_SCRIPT = r"""
import json, os, traceback
import torch
have_vllm = True
try:
    import vllm.distributed.parallel_state, vllm.v1.worker.worker_base  # their own CUDA queries happen at import
except Exception:
    have_vllm = False
def child_ok():
    # a forked child's first CUDA work: it fails when the parent has initialised the driver
    if os.environ.get("TPCOMM_SELFCHECK_FORK_CHILD") != "1":
        return None
    pid = os.fork()
    if pid == 0:
        try:
            torch.ones(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            os._exit(0)
        except BaseException:
            os._exit(3)
    return os.waitpid(pid, 0)[1] == 0
before = child_ok()
calls = []
def recorder(name, orig):
    def f(*a, **k):
        calls.append(name + "\n" + "".join(traceback.format_stack(limit=8)))
        return orig(*a, **k)
    return f
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_capability"):
    setattr(torch.cuda, name, recorder("torch.cuda." + name, getattr(torch.cuda, name)))
for name in ("_cuda_getDeviceCount", "_cuda_init"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, recorder("torch._C." + name, getattr(torch._C, name)))
if have_vllm:
    from vllm.plugins import load_general_plugins
    load_general_plugins()
else:
    from tpcomm.hook.plugin import register
    register()
from tpcomm.hook.core import HOOK
n_calls = len(calls)
after = child_ok()
print(json.dumps({"calls": calls[:n_calls], "vllm": have_vllm, "patched": len(HOOK.patched),
                  "child_before": before, "child_after": after}))
"""


def check_fork(cuda: bool) -> Check:
    env = {**os.environ, "VLLM_PLUGINS": "tpcomm", "TPCOMM_SELFCHECK_FORK_CHILD": "1" if cuda else "0"}
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    r = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, env=env, timeout=240)
    if r.returncode != 0:
        return Check("fork", FAIL, f"the loading process failed: {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    how = "vLLM's load_general_plugins" if out["vllm"] else "the plugin's register() (vLLM not installed)"
    before, after = out["child_before"], out["child_after"]
    ok = not out["calls"] and after is not False
    figure = (
        f"{len(out['calls'])} CUDA runtime calls while loading the plugin via {how}, {out['patched']} methods patched"
    )
    if after is not None:
        figure += f"; a child forked after loading {'used the GPU' if after else 'failed its first CUDA call'}"
        if before is False:
            figure += " (one forked before loading failed too: the imports before the plugin already broke fork)"
    return Check(
        "fork",
        PASS if ok else FAIL,
        figure,
        {"calls": out["calls"][:5], "vllm": out["vllm"], "child_before": before, "child_after": after},
    )


def _probe(backends: list[str], ranks: int, ops: list[str], sizes: str, mode: str, iters: int):
    from tpcomm.probe.runner import ProbeConfig, run_probe

    with tempfile.TemporaryDirectory(prefix="tpcomm-selfcheck-") as d:
        cfg = ProbeConfig(
            gpus=ranks, backends=backends, ops=ops, sizes=sizes, mode=mode, iters=iters, warmup=2, timeout=60, out=d
        )
        res = run_probe(cfg, progress=False)
        return res.rows, res.skipped


def check_probe_ops(cuda: bool) -> list[Check]:
    """Every op of probes/ops.py at world size 1 (a one-rank communicator), eager and graph on CUDA, eager on gloo."""
    from probes.spec import OPS

    backend, modes = ("nccl", ["eager", "graph"]) if cuda else ("gloo", ["eager"])
    rows, skipped = _probe([backend], 1, list(OPS), "1K", "both" if cuda else "eager", 5)
    out = []
    for mode in modes:
        parts, wrong, missing = [], 0, []
        for op in OPS:
            r = next((x for x in rows if x["op"] == op and x["mode"] == mode and x["timing"] == "isolated"), None)
            s = next((x for x in skipped if x["op"] == op and x.get("mode") == mode), None)
            if r is not None:
                wrong += int(r["wrong"] or 0)
                parts.append(f"{op} {r['p50_us']:.1f} us")
            elif s is not None and s.get("reason"):
                parts.append(f"{op} not run ({s['reason']})")
            else:
                missing.append(op)
        status = PASS if judge_wrong(wrong) == PASS and not missing else FAIL
        out.append(
            Check(
                f"probe-ops-{mode}",
                status,
                f"{backend}, world size 1, 1 KiB, {mode}: #wrong {wrong}"
                + (f", no result or reason for {','.join(missing)}" if missing else "")
                + "; "
                + "; ".join(parts),
                {"backend": backend, "mode": mode, "wrong": wrong, "missing": missing},
            )
        )
    if not cuda:
        out.append(Check("probe-ops-graph", SKIP, "needs CUDA (CUDA graphs; gloo runs on the CPU)"))
    return out


def check_rank_refusal(cuda: bool, gpus: int, cpus: int) -> Check:
    """The real CLI, one rank more than the machine can run: one line, exit 2, before any rank starts."""
    n, backend = (gpus + 1, "nccl") if cuda else (cpus + 1, "gloo")
    with tempfile.TemporaryDirectory(prefix="tpcomm-selfcheck-") as d:
        out = os.path.join(d, "run")
        r = subprocess.run(
            [sys.executable, "-m", "tpcomm.cli", "probe", "--gpus", str(n), "--backend", backend, "--sizes", "1K"]
            + ["--out", out],
            capture_output=True,
            text=True,
            timeout=120,
        )
        started = os.path.exists(out)
    line = r.stderr.strip()
    want = f"at most {n - 1}"
    ok = r.returncode == 2 and "\n" not in line and f"--gpus {n}" in line and want in line and not started
    return Check(
        "rank-refusal",
        PASS if ok else FAIL,
        f"probe --gpus {n} --backend {backend} on {gpus} GPU(s), {cpus} core(s): exit {r.returncode}: {line[:200]}",
        {"exit": r.returncode, "stderr": line[-500:], "run_dir_created": started},
    )


def check_multi_gpu(gpus: int) -> list[Check]:
    """NCCL, PyNccl and custom all-reduce across the GPUs (at most 8), eager and graph, #wrong == 0 for each."""
    ranks = min(gpus, 8)
    rows, skipped = _probe(["nccl", "pynccl", "custom-ar"], ranks, ["all_reduce"], "1K,1M", "both", 20)
    out = []
    for b in ("nccl", "pynccl", "custom-ar"):
        mine = [r for r in rows if r["backend"] == b]
        why = next((s["reason"] for s in skipped if s["backend"] == b and s.get("reason")), None)
        if not mine:
            out.append(
                Check(f"multi-gpu-{b}", FAIL if b == "nccl" else SKIP, f"{ranks} ranks: not run ({why or 'no reason'})")
            )
            continue
        wrong = sum(int(r["wrong"] or 0) for r in mine)
        iso = {(r["mode"], r["bytes"]): r["p50_us"] for r in mine if r["timing"] == "isolated"}
        figs = ", ".join(f"{m} {nb} B {us:.1f} us" for (m, nb), us in sorted(iso.items()))
        out.append(
            Check(
                f"multi-gpu-{b}",
                judge_wrong(wrong),
                f"all_reduce on {ranks} GPUs, #wrong {wrong}; isolated p50: {figs}",
                {"ranks": ranks, "wrong": wrong, "isolated_p50_us": {f"{m}:{nb}": us for (m, nb), us in iso.items()}},
            )
        )
    return out
