"""The hook's record buffer: preallocated, bounded, never blocks.

One `Recorder` per worker process. Collective and step rows go into numpy
columns allocated once; when a buffer is full the row is counted in
``dropped_*`` and thrown away, so the serving path never waits or allocates.
Strings (group, op, dtype, backend, timing, path) are stored as small integer codes
into per-recorder vocabularies and decoded only when records are read.

Memory bound per worker (defaults): collectives 262,144 rows x 43 B = 10.8 MiB,
steps 65,536 rows x 53 B = 3.3 MiB, step requests 131,072 rows x 20 B = 2.5 MiB, so 16.6 MiB in
all (`Recorder.nbytes`). Change the row counts with TPCOMM_HOOK_MAX_RECORDS, TPCOMM_HOOK_MAX_STEPS
and TPCOMM_HOOK_MAX_STEP_REQUESTS (read at start-up).

Step requests: which of the measuring client's own requests each step served, and how many of
their tokens it scheduled (one row per step and such request). The client names its requests with
`X-Request-Id: tpcomm-<token>-<n>` (vLLM 0.32 builds its request id from that header,
serve/engine/serving.py `_base_request_id`, and the engine appends a random suffix); a request is
recorded when <token> is one of the dash-separated parts of the recording's session name, so other
clients' requests are never recorded (hook/core.py `request_number`).

Step rows carry two clocks. `t_start_ns`/`t_end_ns`: the host, when the worker's thread
entered execute_model and left the step (under async scheduling only the enqueue span).
`gpu_start_ns`/`gpu_end_ns` (CUDA workers only, filled in later, 0 until then): when the
GPU reached the step's first and passed its last work on vLLM's stream, placed on the host
clock through the hook's clock anchor (timing.ClockAnchor); see gpuclock.py.
`untimed_collectives`: collectives that ran in the step, in a step sampled for graph
timing, and have no row (graph timing off, or a graph sample that could not be read).

Units: bytes, ns (wall clock `time.time_ns()`), us for durations.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from tpcomm.hook.histograms import Histograms

# The `path` column: which vLLM code path issued the collective (GroupCoordinator's methods, or a
# fused kernel that never reaches it, see fused.py). Code 0 of every recorder.
GROUP_COORDINATOR = "group_coordinator"

DEFAULT_MAX_RECORDS = 262_144
DEFAULT_MAX_STEPS = 65_536
DEFAULT_MAX_STEP_REQUESTS = 131_072

# name -> numpy dtype of each column; the order is the row layout of `add`.
COLLECTIVE_COLUMNS = {
    "group_idx": np.int16,
    "op": np.int8,
    "bytes": np.int64,
    "dtype": np.int8,
    "backend": np.int8,
    "step": np.int64,
    "call_idx": np.int32,
    "t_start_ns": np.int64,
    "t_end_ns": np.int64,
    "timing": np.int8,
    "path": np.int8,
}
STEP_COLUMNS = {
    "step": np.int64,
    "t_start_ns": np.int64,
    "t_end_ns": np.int64,
    "num_seqs": np.int32,
    "num_tokens": np.int32,
    "kind": np.int8,
    "gpu_start_ns": np.int64,  # 0: no GPU time (CPU worker, or not read)
    "gpu_end_ns": np.int64,
    "untimed_collectives": np.int32,
}
STEP_REQUEST_COLUMNS = {
    "step": np.int64,
    "request": np.int64,  # the client's request number (<n> of its X-Request-Id)
    "tokens": np.int32,  # tokens of that request the step scheduled (1: a decode, more: a prefill chunk)
}
STEP_KINDS = ("decode", "prefill", "mixed", "empty")  # empty: no scheduled token (PP batch-queue slots)


def _env_int(name: str, default: int) -> int:
    try:
        return max(16, int(os.environ.get(name, default)))
    except ValueError:
        return default


class _Vocab:
    """String <-> small int, so that a record row is all integers."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.codes: dict[str, int] = {}

    def code(self, name: str) -> int:
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = len(self.names)
            self.names.append(name)
        return c


