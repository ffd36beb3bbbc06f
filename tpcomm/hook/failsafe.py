"""Fail-safe patches: vLLM's (and torch's) own code runs whatever tpcomm's part does.

The hook runs inside other people's production servers, and its GPU paths first run there (no GPU with vLLM
is available to this project). So every place it wraps or patches vLLM or torch goes through one mechanism:

    patch(owner, name, site, part)     owner.name = wrap(owner.name, site, part), registered in PATCHES
    wrap(original, site, part)         the fail-safe callable (for a callable handed back, not set on an owner)
    attempt(site, fn, *args)           tpcomm-only code that vLLM calls (the endpoint plugin's wiring)

`part(call, *args, **kwargs)` is tpcomm's part; `call(*args, **kwargs)` runs the original, once. The wrapper:

- an exception in tpcomm's part (before, around or after the original) switches `site` off for the life of
  the process (`disable`: one log line, listed by `disabled()` and in /tpcomm/v1/status) and the call returns
  what the original returned, running it then if it had not run yet: never twice, never not at all;
- an exception of the original propagates unchanged (the same object), and switches nothing off;
- a site that is off calls the original straight away (one dict lookup);
- a part that returns without running the original is a tpcomm bug too (the original runs, the site goes off),
  unless it was patched with `replaces=True` (while dynamo compiles, the public collectives are rerouted to
  tpcomm's opaque ops, which run vLLM's own out-of-place collective at run time: ops.py).

While dynamo traces (torch.compiler.is_compiling()), the wrapper calls the part with the original itself and
catches nothing: vLLM compiles with fullgraph=True, where a try/except or a log line would break the graph,
and an exception at trace time is a start-up error, not a serving one. The parts keep that path to one
branch (plugin.py); the site that only acts there (`reroute`) takes its injected fault at install instead.

Fault injection (tests): TPCOMM_FAULT=SITE[,SITE...] or TPCOMM_FAULT=all makes tpcomm's part raise at those
sites, in every process that reads it (the workers inherit the server's environment). `SITE@after` (or
`all@after`) raises right after the original returned instead, inside tpcomm's part: the half-way failure
whose call must still return the original's result without running it again. The environment is read once
per process (`reload_faults` re-reads it).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm.tpcomm.hook")  # vLLM's logger family: same format and prefix
FAULT_ENV = "TPCOMM_FAULT"

# Every site a patch or an attempt names (docs/attribute.md lists them with what is lost when one is off).
SITES = {
    "collective": "GroupCoordinator's collectives timed (plugin.py)",
    "reroute": "the public all_reduce / all_gather / reduce_scatter rerouted to tpcomm:: ops while dynamo "
    "compiles (plugin.py, ops.py)",
    "backend_tag": "the CUDA all-reduce backends named per record (plugin.py)",
    "fused_allreduce": "FlashInfer's fused all-reduce + RMSNorm timed (fused.py)",
    "graph_capture": "timing events captured into CUDA graphs (timing.py)",
    "graph_replay": "sampled CUDA graph replays noted and read (timing.py, graphs.py)",
    "graph_selftest": "the start-time graph-timing self-test in each worker (selftest.py)",
    "step_begin": "an engine step's start (execute_model, plugin.py)",
    "step_end": "an engine step's end (execute_model, plugin.py)",
    "sampling": "the sampler's half of a step (sample_tokens, plugin.py)",
    "device_init": "CUDA timing installed once the worker's device is up (init_device, plugin.py)",
    "publish": "each worker's metrics file for scrapes (publish.py)",
    "routes": "the /tpcomm/v1 routes on the API server (switch.py, routes.py)",
}


class FaultInjected(RuntimeError):
    """Raised by tpcomm's part at a site named in TPCOMM_FAULT."""


@dataclass
class Patch:
    owner: Any
    name: str
    site: str
    original: Callable
    wrapper: Callable
    part: Callable
    replaces: bool
    own: bool = True  # the attribute was the owner's own (not inherited): unpatch puts it back, else deletes


PATCHES: list[Patch] = []  # every patch applied in this process, in order
_off: dict[str, str] = {}  # site -> why it is off
_off_at: dict[str, int] = {}  # site -> time.time_ns() when it went off
_before: frozenset[str] = frozenset()
_after: frozenset[str] = frozenset()
_all_before = _all_after = False
_read = False


# ---- the shared interface -------------------------------------------------------------------------------
def disable(site: str, reason: str) -> None:
    """Switch `site` off for the life of this process (idempotent: the first reason stays, one log line)."""
    if site in _off:
        return
    _off[site] = reason
    _off_at[site] = time.time_ns()
    logger.warning(
        "tpcomm: %s off for the life of this process (pid %d): %s; vLLM's own code runs unchanged there",
        site,
        os.getpid(),
        reason,
    )


def disabled() -> dict[str, str]:
    """Site -> why it is off, for the sites switched off in this process."""
    return dict(_off)


def off(site: str) -> bool:
    return site in _off


def fault(site: str) -> None:
    """Raise FaultInjected when TPCOMM_FAULT names `site` (or is `all`)."""
    if not _read:
        reload_faults()
    if _all_before or site in _before:
        raise FaultInjected(f"injected fault at {site} ({FAULT_ENV})")


