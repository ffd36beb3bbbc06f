"""`tpcomm trace`: read a folder of per-rank Kineto traces into a run
directory's trace/ folder, split, cross-check and export them. Usable from
Python without click: `import_traces("prof/", "runs/r1")`.

Everything is read and checked before anything is written, so a bad input
(exit 2) leaves the run directory as it was; what is written goes to trace/
only (atomic writes), never over the hook's own files.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tpcomm.analysis.attribution import write_attribution
from tpcomm.errors import InputError
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir
from tpcomm.trace import export, terms
from tpcomm.trace.instances import TraceSet, check_and_align, check_ranks
from tpcomm.trace.reader import RankTrace, read_header, read_trace
from tpcomm.trace.steps import RankTables, keep_args, rank_tables
from tpcomm.trace.summary import attribution, write_summary

# vLLM's front-end trace (the API server's AsyncLLM) holds no worker: not a rank.
_FRONTEND = re.compile(r"async_llm", re.I)


def find_traces(source: str | Path, prefix: str | None = None) -> list[Path]:
    d = Path(source)
    if d.is_file():
        return [d]
    if not d.is_dir():
        raise InputError(f"trace folder {d}", "does not exist", "a folder holding one Kineto trace per rank")
    found = sorted(
        p
        for p in d.iterdir()
        if p.is_file()
        and p.name.endswith((".json", ".json.gz"))
        and not _FRONTEND.search(p.name)
        and (prefix is None or p.name.startswith(prefix))
    )
    if not found:
        raise InputError(
            f"trace folder {d}", "holds no *.json or *.json.gz trace", "one Kineto trace per rank (*.pt.trace.json.gz)"
        )
    return found


@dataclass
class Imported:
    traces: TraceSet
    by_rank: object  # DataFrame: terms.by_rank_steps
    split: dict
    crosscheck: dict
    ranks: list[dict]


# Below this many bytes of trace files in all, the ranks are read in this process (a worker process costs
# about a second to start, more than reading a few MB).
PARALLEL_BYTES = 64 << 20


def _one_rank(path: Path, gsize: int) -> tuple[RankTables, RankTrace]:
    """Read and tabulate one rank; the trace comes back without its event columns (only its header)."""
    tr = read_trace(path, keep_args)
    tab = rank_tables(tr, gsize)
    return tab, RankTrace(tr.path, tr.rank, tr.rank_from, tr.header, events_seen=tr.events_seen)


def load(paths: list[Path], subset: bool = False, jobs: int | None = None) -> TraceSet:
    """Every rank's tables. The headers first (ranks missing from the world are an error before any event is
    read); then large traces in parallel processes, one rank each (`jobs` at most, default the CPUs), each
    holding only its own rank's columns."""
    heads = [read_header(p) for p in paths]
    worlds = {h.world_size for h in heads if h.world_size}
    gsize = max(worlds) if worlds else len(paths)
    if all(h.rank >= 0 for h in heads):
        check_ranks([h.rank for h in heads], max(worlds) if worlds else None, subset, heads)
    size = sum(p.stat().st_size for p in paths if p.exists())
    jobs = min(len(paths), jobs or os.cpu_count() or 1)
    if jobs > 1 and size >= PARALLEL_BYTES:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (attribute's)
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            done = list(pool.map(_one_rank, paths, [gsize] * len(paths)))
    else:
        done = [_one_rank(p, gsize) for p in paths]
    tables, traces = [d[0] for d in done], [d[1] for d in done]
    return check_and_align(tables, traces, subset)


def analyse(ts: TraceSet, model_config=None, window: tuple[int, int] | None = None) -> Imported:
    by_rank = terms.by_rank_steps(ts.collectives, ts.steps)
    sp = terms.split(ts.collectives, ts.steps, window, ts.multi_host)
    cc = terms.crosscheck(ts.collectives, ts.steps, model_config, window)
    return Imported(ts, by_rank, sp, cc, terms.rank_summary(terms.in_window(by_rank, window)))


def write(rd: RunDir, imp: Imported, conditions: dict | None = None) -> dict:
    ts = imp.traces
    cols = [c for c in ts.collectives.columns if c not in ("name", "bytes_from")] + ["name", "bytes_from"]
    rd.write_table(C.TRACE_COLLECTIVES, ts.collectives[cols])
    rd.write_table(C.TRACE_STEPS, ts.steps)
    rd.write_table(C.TRACE_STEPS_BY_RANK, imp.by_rank)
    export.write(rd.path, C.TRACE_PERFETTO.path, export.perfetto(ts.collectives, ts.steps, "trace"))
    return write_summary(rd, ts, imp.split, imp.crosscheck, imp.ranks, conditions or {})


def import_traces(
    source: str | Path, out: str | Path, model_config=None, subset: bool = False, argv: list[str] | None = None
) -> dict:
    if model_config:  # checked before anything is read: a bad config is the user's to fix
        from tpcomm.models import load_model

        load_model(model_config)
    paths = find_traces(source)
    t0 = time.perf_counter()
    imp = analyse(load(paths, subset), model_config)
    size = {
        "files": len(paths),
        "bytes": sum(p.stat().st_size for p in paths),
        "events": imp.traces.events_seen,
        "import_s": round(time.perf_counter() - t0, 3),
    }
    rd = RunDir(out)
    rd.record_command("trace", argv)
    cond = {"trace_folder": str(source), "model_config": str(model_config) if model_config else None}
    doc = write(rd, imp, {**cond, "trace_size": size})
    # The report's split: the traces', unless the hook already attributed this run directory (then both are
    # kept, and attribute --profile's trace/compare.json sets them side by side).
    if not rd.exists(C.ATTR_SUMMARY):
        write_attribution(rd, attribution(doc))
    else:
        doc["notes"].append("attribution/summary.json (the hook's) kept: the trace's split is in trace/summary.json")
    rd.mark("trace", "complete", ranks=imp.traces.ranks)
    return doc


def export_hook(run_dir: str | Path) -> Path:
    """trace/hook_perfetto.json from a run directory's hook records (aligned as attribute aligns them)."""
    from tpcomm.analysis.align import align

    rd = RunDir(run_dir, create=False)
    coll, steps = rd.read_table(C.HOOK_COLLECTIVES), rd.read_table(C.HOOK_STEPS)
    if coll is None or steps is None or coll.empty:
        raise InputError(
            f"run directory {rd.path}",
            "holds no hook records (hook/collectives.parquet)",
            "a run directory written by `tpcomm attribute` with the plugin on",
        )
    return export.write(rd.path, C.HOOK_PERFETTO.path, export.perfetto(align(coll), steps, "hook"))
