"""The collective backends tpcomm knows, as data: one JSON file per backend in this folder.

A backend is a path a collective can take (vLLM's custom all-reduce, PyNccl, vLLM-CPU's shared memory, ...).
Each file holds every spelling and fact the commands need about it, so that a new backend is this file, its
eligibility rule in topo/rules.py and, where it has one, its probe (probes/backends.py):

    name          the path name topo, judge and the report use ("custom-ar")
    label         words for a person
    platform      "cuda", "rocm" or "cpu"
    hook_tag      what the hook's `backend` column says for a call that took it ("custom_ar"); null where no
                  hook record says it (hook_note says why)
    hook_targets  vLLM classes (vllm.distributed.device_communicators.<module>.<class>) whose methods the hook
                  wraps to tag a call with hook_tag
    probe         `tpcomm probe --backend` name, or null (no microbenchmark of its own)
    one_shot      a one-shot/low-latency all-reduce: the lever for small decode messages on PCIe
    fallback      the path vLLM's CudaCommunicator.all_reduce tries next when this one declines a tensor
    switches      the environment variables that switch it or pick its variant, with vLLM's default (envs.py);
                  topo records them
    trace         profiler-trace rules: kernel (device) or host-op names, each with a real example and its source;
                  `family` is the name a trace-derived record carries (the hook's tag where the hook sees it)
    trace_wrappers  host-op names (regexes) that wrap a transfer counted elsewhere (its kernel): known, not counted
    source        where the facts come from

Loading checks every file and raises BackendError naming the file and the field. Importing this package is
cheap (no torch, no vLLM): the hook loads it inside serving processes.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
PLATFORMS = ("cuda", "rocm", "cpu")
TIMELINES = ("device", "host")
# The hook's `path` column: the vLLM code path that issued a call (GroupCoordinator, or the fused FlashInfer
# all-reduce + RMSNorm kernel that bypasses it; hook/fused.py).
GC_PATH, FUSED_PATH = "group_coordinator", "flashinfer_fused_ar_rmsnorm"


class BackendError(ValueError):
    """A backend file that is not what this module expects: names the file and the field."""


@dataclass(frozen=True)
class TraceRule:
    family: str
    timeline: str  # "device": kernel names; "host": CPU op / annotation names
    regex: str
    example: str  # a real kernel or op name this rule matches
    source: str  # where that name comes from: repository, file, commit
    fused: bool = False  # a fused kernel that bypasses GroupCoordinator
    op: str | None = None  # fixed op; None: read from the name or the metadata

    @functools.cached_property
    def pattern(self) -> re.Pattern:
        return re.compile(self.regex)

    @property
    def path(self) -> str:
        """What the hook's `path` column says for the same call."""
        return FUSED_PATH if self.fused else GC_PATH


@dataclass(frozen=True)
class HookTarget:
    module: str  # under vllm.distributed.device_communicators
    cls: str
    methods: tuple[str, ...]


@dataclass(frozen=True)
class Backend:
    name: str
    label: str
    platform: str
    hook_tag: str | None
    hook_targets: tuple[HookTarget, ...]
    probe: str | None
    one_shot: bool
    fallback: str | None
    switches: tuple[tuple[str, str], ...]  # (environment variable, vLLM's default)
    trace: tuple[TraceRule, ...]
    trace_wrappers: tuple[str, ...]
    source: str


_KEYS = {
    "name": str,
    "label": str,
    "platform": str,
    "hook_tag": (str, type(None)),
    "hook_targets": list,
    "probe": (str, type(None)),
    "one_shot": bool,
    "fallback": (str, type(None)),
    "switches": dict,
    "trace": list,
    "trace_wrappers": list,
    "source": str,
}
_NOTES = {"hook_note", "trace_note"}  # words for a reader, not read by code


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise BackendError(f"{where}: {what}")


def _rule(d: object, where: str) -> TraceRule:
    _need(isinstance(d, dict), where, "expected an object")
    assert isinstance(d, dict)
    for k in ("family", "timeline", "regex", "example", "source"):
        _need(isinstance(d.get(k), str) and d[k] != "", where, f"{k!r} must be a non-empty string")
    _need(d["timeline"] in TIMELINES, where, f"timeline must be one of {TIMELINES}, not {d['timeline']!r}")
    _need(d.get("path", "fused") == "fused", where, "path may only be 'fused'")
    _need(d.get("op") is None or isinstance(d["op"], str), where, "op must be a string or absent")
    extra = set(d) - {"family", "timeline", "regex", "example", "source", "path", "op"}
    _need(not extra, where, f"unknown keys {sorted(extra)}")
    try:
        re.compile(d["regex"])
    except re.error as e:
        raise BackendError(f"{where}: regex does not compile ({e})") from None
    return TraceRule(d["family"], d["timeline"], d["regex"], d["example"], d["source"], "path" in d, d.get("op"))


