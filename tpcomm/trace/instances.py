"""Several ranks' traces -> one set of records, checked, and aligned into
collective instances exactly as the hook's records are (analysis/align.py):
the k-th collective of step s on each rank of a group is one instance;
transfer = the instance's minimum duration over ranks, wait = the rest.

Checks (each a one-line InputError, exit 2): a rank present twice, ranks of
the world missing (unless `subset`: then the ranks present form the group,
and wait is relative to them only), traces that do not cover the same window
(their spans do not overlap on one host, or their step sequences differ), no
communication at all.

Hosts: vLLM writes `host_name` into its traces. Traces from several hosts
share no clock: durations still compare (each on its own clock), but which
rank waited for which cannot be told, so transfer and wait are not separated
there (the split says so and gives their sum).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd

from tpcomm.analysis.align import align
from tpcomm.errors import InputError
from tpcomm.trace.steps import RankTables

MIN_OVERLAP = 0.5  # of the shorter trace's span: below this two traces are not of one profiling window


@dataclass
class TraceSet:
    tables: list[RankTables]
    files: dict[int, str]
    world_size: int | None
    hosts: list[str]  # distinct host names ([] when no trace names its host)
    subset: bool
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)  # aligned (HOOK_COLLECTIVES + align's columns)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # HOOK_STEPS + source
    notes: list[str] = field(default_factory=list)
    events_seen: int = 0  # traceEvents elements in all the files, kept or not

    @property
    def ranks(self) -> list[int]:
        return sorted(t.rank for t in self.tables)

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1

    @property
    def timeline(self) -> str:
        return self.tables[0].timeline if self.tables else "host"


def check_and_align(tables: list[RankTables], traces, subset: bool = False) -> TraceSet:
    """`traces`: the RankTrace objects (headers and paths) in the same order as `tables`."""
    worlds = {tr.world_size for tr in traces if tr.world_size}
    world = max(worlds) if worlds else None
    files = check_ranks([t.rank for t in tables], world, subset, traces)
    hosts = sorted({tr.host for tr in traces if tr.host})
    ts = TraceSet(tables, files, world, hosts, subset, events_seen=sum(getattr(tr, "events_seen", 0) for tr in traces))
    ranks = ts.ranks
    _check_windows(ts, traces)
    if all(t.collectives.empty for t in tables):
        odd = sorted({u["name"] for t in tables for u in t.unclassified})
        raise InputError(
            "trace folder",
            "holds no communication on any rank (no kernel or op matched a rule"
            + (f"; names that look like communication but match no rule: {', '.join(odd[:5])}" if odd else "")
            + ")",
            "traces of a run with tensor parallelism > 1",
        )
    coll = pd.concat([t.collectives for t in tables if not t.collectives.empty], ignore_index=True)
    if subset or not world:
        # The group is the ranks present: an instance is complete when every one of them is in it.
        n = len(ranks)
        coll["group_size"] = n
        coll["group_rank"] = coll["rank"].map({r: i for i, r in enumerate(ranks)}).astype("int64")
        if world and n < world:
            ts.notes.append(
                f"{n} of {world} ranks (subset): instances span the ranks present; wait is relative to them only"
            )
    ts.collectives = align(coll)
    ts.steps = pd.concat([t.steps for t in tables], ignore_index=True)
    if ts.multi_host:
        ts.notes.append(
            f"traces from {len(hosts)} hosts ({', '.join(hosts)}): no common clock, so cross-host wait is not "
            "separable from transfer; the split gives their sum (collective time)"
        )
    elif not hosts:
        ts.notes.append("the traces name no host: taken as one host, one clock")
    return ts


def check_ranks(ranks: list[int], world: int | None, subset: bool, traces) -> dict[int, str]:
    """rank -> file; a rank twice, or ranks of the world missing (unless `subset`), is an error. Runs on the
    traces' headers before their events are read, and again on the tables."""
    files: dict[int, str] = {}
    for r, tr in zip(ranks, traces, strict=True):
        if r in files:
            raise InputError(f"trace {tr.path}", f"is rank {r} again (also {files[r]})", "one trace per rank")
        files[r] = str(tr.path)
    have = sorted(files)
    if world and not subset and have != list(range(world)):
        missing = sorted(set(range(world)) - set(have))
        raise InputError(
            "trace folder",
            f"holds rank(s) {_short(have)} of a world of {world}; missing: {_short(missing)}",
            "one trace per rank of the world (or --subset to analyse the ranks present, wait relative to them)",
        )
    return files


def _check_windows(ts: TraceSet, traces) -> None:
    tables = ts.tables
    if len(tables) < 2:
        return
    ref = tables[0]
    for t, tr in zip(tables[1:], traces[1:], strict=True):
        ka = ref.steps[["step", "kind"]].itertuples(index=False)
        kb = t.steps[["step", "kind"]].itertuples(index=False)
        if ref.step_source == t.step_source and ref.step_source != "whole trace" and list(ka) != list(kb):
            raise InputError(
                f"trace {tr.path}",
                f"has {len(t.steps)} steps ({_kinds(t.steps)}) where rank {ref.rank}'s has {len(ref.steps)} "
                f"({_kinds(ref.steps)}): not the same profiling window",
                "traces from one /start_profile ... /stop_profile",
            )
        if ts.multi_host:
            continue
        lo, hi = max(ref.t_first_ns, t.t_first_ns), min(ref.t_last_ns, t.t_last_ns)
        shorter = min(ref.t_last_ns - ref.t_first_ns, t.t_last_ns - t.t_first_ns)
        if shorter > 0 and (hi - lo) < MIN_OVERLAP * shorter:
            raise InputError(
                f"trace {tr.path}",
                f"covers {_when(t.t_first_ns)}-{_when(t.t_last_ns)} UTC, rank {ref.rank}'s "
                f"{_when(ref.t_first_ns)}-{_when(ref.t_last_ns)}: not the same profiling window",
                "traces from one /start_profile ... /stop_profile",
            )


def _kinds(steps: pd.DataFrame) -> str:
    return ", ".join(f"{v} {k}" for k, v in steps["kind"].value_counts().items()) or "none"


def _when(t_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t_ns / 1e9)) + f".{int(t_ns % 10**9) // 10**6:03d}"


def _short(xs: list[int]) -> str:
    return ", ".join(map(str, xs)) if len(xs) <= 8 else ", ".join(map(str, xs[:8])) + f", ... ({len(xs)} in all)"
