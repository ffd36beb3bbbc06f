"""Which trace events are communication: rules by kernel or op name, each
with a real name from public source beside it (the unit tests check each one).
The rules are data, one backend's beside its other facts: tpcomm/backends/*.json.

Two timelines. Where a trace holds GPU kernels, communication is read from
the device (`kernel` events: their start and duration on the GPU); the CPU ops
that launched them (`record_param_comms`, `c10d::*`, `vllm::all_reduce`, the
`nccl:*` annotations) are wrappers, kept only for their metadata. On a CPU
trace it is read from host ops (`_C::shm_*`, gloo's `gloo:*` ranges). Kernels
replayed from CUDA graphs carry no CPU-op correlation: the rules need only
the name. A name that looks like communication but matches no rule and no
wrapper is reported as unclassified, never silently counted as compute.

`family` is what the hook's `backend` column would say for the same call;
`path` is the hook's `path` (a fused kernel that bypasses GroupCoordinator).
"""

from __future__ import annotations

import functools
import re

from tpcomm import backends
from tpcomm.backends import TraceRule as Rule  # family, timeline, pattern, example, source, path, op

DEVICE, HOST = backends.TIMELINES
GC, FUSED = backends.GC_PATH, backends.FUSED_PATH

# The trace rules of every backend (tpcomm/backends/*.json "trace"), in the registry's order.
RULES: tuple[Rule, ...] = tuple(backends.trace_rules())

# CPU-side containers of a transfer counted elsewhere (the kernel, or the shm op inside): known, not counted.
# Whatever the backend: tpcomm's and torch's own ranges, vLLM's custom ops; then each backend's (its JSON file).
WRAPPERS = re.compile(
    "|".join(
        [r"^(tpcomm::|c10d::|record_param_comms$|vllm::(outplace_)?all_reduce|vllm::all_gather|vllm::reduce_scatter)"]
        + [f"(?:{w})" for w in backends.trace_wrappers()]
    )
)
# Names that look like communication: anything matching this and no rule nor wrapper is listed as unclassified.
LOOKS_LIKE_COMM = re.compile(
    r"(?i)(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv|send_recv|broadcast|nccl|rccl|gloo|"
    r"mscclpp|symm|multimem|lamport|custom_?ar|cross_device|shm_|one_?shot|two_?shot|\bp2p\b|\bipc_)"
)

_OPS = (
    (re.compile(r"(?i)all_?reduce|allreduce"), "all_reduce"),
    (re.compile(r"(?i)reduce_?scatter"), "reduce_scatter"),
    (re.compile(r"(?i)all_?gather"), "all_gather"),
    (re.compile(r"(?i)all_?to_?all"), "all_to_all"),
    (re.compile(r"(?i)broadcast"), "broadcast"),
    (re.compile(r"(?i)send_?recv"), "send_recv"),
    (re.compile(r"(?i)\bgather|_gather"), "gather"),
    (re.compile(r"(?i)send"), "send"),
    (re.compile(r"(?i)recv"), "recv"),
    (re.compile(r"(?i)reduce"), "reduce"),
)
# Kineto's `Collective name` metadata -> the hook's op names
_COLLECTIVE_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "send": "send",
    "recv": "recv",
    "all_to_all": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "gather": "gather",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "barrier": "barrier",
}


@functools.lru_cache(maxsize=8192)  # a GPU trace repeats a few hundred names millions of times
def rule_for(name: str, timeline: str) -> Rule | None:
    for r in RULES:
        if r.timeline == timeline and r.pattern.search(name):
            return r
    return None


def is_wrapper(name: str) -> bool:
    return bool(WRAPPERS.search(name))


def looks_like_comm(name: str) -> bool:
    return bool(LOOKS_LIKE_COMM.search(name)) and not is_wrapper(name)


def op_of(name: str, rule: Rule | None, meta: dict | None = None) -> str:
    """The hook's op name: from the `Collective name` metadata, else the rule, else the kernel/op name."""
    coll = (meta or {}).get("Collective name")
    if isinstance(coll, str) and coll.lower() in _COLLECTIVE_NAMES:
        return _COLLECTIVE_NAMES[coll.lower()]
    if rule is not None and rule.op:
        return rule.op
    head = name.replace("(anonymous namespace)", "").split("(")[0]
    for pat, op in _OPS:
        if pat.search(head):
            return op
    return "unknown"