def parse(d: object, where: str) -> Backend:
    """One backend file's JSON -> Backend; BackendError naming `where` and the field."""
    _need(isinstance(d, dict), where, "expected a JSON object")
    assert isinstance(d, dict)
    for k, t in _KEYS.items():
        _need(k in d, where, f"missing {k!r}")
        _need(isinstance(d[k], t), where, f"{k!r} has the wrong type ({type(d[k]).__name__})")
    extra = set(d) - set(_KEYS) - _NOTES
    _need(not extra, where, f"unknown keys {sorted(extra)}")
    _need(d["platform"] in PLATFORMS, where, f"platform must be one of {PLATFORMS}")
    targets = []
    for i, t in enumerate(d["hook_targets"]):
        w = f"{where} hook_targets[{i}]"
        _need(isinstance(t, dict) and set(t) == {"module", "class", "methods"}, w, "expected module, class, methods")
        _need(all(isinstance(t[k], str) for k in ("module", "class")), w, "module and class must be strings")
        _need(isinstance(t["methods"], list) and all(isinstance(m, str) for m in t["methods"]), w, "methods: strings")
        targets.append(HookTarget(t["module"], t["class"], tuple(t["methods"])))
    _need(not targets or d["hook_tag"], where, "hook_targets need a hook_tag to write")
    _need(all(isinstance(v, str) for v in d["switches"].values()), where, "switches: {variable: default string}")
    rules = tuple(_rule(r, f"{where} trace[{i}]") for i, r in enumerate(d["trace"]))
    for i, w in enumerate(d["trace_wrappers"]):
        w_at = f"{where} trace_wrappers[{i}]"
        _need(isinstance(w, str) and w.startswith("^"), w_at, "expected a regex anchored at the start (^...)")
        _need("(?" not in w.replace("(?:", ""), w_at, "no inline flags or lookarounds: it is joined with the others")
        try:
            re.compile(w)
        except re.error as e:
            raise BackendError(f"{where} trace_wrappers[{i}]: regex does not compile ({e})") from None
    return Backend(
        d["name"],
        d["label"],
        d["platform"],
        d["hook_tag"],
        tuple(targets),
        d["probe"],
        d["one_shot"],
        d["fallback"],
        tuple(d["switches"].items()),
        rules,
        tuple(d["trace_wrappers"]),
        d["source"],
    )


def load(folder: Path = FOLDER) -> dict[str, Backend]:
    """Every backend file in `folder`, by name, checked one by one and against each other."""
    out: dict[str, Backend] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise BackendError(f"{f}: not readable JSON ({e})") from None
        b = parse(d, str(f))
        _need(b.name == f.stem, str(f), f"name {b.name!r} must be the file's name {f.stem!r}")
        out[b.name] = b
    _need(bool(out), str(folder), "no backend files (*.json): the package is incomplete")
    for b in out.values():
        _need(b.fallback is None or b.fallback in out, b.name, f"fallback {b.fallback!r} is no backend")
    for field in ("hook_tag", "probe"):
        seen: dict[str, str] = {}
        for b in out.values():
            v = getattr(b, field)
            _need(v is None or v not in seen, b.name, f"{field} {v!r} is also {seen.get(v)!r}'s")
            if v is not None:
                seen[v] = b.name
    return out


@functools.cache
def registry() -> dict[str, Backend]:
    return load(FOLDER)


def by_hook_tag(tag: str, reg: dict[str, Backend] | None = None) -> Backend | None:
    return next((b for b in (registry() if reg is None else reg).values() if b.hook_tag == tag), None)


def by_record_backend(name: str, reg: dict[str, Backend] | None = None) -> Backend | None:
    """The backend a record's `backend` value names: the hook's tag, or a trace rule's family (a trace calls
    PyNccl's kernels nccl, NCCL symmetric memory's nccl_symm)."""
    reg = registry() if reg is None else reg
    return by_hook_tag(name, reg) or next((b for b in reg.values() if any(r.family == name for r in b.trace)), None)


def one_shot_paths(reg: dict[str, Backend] | None = None) -> tuple[str, ...]:
    return tuple(b.name for b in (registry() if reg is None else reg).values() if b.one_shot)


def _depth(b: Backend, reg: dict[str, Backend]) -> int:
    """How many fallbacks lie below `b` (0: the plain path nothing else falls back from)."""
    n = 0
    while b.fallback is not None and n < len(reg):
        b, n = reg[b.fallback], n + 1
    return n


def probe_backends(platform: str, reg: dict[str, Backend] | None = None) -> tuple[str, ...]:
    """`tpcomm probe` backend names on a platform ("cpu" or "cuda"), from the plain fallback up."""
    reg = registry() if reg is None else reg
    bs = sorted((b for b in reg.values() if b.platform == platform and b.probe), key=lambda b: (_depth(b, reg), b.name))
    return tuple(b.probe for b in bs if b.probe)


def hook_targets(reg: dict[str, Backend] | None = None) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(module, class, methods, tag) for every class the hook wraps to tag a call's backend."""
    return [
        (t.module, t.cls, t.methods, b.hook_tag)
        for b in (registry() if reg is None else reg).values()
        for t in b.hook_targets
        if b.hook_tag
    ]


def switches(reg: dict[str, Backend] | None = None) -> tuple[str, ...]:
    """Every backend's environment switches, each once, in registry order."""
    return tuple(dict.fromkeys(k for b in (registry() if reg is None else reg).values() for k, _ in b.switches))


def trace_wrappers(reg: dict[str, Backend] | None = None) -> tuple[str, ...]:
    return tuple(w for b in (registry() if reg is None else reg).values() for w in b.trace_wrappers)


def trace_rules(reg: dict[str, Backend] | None = None) -> tuple[TraceRule, ...]:
    return tuple(r for b in (registry() if reg is None else reg).values() for r in b.trace)
