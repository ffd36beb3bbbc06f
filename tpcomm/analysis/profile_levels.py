"""`attribute --profile` on a server without the plugin: the profiled round becomes a load level of its own
(C=1, the next repeat, `profiled: true` in load/levels.json) and the torch-profiler traces' records
(trace/collectives.parquet, trace/steps.parquet: the hook's columns, written by tpcomm/trace) stand in for the
hook's records, so analysis.py gives that level the same split, per-request closure against the client,
typed Attribution (source "trace") and report as the hook's records would.

Why a level of its own: the traces cover only the profiled window, so only the requests inside it can be paired
with engine steps; the other levels keep their client figures and say why they have no split.

The window is kept short (the trace grows with every step): PROFILED_REQUESTS requests at C=1, the fewest on
which both the closure and the five terms are judged (closure.py, delivery.py: on a loaded host the pace closure
can fail on delivery alone, and only a judged five-term check names that cause), or --requests when fewer.
"""

from __future__ import annotations

import pandas as pd

from tpcomm.judge.tolerances import FIVE_TERM_MIN_REQUESTS, MIN_CLOSURE_REQUESTS
from tpcomm.rundir import contract as C
from tpcomm.rundir.documents import LoadLevel

NOT_PROFILED = "no hook records (plugin off); the torch-profiler traces cover the profiled level only"
# Columns the trace import adds beside the hook's (the kernel's name, where the bytes came from, its own
# alignment): the attribution aligns the records itself, as it does the hook's.
_TRACE_ONLY = (
    "name",
    "bytes_from",
    "source",
    "group_id",
    "instance",
    "n_ranks",
    "complete",
    "transfer_us",
    "wait_us",
    "entry_skew_us",
)


PROFILED_REQUESTS = max(MIN_CLOSURE_REQUESTS, FIVE_TERM_MIN_REQUESTS)


def profiled_requests(requests: int, plugin: bool) -> int:
    """Requests in the profiled round: 2 beside the hook (a cross-check of its split), else enough for the
    closure and the five terms to be judged."""
    return min(requests, 2 if plugin else PROFILED_REQUESTS)


def next_repeat(levels: list[dict]) -> int:
    return max((int(lv["repeat"]) for lv in levels), default=-1) + 1


def profiled_level(levels: list[LoadLevel]) -> LoadLevel | None:
    return next((lv for lv in levels if lv.profiled), None)


def trace_records(rd) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The traces' collectives and steps as the attribution reads the hook's, when a level was profiled without
    the plugin and the traces were imported; None otherwise."""
    if profiled_level(rd.read(C.LOAD_LEVELS) or []) is None:
        return None
    coll, steps = rd.read_table(C.TRACE_COLLECTIVES), rd.read_table(C.TRACE_STEPS)
    if coll is None or steps is None or steps.empty:
        return None
    coll = coll.drop(columns=[c for c in _TRACE_ONLY if c in coll.columns])
    steps = steps.drop(columns=[c for c in ("source",) if c in steps.columns])
    return coll, steps


def source_note(levels: list[LoadLevel]) -> str:
    lv = profiled_level(levels)
    what = f"C={lv.concurrency}, repeat {lv.repeat}, {lv.requests} requests" if lv else "none marked profiled"
    return (
        f"records: vLLM's torch-profiler traces of the profiled level ({what}), read by tpcomm trace; no plugin "
        "in the server. Both "
        "the engine's steps and the client's timings of that level ran under the profiler (its overhead is on "
        "both sides of the closure)"
    )