class Recorder:
    """Bounded columnar buffer of collective calls and engine steps on one rank."""

    def __init__(
        self, max_records: int | None = None, max_steps: int | None = None, max_step_requests: int | None = None
    ):
        self.capacity = max_records or _env_int("TPCOMM_HOOK_MAX_RECORDS", DEFAULT_MAX_RECORDS)
        self.step_capacity = max_steps or _env_int("TPCOMM_HOOK_MAX_STEPS", DEFAULT_MAX_STEPS)
        self.req_capacity = max_step_requests or _env_int("TPCOMM_HOOK_MAX_STEP_REQUESTS", DEFAULT_MAX_STEP_REQUESTS)
        self._c = {k: np.zeros(self.capacity, dt) for k, dt in COLLECTIVE_COLUMNS.items()}
        self._s = {k: np.zeros(self.step_capacity, dt) for k, dt in STEP_COLUMNS.items()}
        self._r = {k: np.zeros(self.req_capacity, dt) for k, dt in STEP_REQUEST_COLUMNS.items()}
        self._arrays = tuple(self._c.values())  # row order of `add`, unpacked in one go on the serving path
        self.dtype_codes: dict = {}  # torch.dtype -> code, filled by the hook
        self.ops, self.dtypes, self.backends, self.timings = _Vocab(), _Vocab(), _Vocab(), _Vocab()
        self.paths = _Vocab()
        self.paths.code(GROUP_COORDINATOR)  # code 0: the default of `add`
        # group_idx -> (group kind, unique name, group_rank, group_size)
        self.groups: list[tuple[str, str, int, int]] = []
        self._group_codes: dict[str, int] = {}
        self.n = 0
        self.n_steps = 0
        self.dropped = 0
        self.dropped_steps = 0
        self.n_reqs = 0
        self.dropped_reqs = 0
        self.gpu_clock = False  # a CUDA worker (set by the hook): the steps table gets its GPU columns
        self.hist = Histograms()  # folded by the metrics publisher (publish.py), reset with the buffer
        self.lock = threading.Lock()  # the publisher's fold vs clear(); never taken on the record path
        self.generation = 0  # bumped by clear()

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated columns (the stated memory bound)."""
        return sum(a.nbytes for t in (self._c, self._s, self._r) for a in t.values())

    def clear(self) -> None:
        with self.lock:
            self.n = self.n_steps = self.dropped = self.dropped_steps = self.n_reqs = self.dropped_reqs = 0
            self.hist.clear()
            self.generation += 1

    def group_code(self, kind: str, unique_name: str, group_rank: int, group_size: int) -> int:
        c = self._group_codes.get(unique_name)
        if c is None:
            c = self._group_codes[unique_name] = len(self.groups)
            self.groups.append((kind, unique_name, group_rank, group_size))
        return c

    def add(
        self,
        group_idx: int,
        op: int,
        nbytes: int,
        dtype: int,
        backend: int,
        step: int,
        call_idx: int,
        t_start_ns: int,
        t_end_ns: int,
        timing: int,
        path: int = 0,
    ) -> int:
        """Append a row; returns its index, or -1 when the buffer is full (the row is counted as dropped)."""
        i = self.n
        if i >= self.capacity:
            self.dropped += 1
            return -1
        g, o, b, d, k, s, c, t0, t1, tm, pa = self._arrays
        g[i] = group_idx
        o[i] = op
        b[i] = nbytes
        d[i] = dtype
        k[i] = backend  # noqa: E702
        s[i] = step
        c[i] = call_idx
        t0[i] = t_start_ns
        t1[i] = t_end_ns
        tm[i] = timing  # noqa: E702
        pa[i] = path
        self.n = i + 1
        return i

    def add_step(
        self,
        step: int,
        t_start_ns: int,
        t_end_ns: int,
        num_seqs: int,
        num_tokens: int,
        kind: int,
        untimed: int = 0,
    ) -> int:
        """Append a step row; returns its index (or -1 when dropped) so its end can be extended."""
        i = self.n_steps
        if i >= self.step_capacity:
            self.dropped_steps += 1
            return -1
        s = self._s
        s["step"][i] = step
        s["t_start_ns"][i] = t_start_ns
        s["t_end_ns"][i] = t_end_ns
        s["num_seqs"][i] = num_seqs
        s["num_tokens"][i] = num_tokens
        s["kind"][i] = kind
        s["gpu_start_ns"][i] = 0
        s["gpu_end_ns"][i] = 0
        s["untimed_collectives"][i] = untimed
        self.n_steps = i + 1
        return i

    def add_step_request(self, step: int, request: int, tokens: int) -> None:
        """One of the client's requests served by step `step` (counted in dropped_reqs when full)."""
        i = self.n_reqs
        if i >= self.req_capacity:
            self.dropped_reqs += 1
            return
        r = self._r
        r["step"][i] = step
        r["request"][i] = request
        r["tokens"][i] = tokens
        self.n_reqs = i + 1

    def extend_step(self, idx: int, t_end_ns: int) -> None:
        if 0 <= idx < self.n_steps:
            self._s["t_end_ns"][idx] = t_end_ns

    def set_step_gpu(self, idx: int, gpu_start_ns: int, gpu_end_ns: int) -> None:
        """Late fill-in of a step's GPU span (read from its events at a later step, see gpuclock.py)."""
        if 0 <= idx < self.n_steps:
            self._s["gpu_start_ns"][idx] = gpu_start_ns
            self._s["gpu_end_ns"][idx] = gpu_end_ns
            self.gpu_clock = True

    def add_untimed(self, idx: int, n: int) -> None:
        """Collectives of a step found untimed after its row was written (a graph sample dropped later)."""
        if 0 <= idx < self.n_steps:
            self._s["untimed_collectives"][idx] += n

    def step_row(self, step: int) -> int:
        """Index of the newest row of engine step `step`, or -1 (searched from the end: the few newest steps)."""
        s = self._s["step"]
        for i in range(self.n_steps - 1, max(self.n_steps - 64, 0) - 1, -1):
            if s[i] == step:
                return i
        return -1

    def update_span(self, idx: int, t_start_ns: int, t_end_ns: int, timing: int) -> None:
        """Late fill-in of both ends (CUDA event rows placed on the host clock, see timing.ClockAnchor)."""
        if 0 <= idx < self.n:
            self._c["t_start_ns"][idx] = t_start_ns
            self._c["t_end_ns"][idx] = t_end_ns
            self._c["timing"][idx] = timing

    def columns(
        self, rank: int, page: int = 0, page_rows: int | None = None
    ) -> dict[str, dict[str, np.ndarray | list]]:
        """The recorded rows as decoded columns (the schema of hook/*.parquet): all of them, or rows
        [page * page_rows, (page + 1) * page_rows) of each table (a large buffer is pulled in pages)."""
        lo = page * page_rows if page_rows else 0
        hi = (lambda n: min(n, lo + page_rows)) if page_rows else (lambda n: n)
        n, c = hi(self.n), {k: v[lo:] for k, v in self._c.items()}
        n = max(n - lo, 0)
        gi = c["group_idx"][:n]
        groups = self.groups or [("unknown", "", -1, 0)]
        lut = lambda vocab: np.array(vocab.names or ["unknown"], dtype=object)  # noqa: E731
        gkind = np.array([g[0] for g in groups], dtype=object)
        t0, t1 = c["t_start_ns"][:n].copy(), c["t_end_ns"][:n].copy()
        coll = {
            "rank": np.full(n, rank, np.int32),
            "group": gkind[gi].tolist(),
            "group_rank": np.array([g[2] for g in groups], np.int32)[gi],
            "group_size": np.array([g[3] for g in groups], np.int32)[gi],
            "op": lut(self.ops)[c["op"][:n]].tolist(),
            "bytes": c["bytes"][:n].copy(),
            "dtype": lut(self.dtypes)[c["dtype"][:n]].tolist(),
            "backend": lut(self.backends)[c["backend"][:n]].tolist(),
            "step": c["step"][:n].copy(),
            "call_idx": c["call_idx"][:n].copy(),
            "t_start_ns": t0,
            "t_end_ns": t1,
            "duration_us": (t1 - t0) / 1e3,
            "timing": lut(self.timings)[c["timing"][:n]].tolist(),
            "path": lut(self.paths)[c["path"][:n]].tolist(),
        }
        m, s = max(hi(self.n_steps) - lo, 0), {k: v[lo:] for k, v in self._s.items()}
        st0, st1 = s["t_start_ns"][:m].copy(), s["t_end_ns"][:m].copy()
        steps = {
            "rank": np.full(m, rank, np.int32),
            "step": s["step"][:m].copy(),
            "t_start_ns": st0,
            "t_end_ns": st1,
            "duration_us": (st1 - st0) / 1e3,
            "num_seqs": s["num_seqs"][:m].copy(),
            "num_tokens": s["num_tokens"][:m].copy(),
            "kind": np.array(STEP_KINDS, dtype=object)[s["kind"][:m]].tolist(),
            "untimed_collectives": s["untimed_collectives"][:m].astype(np.int64),
        }
        if self.gpu_clock:  # CUDA workers: the GPU span of each step (NaN where it was not read)
            g0 = s["gpu_start_ns"][:m].astype(np.float64)
            g1 = s["gpu_end_ns"][:m].astype(np.float64)
            bad = (g0 <= 0) | (g1 <= 0)
            g0[bad], g1[bad] = np.nan, np.nan
            steps.update(gpu_start_ns=g0, gpu_end_ns=g1, gpu_duration_us=(g1 - g0) / 1e3)
        q, r = max(hi(self.n_reqs) - lo, 0), {k: v[lo:] for k, v in self._r.items()}
        step_requests = {
            "rank": np.full(q, rank, np.int32),
            "step": r["step"][:q].copy(),
            "request": r["request"][:q].copy(),
            "tokens": r["tokens"][:q].copy(),
        }
        return {"collectives": coll, "steps": steps, "step_requests": step_requests}
