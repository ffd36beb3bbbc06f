"""One rank's trace -> the hook's two record tables: engine steps and collective calls.

Steps: vLLM 0.32's worker wraps every `execute_model` in a profiler range
named `execute_context_<n>(<tokens>)_generation_<n>(<tokens>)`
(`Worker.annotate_profile`, vllm/v1/worker/gpu_worker.py; the detailed form
`execute_<tokens>_context_<n>(sq<tokens>...)_generation_<n>(sq<tokens>...)`
too). The step counter advances on every one of them, as the hook's does on
every execute_model; steps that schedule no token are counted but not
written (the hook writes none either). `sample_tokens` runs as a separate
call after execute_model, outside that range: a host step ends at the end of
the last host op on the range's thread before the next step's range starts,
so the step spans execute_model + sampling as the hook's row does. Without
vLLM's ranges: `ProfilerStep#N` (kind "profiler_step"); without either, the
whole trace is one step (kind "window").

On a trace with GPU kernels the step is read on the device: its kernels are
the ones launched from inside its host range (CUDA correlation id -> the
launch's host time; a CUDA graph's kernels all carry the correlation id of
its one cudaGraphLaunch, so a replayed graph belongs to the step that
launched it), or, for a kernel whose launch is not in the trace, the step
whose GPU-side range (`gpu_user_annotation`, same name) holds it, else the
last step that started on the host before the kernel ran. Its span is its
first kernel's start to its last kernel's end (gpu_start_ns/gpu_end_ns; the
host range stays in t_*), and the gap to the next step is device idle time.
Async scheduling (the host range of step n+1 running while the GPU runs
step n) changes nothing: steps are told apart by launch, not by host time.
On a CPU trace the host ranges are the steps.

Units: t_*_ns on the Unix clock (baseTimeNanoseconds + ts), *_us microseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tpcomm.trace import classify as K
from tpcomm.trace.launches import Launchers, gpu_ranges
from tpcomm.trace.reader import CAT_CODE, DEVICE_CATS, HOST_CATS, RUNTIME_CATS, RankTrace

VLLM_STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)[^)]*\)$")
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
DTYPE_BYTES = {
    # Kineto collective metadata (`dtype`)
    "Float": ("float32", 4),
    "BFloat16": ("bfloat16", 2),
    "Half": ("float16", 2),
    "Double": ("float64", 8),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Byte": ("uint8", 1),
    "Char": ("int8", 1),
    "Bool": ("bool", 1),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
    # record_shapes' `Input type`
    "float": ("float32", 4),
    "c10::BFloat16": ("bfloat16", 2),
    "c10::Half": ("float16", 2),
    "double": ("float64", 8),
    "long int": ("int64", 8),
    "long": ("int64", 8),
    "int": ("int32", 4),
    "short int": ("int16", 2),
    "unsigned char": ("uint8", 1),
    "signed char": ("int8", 1),
    "bool": ("bool", 1),
    "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
}
STEP_COLS = ["rank", "step", "t_start_ns", "t_end_ns", "duration_us", "num_seqs", "num_tokens", "kind", "source"]
GPU_STEP_COLS = ["gpu_start_ns", "gpu_end_ns"]  # analysis/split.py GPU_COLUMNS
COLL_COLS = [
    "rank",
    "group",
    "group_rank",
    "group_size",
    "op",
    "bytes",
    "dtype",
    "backend",
    "step",
    "call_idx",
    "t_start_ns",
    "t_end_ns",
    "duration_us",
    "timing",
    "path",
    "source",
    "name",
    "bytes_from",
]


def keep_args(cat: int, name: str) -> bool:
    """Whose args the reader keeps: communication, its metadata carriers, and step ranges."""
    if cat in HOST_CATS or cat == CAT_CODE["kernel"]:
        return bool(
            K.LOOKS_LIKE_COMM.search(name)
            or K.WRAPPERS.search(name)
            or VLLM_STEP.match(name)
            or PROFILER_STEP.match(name)
        )
    return False


@dataclass
class RankTables:
    rank: int
    timeline: str  # classify.DEVICE or HOST
    step_source: str  # "vllm execute ranges" | "ProfilerStep#N" | "whole trace"
    steps: pd.DataFrame  # STEP_COLS
    collectives: pd.DataFrame  # COLL_COLS
    unclassified: list[dict] = field(default_factory=list)  # {name, count, time_us}
    t_first_ns: int = 0
    t_last_ns: int = 0


def rank_tables(tr: RankTrace, group_size: int | None) -> RankTables:
    cat = np.frombuffer(tr.cat, dtype=np.int8)
    ts = np.frombuffer(tr.ts_ns, dtype=np.int64)
    dur = np.frombuffer(tr.dur_ns, dtype=np.int64)
    tid = np.frombuffer(tr.tid, dtype=np.int64)
    name = np.frombuffer(tr.name, dtype=np.int64)
    names = tr.names
    dev = np.isin(cat, list(DEVICE_CATS))
    timeline = K.DEVICE if (cat == CAT_CODE["kernel"]).any() else K.HOST
    host = np.isin(cat, list(HOST_CATS))
    base = tr.base_ns

    # ---- steps on the host -------------------------------------------------------------------------------
    rows = [i for i in tr.args if host[i] and (VLLM_STEP.match(names[name[i]]) or PROFILER_STEP.match(names[name[i]]))]
    vllm_rows = sorted((i for i in rows if VLLM_STEP.match(names[name[i]])), key=lambda i: ts[i])
    if vllm_rows:
        source, srows = "vllm execute ranges", vllm_rows
    else:
        srows = sorted((i for i in rows if PROFILER_STEP.match(names[name[i]])), key=lambda i: ts[i])
        source = "ProfilerStep#N" if srows else "whole trace"
    t_all = ts[dur >= 0]
    first, last = (int(t_all.min()), int((ts + dur).max())) if len(ts) else (0, 0)
    if srows:
        h_start = ts[srows]
        h_end = _host_step_ends(srows, ts, dur, tid, host) if vllm_rows else ts[srows] + dur[srows]
    else:
        h_start, h_end = np.array([first]), np.array([last])
    nxt = np.append(h_start[1:], np.iinfo(np.int64).max)
    meta = []  # (step, kind, seqs, tokens)
    for k, i in enumerate(srows):
        nm = names[name[i]]
        m = VLLM_STEP.match(nm)
        if m:
            n_ctx, t_ctx, n_gen, t_gen = (int(g) for g in m.groups())
            kind = "decode" if n_ctx == 0 and n_gen else ("prefill" if n_gen == 0 else "mixed")
            meta.append((k, kind if t_ctx + t_gen else None, n_ctx + n_gen, t_ctx + t_gen))
        else:
            meta.append((int(PROFILER_STEP.match(nm).group(1)), "profiler_step", 0, 0))
    if not srows:
        meta = [(0, "window", 0, 0)]

    # ---- which step each event belongs to --------------------------------------------------------------
    def step_of_host_time(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(h_start, t, side="right") - 1
        inside = (k >= 0) & (t < nxt[np.maximum(k, 0)])
        if not vllm_rows:  # ProfilerStep ranges are the whole iteration: outside them is outside any step
            inside &= t <= h_end[np.maximum(k, 0)]
        return np.where(inside, k, -1)

    if timeline == K.DEVICE:
        rt = np.isin(cat, list(RUNTIME_CATS))
        corr = np.frombuffer(tr.corr, dtype=np.int64)
        launch = pd.Series(ts[rt], index=corr[rt])
        launch = launch[~launch.index.duplicated()]
        dev_idx = np.flatnonzero(dev)
        lt = launch.reindex(corr[dev_idx]).to_numpy()
        t_host = np.where(np.isnan(lt), ts[dev_idx], lt).astype(np.int64)
        k_dev = step_of_host_time(t_host)
        no_launch = np.isnan(lt)
        t_nl = ts[dev_idx][no_launch]
        k_nl = k_dev[no_launch]
        k_nl = np.where(k_nl < 0, np.searchsorted(h_start, t_nl, side="right") - 1, k_nl)
        gr = gpu_ranges(tr, cat, name, ts, dur, vllm_rows, VLLM_STEP)
        if gr is not None:  # vLLM's GPU-side ranges say which step a kernel without its launch record ran in
            k_gpu = np.searchsorted(gr[0], t_nl, side="right") - 1
            k_nl = np.where((k_gpu >= 0) & (t_nl <= gr[1][np.maximum(k_gpu, 0)]), k_gpu, k_nl)
        k_dev[no_launch] = k_nl
        d = pd.DataFrame({"k": k_dev, "t0": ts[dev_idx], "t1": ts[dev_idx] + dur[dev_idx]})
        d = d[d["k"] >= 0].groupby("k").agg(t0=("t0", "min"), t1=("t1", "max"))
        span = dict(zip(d.index.tolist(), zip(d["t0"].tolist(), d["t1"].tolist(), strict=True), strict=True))
        step_of = np.full(len(ts), -1, dtype=np.int64)
        step_of[dev_idx] = k_dev
    else:
        span = {k: (int(h_start[k]), int(h_end[k])) for k in range(len(h_start))}
        step_of = None

    # A GPU trace's steps carry both clocks as the hook's do: the host range in t_*, the device span (first
    # kernel start to last kernel end) in gpu_*; the split (analysis/split.py) runs on the GPU's.
    step_rows = []
    for k, (step, kind, seqs, toks) in enumerate(meta):
        if kind is None or k not in span:
            continue
        t0, t1 = span[k]
        if timeline == K.DEVICE:
            h0, h1 = (int(h_start[k]), int(h_end[k])) if srows else (t0, t1)
            row = (
                tr.rank,
                step,
                base + h0,
                base + h1,
                (h1 - h0) / 1e3,
                seqs,
                toks,
                kind,
                "trace",
                base + t0,
                base + t1,
            )
        else:
            row = (tr.rank, step, base + t0, base + t1, (t1 - t0) / 1e3, seqs, toks, kind, "trace")
        step_rows.append(row)
    steps = pd.DataFrame(step_rows, columns=STEP_COLS + (GPU_STEP_COLS if timeline == K.DEVICE else []))
    step_no = np.array([m[0] for m in meta], dtype=np.int64)

    # ---- communication ------------------------------------------------------------------------------------
    ext = np.frombuffer(tr.ext, dtype=np.int64)
    meta_by_ext = {int(ext[i]): a for i, a in tr.args.items() if host[i] and names[name[i]] == "record_param_comms"}
    tl_mask = dev if timeline == K.DEVICE else host
    cand = sorted((i for i in tr.args if tl_mask[i]), key=lambda i: ts[i])
    launchers = Launchers(tr, host, names, name, ts, dur, tid, cat, cand) if timeline == K.DEVICE else None
    coll, odd = [], {}
    open_until: dict[int, int] = {}  # host thread -> end of the counted op it is inside
    for i in cand:
        nm = names[name[i]]
        rule = K.rule_for(nm, timeline)
        if rule is None:
            if K.looks_like_comm(nm) and not (
                timeline == K.HOST
                and cat[i] == CAT_CODE["user_annotation"]
                and (VLLM_STEP.match(nm) or PROFILER_STEP.match(nm))
            ):
                o = odd.setdefault(nm, [0, 0.0])
                o[0] += 1
                o[1] += float(dur[i]) / 1e3
            continue
        if timeline == K.HOST:  # count the outermost op only (a shm op inside another counted one is one transfer)
            if ts[i] < open_until.get(int(tid[i]), -1):
                continue
            open_until[int(tid[i])] = int(ts[i] + dur[i])
        a = tr.args[i]
        # Metadata: the kernel's own, else the CPU op that launched it (same External id, or the innermost
        # communication op around its launch: record_param_comms, nccl:<op>, c10d::<op>).
        cands = [a, meta_by_ext.get(int(ext[i]))] + (launchers.around(i) if launchers else [])
        cands = [c for c in cands if c]
        md = next((c for c in cands if "Collective name" in c or "In msg nelems" in c), None)
        nbytes, dtype, bfrom = _bytes(md) if md else (-1, "", "not recorded")
        for c in cands:
            if nbytes >= 0:
                break
            nbytes, dtype, bfrom = _bytes(c)
        md = md or a
        if timeline == K.DEVICE and "Collective name" not in md and launchers:
            nm_op = launchers.op_name(i)  # a kernel shared by several collectives (SendRecv for all_to_all)
        else:
            nm_op = None
        gsize = _int(md.get("Group size")) or group_size or 1
        k = int(step_of[i]) if step_of is not None else int(step_of_host_time(np.array([ts[i]]))[0])
        coll.append(
            (
                tr.rank,
                _group(md),
                tr.rank % gsize,
                gsize,
                (nm_op or K.op_of(nm, rule, md)),
                nbytes,
                dtype,
                rule.family,
                int(step_no[k]) if k >= 0 else -1,
                0,
                base + int(ts[i]),
                base + int(ts[i] + dur[i]),
                dur[i] / 1e3,
                f"kineto-{timeline}",
                rule.path,
                "trace",
                nm,
                bfrom,
                launchers.issued(i) if launchers else int(ts[i]),
            )
        )
    cdf = pd.DataFrame(coll, columns=[*COLL_COLS, "t_issue"])
    if len(cdf):
        # call_idx in issue order, as the hook counts calls: kernels by their launch on the host (streams may
        # run them in another order), host ops by their start.
        cdf = cdf.sort_values(["step", "t_issue", "t_start_ns"], kind="stable").reset_index(drop=True)
        cdf["call_idx"] = cdf.groupby("step").cumcount().astype(np.int64)
    cdf = cdf.drop(columns="t_issue")
    unclassified = [{"name": n, "count": c, "time_us": t} for n, (c, t) in sorted(odd.items(), key=lambda x: -x[1][1])]
    return RankTables(tr.rank, timeline, source, steps, cdf, unclassified, base + first, base + last)


def _host_step_ends(srows, ts, dur, tid, host) -> np.ndarray:
    """Each vLLM step's end: the end of the last host op on its range's thread that starts inside the range or
    after it, before the next step's range (sample_tokens runs there); never past that next start."""
    nxt = np.append(ts[srows][1:], np.iinfo(np.int64).max)
    per_tid: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    out = []
    for k, i in enumerate(srows):
        th = int(tid[i])
        if th not in per_tid:
            on = host & (tid == th)
            order = np.argsort(ts[on], kind="stable")
            per_tid[th] = (ts[on][order], (ts[on] + dur[on])[order])
        t, e = per_tid[th]
        lo, hi = np.searchsorted(t, ts[i], side="left"), np.searchsorted(t, nxt[k], side="left")
        end = int(e[lo:hi].max()) if hi > lo else int(ts[i] + dur[i])
        out.append(min(max(end, int(ts[i] + dur[i])), int(nxt[k])))
    return np.array(out, dtype=np.int64)