def fault_after(site: str) -> None:
    """`fault` for `SITE@after`: raised right after the original returned."""
    if not _read:
        reload_faults()
    if _all_after or site in _after:
        raise FaultInjected(f"injected fault at {site} after vLLM's call ({FAULT_ENV})")


def reload_faults(spec: str | None = None) -> None:
    """Read TPCOMM_FAULT (or `spec`). Unknown site names are logged once and ignored (the server still starts)."""
    global _before, _after, _all_before, _all_after, _read
    raw = os.environ.get(FAULT_ENV, "") if spec is None else spec
    before, after = set(), set()
    for item in (s.strip() for s in raw.split(",")):
        if not item:
            continue
        name, _, when = item.partition("@")
        (after if when == "after" else before).add(name)
        if name != "all" and name not in SITES or when not in ("", "after"):
            logger.warning("tpcomm: %s names %r, not a site (%s, or all; @after)", FAULT_ENV, item, ", ".join(SITES))
    _all_before, _all_after = "all" in before, "all" in after
    _before, _after = frozenset(before), frozenset(after)
    _read = True


def details() -> dict[str, dict]:
    """Site -> {reason, at_ns} (status: when each site went off, on this worker's clock)."""
    return {s: {"reason": r, "at_ns": _off_at.get(s, 0)} for s, r in _off.items()}


# ---- the mechanism ---------------------------------------------------------------------------------------
def wrap(original: Callable, site: str, part: Callable, replaces: bool = False) -> Callable:
    """The fail-safe callable: `part(call, *args, **kwargs)` with `call` running `original` once (see the
    module docstring)."""
    compiling = _is_compiling()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if site in _off:
            return original(*args, **kwargs)
        if compiling():  # dynamo traces this: no catch, no log (vLLM compiles with fullgraph=True)
            return part(original, *args, **kwargs)
        ran: list = []  # [result] once the original returned, [None, its exception] if it raised

        def call(*a: Any, **k: Any) -> Any:
            if ran:
                raise RuntimeError(f"tpcomm's part at {site} called the original twice")
            ran.append(None)
            try:
                ran[0] = original(*a, **k)
            except BaseException as e:
                ran.append(e)
                raise
            if _all_after or _after:
                fault_after(site)
            return ran[0]

        err = None
        try:
            if not _read or _all_before or _before:
                fault(site)
            out = part(call, *args, **kwargs)
            if len(ran) > 1:  # the part swallowed the original's exception: it goes on all the same
                disable(site, f"tpcomm's part swallowed {type(ran[1]).__name__} from vLLM's call")
                err = ran[1]
            elif ran or replaces:
                return out
            else:
                disable(site, "tpcomm's part returned without running vLLM's call")
        except Exception as e:
            if len(ran) > 1:  # the original's own exception: it goes on, unchanged
                if e is ran[1]:
                    raise
                disable(site, f"tpcomm's part raised {type(e).__name__}: {e} over vLLM's {type(ran[1]).__name__}")
                err = ran[1]
            else:
                disable(site, f"{type(e).__name__}: {e}")
        except BaseException as e:  # KeyboardInterrupt, SystemExit: never swallowed
            if len(ran) > 1 and e is not ran[1]:
                err = ran[1]
            else:
                raise
        if err is not None:
            raise err  # outside the handler: the original's exception, not chained to tpcomm's
        return ran[0] if ran else original(*args, **kwargs)

    functools.update_wrapper(wrapper, original)
    wrapper._tpcomm_original = original
    wrapper._tpcomm_site = site
    return wrapper


def _is_compiling() -> Callable[[], bool]:
    """torch.compiler.is_compiling (True while dynamo traces), or a constant False without torch."""
    try:
        import torch

        return torch.compiler.is_compiling
    except Exception:  # noqa: BLE001 - no torch here: nothing is ever compiled
        return lambda: False


def patch(owner: Any, name: str, site: str, part: Callable, replaces: bool = False) -> Callable:
    """Replace `owner.name` (a class or module attribute) by `wrap(owner.name, site, part)`; registered."""
    if site not in SITES:
        raise ValueError(f"{site!r} is not a fail-safe site ({', '.join(SITES)})")
    original = getattr(owner, name)
    own = not isinstance(owner, type) or name in owner.__dict__
    new = wrap(original, site, part, replaces)
    setattr(owner, name, new)
    PATCHES.append(Patch(owner, name, site, original, new, part, replaces, own))
    return new


def unpatch(owner: Any, name: str | None = None) -> None:
    """Put back the originals of `owner`'s patches (of `name` only, if given): tests and selfcheck."""
    for p in reversed([p for p in PATCHES if p.owner is owner and (name is None or p.name == name)]):
        if p.own:
            setattr(owner, p.name, p.original)
        else:
            delattr(owner, p.name)  # inherited again (e.g. CUDAGraph.__init__ from torch's pybind base)
        PATCHES.remove(p)


def attempt(site: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run tpcomm-only code that vLLM calls (no original of vLLM's to run): an exception switches `site` off
    and the call returns None. Nothing runs once the site is off."""
    if site in _off:
        return None
    try:
        fault(site)
        return fn(*args, **kwargs)
    except Exception as e:
        disable(site, f"{type(e).__name__}: {e}")
        return None
