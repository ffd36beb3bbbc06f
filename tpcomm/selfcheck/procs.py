"""Checks that need processes of their own: the plugin's fork safety (a fresh
interpreter), the probe's ops at world size 1 and across 2+ GPUs (real ranks,
started by the probe's own launcher), and the refusal of more ranks than the
machine can run (the real CLI).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

from tpcomm.procgroup import OWN_GROUP
from tpcomm.selfcheck.result import FAIL, PASS, SKIP, Check, fork_check, judge_wrong, probe_ops_check

# Each item's wall-clock limit (s): past it the item's processes are stopped and the item FAILs. Together with
# the in-process CUDA items (fixed work, tpcomm/selfcheck/run.py) they keep the whole run under 5 minutes.
TIMEOUT_S = {"fork": 45, "probe-ops": 60, "rank-refusal": 30, "multi-gpu": 90}
FORK_CHILD_TIMEOUT_S = 15  # each forked child's first CUDA work (a hang in the driver is killed)
PROBE_OP_TIMEOUT_S = 20  # the probe's own --timeout: one measurement making no progress


class ItemTimeout(Exception):
    """An item's processes ran past its limit and were stopped."""


def _run_bounded(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` in a process group of its own (procgroup.py); past `timeout`: SIGINT (the probe's launcher then ends its ranks),
    SIGKILL to the group 10 s later, and ItemTimeout."""
    p = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **OWN_GROUP
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        raise ItemTimeout(f"did not finish within its {timeout:g} s limit (stopped)") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


# Every CUDA runtime entry point torch offers is replaced by a recorder; then the plugin loads as vLLM loads it
# (or, without vLLM, as its entry point is called). With CUDA, a forked child then uses the GPU: it fails if the
# driver was initialised in the parent ("poisons fork"), which is what killed vLLM's forked workers.
_FORK_SCRIPT = r"""
import json, os, signal, time, traceback
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
    deadline = time.monotonic() + float(os.environ["TPCOMM_SELFCHECK_FORK_CHILD_TIMEOUT"])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status == 0
        if time.monotonic() > deadline:  # a driver hang in the child: kill it, say so
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.02)
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
    env = {
        **os.environ,
        "VLLM_PLUGINS": "tpcomm",
        "TPCOMM_SELFCHECK_FORK_CHILD": "1" if cuda else "0",
        "TPCOMM_SELFCHECK_FORK_CHILD_TIMEOUT": str(FORK_CHILD_TIMEOUT_S),
    }
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    try:
        r = _run_bounded([sys.executable, "-c", _FORK_SCRIPT], TIMEOUT_S["fork"], env)
    except ItemTimeout as e:
        return Check("fork", FAIL, f"the loading process {e}", {"timeout_s": TIMEOUT_S["fork"]})
    if r.returncode != 0:
        return Check("fork", FAIL, f"the loading process failed: {r.stderr.strip().splitlines()[-1:]}")
    return fork_check(json.loads(r.stdout.strip().splitlines()[-1]), FORK_CHILD_TIMEOUT_S)


def _probe(item: str, backends: list[str], ranks: int, ops: list[str], sizes: str, mode: str, iters: int):
    """The real `tpcomm probe` in a process of its own, bounded by the item's limit: (rows, skipped), what
    reached the run directory (also when it failed or was stopped), and the error line if any."""
    with tempfile.TemporaryDirectory(prefix="tpcomm-selfcheck-") as d:
        cmd = [sys.executable, "-m", "tpcomm.cli", "probe", "--gpus", str(ranks), "--backend", ",".join(backends)]
        cmd += ["--ops", ",".join(ops), "--sizes", sizes, "--mode", mode, "--iters", str(iters), "--warmup", "2"]
        cmd += ["--timeout", str(PROBE_OP_TIMEOUT_S), "--out", d, "--json"]
        error = None
        try:
            r = _run_bounded(cmd, TIMEOUT_S[item], dict(os.environ))
            if r.returncode != 0:
                error = f"tpcomm probe exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:300]}"
        except ItemTimeout as e:
            error = f"tpcomm probe {e}"
        try:
            with open(os.path.join(d, "probe", "results.json")) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = {}
        return doc.get("results", []), doc.get("skipped", []), error


def check_probe_ops(cuda: bool) -> list[Check]:
    """Every op of probes/ops.py at world size 1 (a one-rank communicator), eager and graph on CUDA, eager on
    gloo (minus the ops gloo never has). Judged by result.probe_ops_check."""
    from probes.spec import NOT_IN_BACKEND, OPS

    backend, modes = ("nccl", ["eager", "graph"]) if cuda else ("gloo", ["eager"])
    not_asked = NOT_IN_BACKEND.get(backend, {})
    ops = [op for op in OPS if op not in not_asked]
    rows, skipped, error = _probe("probe-ops", [backend], 1, ops, "1K", "both" if cuda else "eager", 5)
    out = []
    for mode in modes:
        c = probe_ops_check(backend, mode, 1, ops, rows, skipped, not_asked)
        if error:
            c.status = FAIL
            c.figure = f"{error}; {c.figure}"
        c.detail["timeout_s"] = TIMEOUT_S["probe-ops"]
        out.append(c)
    if not cuda:
        out.append(Check("probe-ops-graph", SKIP, "needs CUDA (CUDA graphs; gloo runs on the CPU)"))
    return out


def check_rank_refusal(cuda: bool, gpus: int, cpus: int) -> Check:
    """The real CLI, one rank more than the machine can run: one line, exit 2, before any rank starts."""
    n, backend = (gpus + 1, "nccl") if cuda else (cpus + 1, "gloo")
    with tempfile.TemporaryDirectory(prefix="tpcomm-selfcheck-") as d:
        out = os.path.join(d, "run")
        cmd = [sys.executable, "-m", "tpcomm.cli", "probe", "--gpus", str(n), "--backend", backend, "--sizes", "1K"]
        try:
            r = _run_bounded(cmd + ["--out", out], TIMEOUT_S["rank-refusal"])
        except ItemTimeout as e:
            return Check("rank-refusal", FAIL, f"probe --gpus {n} --backend {backend} {e}")
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
    rows, skipped, error = _probe(
        "multi-gpu", ["nccl", "pynccl", "custom-ar"], ranks, ["all_reduce"], "1K,1M", "both", 20
    )
    # What was measured before an error stays: each backend's line, then the error as its own FAIL.
    out = [Check("multi-gpu", FAIL, f"{ranks} ranks: {error}", {"timeout_s": TIMEOUT_S["multi-gpu"]})] if error else []
    for b in ("nccl", "pynccl", "custom-ar"):
        mine = [r for r in rows if r["backend"] == b]
        why = next((s["reason"] for s in skipped if s["backend"] == b and s.get("reason")), None)
        if not mine:
            if why is None and error:
                why = "the probe stopped before it"
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