def _bytes(md: dict) -> tuple[int, str, str]:
    """(bytes per rank, dtype, where it came from) from collective metadata or record_shapes; -1 if absent."""
    n = _int(md.get("In msg nelems"))
    dt = DTYPE_BYTES.get(str(md.get("dtype")))
    if n is not None and dt:
        return n * dt[1], dt[0], "metadata"
    dims, types = md.get("Input Dims"), md.get("Input type")
    if isinstance(dims, list) and isinstance(types, list):
        for d, t in zip(dims, types, strict=False):
            dt = DTYPE_BYTES.get(str(t))
            if dt and isinstance(d, list) and d:
                return int(np.prod(d)) * dt[1], dt[0], "input shape"
    return -1, "", "not recorded"


def _group(md: dict) -> str:
    # vLLM's own groups (PyNccl, custom all-reduce, shm) leave no process-group metadata: with TP only, the
    # one group is TP, which is what `tpcomm plan` calls "tp". A torch.distributed group names itself.
    desc = md.get("Process Group Description")
    if isinstance(desc, str) and desc and desc != "undefined":
        return desc
    pg = md.get("Process Group Name")
    return f"pg{pg}" if pg not in (None, "") else "tp"


def _int(v) -> int | None:
    try:
        return int(v) if v is not None and v != "" else None
    except (TypeError, ValueError):
        return None
