"""The hook's per-process state: armed or not, the current engine step, the timed call.

`HOOK` is the one instance per worker process. The patched vLLM methods
(see `plugin.py`) call `HOOK.timed(...)` around each collective and
`HOOK.step_begin/step_end/sample_end` around each engine step. Whatever goes
wrong inside the hook's own code disables it (one log line, reason in status);
the collective itself always runs, and its own exceptions pass through untouched.

On CUDA nothing in a step waits on the GPU: events are recorded (collectives,
step boundaries: gpuclock.py) and read with Event.query() at a later step's
begin; sampled CUDA graph replays are read the same way (graphs.py). Waits
happen only at start() (the clock anchor, if its side-stream try fails), stop()
and records time, all between steps.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from tpcomm.hook import failsafe, timing
from tpcomm.hook.gpuclock import StepClock
from tpcomm.hook.graphs import GraphSampler
from tpcomm.hook.recorder import GROUP_COORDINATOR, Recorder
from tpcomm.procid import thread_cpu_wait_ns

logger = logging.getLogger("vllm.tpcomm.hook")  # a child of vLLM's logger: same format and prefix

# Set by the backend tags (plugin.py) during a CUDA collective: which path ran.
LAST_BACKEND: list[str | None] = [None]
# Set when vLLM's CudaCommunicator chose NCCL symmetric memory for an all-reduce (plugin.py): the PyNccl call
# that follows is that path, not plain PyNccl. Reset with LAST_BACKEND at each timed collective.
SYMM_PENDING: list[bool] = [False]
# A recording nobody renews ends by itself after this long (TPCOMM_HOOK_LEASE_S, or the client's lease_s at its
# start); `tpcomm attribute` asks for one round's worst case (its requests' timeouts) and renews at each round.
DEFAULT_LEASE_S = 900.0


def _env_float(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, default))
    except ValueError:
        return default
    return v if 0 < v < 1e7 else default


class Sized(NamedTuple):
    """Size of a collective's input, taken at CUDA graph capture (the tensor is gone at replay)."""

    nbytes: int
    dtype: str


_TENSOR: list = []


def _Tensor() -> type:
    if not _TENSOR:
        import torch

        _TENSOR.append(torch.Tensor)
    return _TENSOR[0]


def tensor_bytes(x: Any) -> tuple[int, str]:
    """Bytes and dtype of a tensor, or of the tensors in a list/tuple/dict (two levels deep)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size(), str(x.dtype).removeprefix("torch.")
    ts = list(_tensors(x, torch.Tensor, 0))
    if not ts:
        return 0, "none"
    dtypes = {str(t.dtype).removeprefix("torch.") for t in ts}
    return sum(t.numel() * t.element_size() for t in ts), dtypes.pop() if len(dtypes) == 1 else "mixed"


def _tensors(x: Any, tensor_type: type, depth: int):
    if isinstance(x, tensor_type):
        yield x
    elif depth < 2 and isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v, tensor_type, depth + 1)
    elif depth < 2 and isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v, tensor_type, depth + 1)


class Hook:
    def __init__(self) -> None:
        self.armed = False
        self.disabled_reason: str | None = None
        self.gpu = False  # set at register time: CUDA present in this process
        self.rec: Recorder | None = None
        self.cuda: timing.CudaEventTimer | None = None
        self.step = -1  # engine steps seen by this worker, armed or not (aligned across ranks)
        self.in_step = False
        self.call_idx = 0
        self.step_row = -1
        self._step_meta: tuple[int, int, int, int] | None = None
        self.fault_after: int | None = None  # test-only fault injection (TPCOMM_HOOK_TEST_FAULTS=1)
        self.n_added = 0
        self.compiled_op_calls = 0
        self.patched: list[str] = []
        self.started_ns = 0
        self.stopped_ns = 0
        # The recording's lease (issue 32): armed, it ends by itself once no client called for lease_s seconds
        # (a client killed mid-level, a start that took effect after its caller gave up). Checked at each step's
        # end and at each status: a comparison, never a wait. On the monotonic clock: a step of the wall clock
        # (NTP on a resumed machine) neither ends a recording early nor keeps it past its lease.
        self.lease_s = 0.0
        self.lease_until_mono_ns = 0
        self.lease_ended_ns = 0
        # The recording session: set by each start (the caller's id, the same on every rank), so a client
        # can tell that someone else started or stopped recording during its run.
        self.session: str | None = None
        # The measuring client's request tokens (session_tokens(session)) and, per vLLM request id seen while
        # armed, its number under one of them or -1 (request_number): parsed once per request, dropped when the
        # scheduler says the request finished.
        self.req_tokens: frozenset[str] = frozenset()
        self._req_nums: dict[str, int] = {}
        self.depth = 0  # 1 while inside a timed collective: nested collectives are part of the outer one
        self.metrics_file: str | None = None  # where this worker publishes its metrics (publish.py)
        self.clock: StepClock | None = None  # CUDA: the steps on the GPU timeline
        self.graphs = GraphSampler()  # CUDA: sampled graph replays, read at later steps
        self._step_untimed = 0  # collectives of the current sampled step that will have no row
        # (run_delay ns, engine step) of the thread that runs the steps, at start() and at stop(): how long it
        # waited for a CPU while recording. None where the kernel does not keep it. step_tid: that thread
        # (noted at the first step; under vLLM's multiprocessing executor the RPCs run on it too).
        self._cpu0: tuple[int, int] | None = None
        self._cpu1: tuple[int, int] | None = None
        self.step_tid: int | None = None

    # ---- arming -------------------------------------------------------
    def recorder(self) -> Recorder:
        if self.rec is None:
            self.rec = Recorder()
        return self.rec

    def enable_cuda_timing(self, sample_every: int | None = None, graph_timing: bool | None = None) -> bool:
        """CUDA event timing and the GPU step clock, with torch's CUDAGraph capture and replay bracketed for
        this hook (tpcomm.hook.timing); `graph_timing` None: TPCOMM_GRAPH_TIMING. False when the graph patch
        could not be applied."""
        self.gpu = True
        self.cuda = timing.CudaEventTimer(sample_every=sample_every, graph_timing=graph_timing)
        self.clock = StepClock()
        return timing.patch_cuda_graphs(self.cuda, self.after_replay, self.before_replay)

    def renew(self) -> None:
        """A client called: the armed recording's lease starts again."""
        if self.armed:
            self.lease_until_mono_ns = time.monotonic_ns() + int(self.lease_s * 1e9)

    def lease_over(self, now_ns: int) -> bool:
        """Disarm when the lease has run out (True then; `now_ns`, the wall clock, stamps its end). No poll and
        no wait: this runs inside a step."""
        if not self.armed or time.monotonic_ns() <= self.lease_until_mono_ns:
            return False
        self.armed = False
        self.stopped_ns = self.lease_ended_ns = now_ns
        logger.warning(
            "tpcomm: recording %r ended by its lease: no client called for %g s (the client died or gave up)",
            self.session,
            self.lease_s,
        )
        return True

    def start(self, fault_after: int | None = None, session: str | None = None, lease_s: float | None = None) -> None:
        """Clear the buffer and arm. Runs between steps (an RPC), where one wait is allowed: the clock anchor
        falls back to waiting for the current stream when its side-stream try is not tight (timing.py)."""
        self._cpu0 = self._cpu1 = None  # no CPU wait from an earlier recording
        if self.disabled_reason:
            return
        self.session = session
        self.req_tokens = session_tokens(session)
        self._req_nums = {}
        self.graphs.clear()  # replays noted before this start belong to no recording
        self.poll(block=True)
        if self.clock is not None:
            self.clock.clear()
        if self.cuda is not None:
            try:
                if not self.cuda.anchor.refresh():
                    self.cuda.anchor.sync()
            except Exception as e:  # noqa: BLE001
                self.fail("anchoring CUDA events", e)
        if self.rec is not None:  # allocated on the first record, so processes that never record never pay
            self.rec.clear()
        self.n_added = 0
        self.fault_after = fault_after
        self.started_ns, self.stopped_ns = time.time_ns(), 0
        self.lease_s = float(lease_s or _env_float("TPCOMM_HOOK_LEASE_S", DEFAULT_LEASE_S))
        self.lease_until_mono_ns, self.lease_ended_ns = time.monotonic_ns() + int(self.lease_s * 1e9), 0
        w = thread_cpu_wait_ns(self.step_tid)
        self._cpu0 = (w, self.step) if w is not None else None
        self.armed = True

    def stop(self) -> None:
        """Disarm, then read every event still pending, waiting for them (between steps: an RPC)."""
        was_armed, self.armed = self.armed, False
        self.stopped_ns = time.time_ns()
        if was_armed and self._cpu0 is not None:  # a second stop does not move the end
            w = thread_cpu_wait_ns(self.step_tid)
            self._cpu1 = (w, self.step) if w is not None else None
        self.poll(block=True)

    def cpu_wait(self) -> dict | None:
        """Since the last start (to its stop, once stopped): how long this worker's step thread waited for a CPU
        (wait_ns) over how many engine steps (steps). None before a start, or where the kernel does not say."""
        if self._cpu0 is None:
            return None
        end = self._cpu1
        if end is None and self.armed:
            w = thread_cpu_wait_ns(self.step_tid)
            end = (w, self.step) if w is not None else None
        if end is None:
            return None
        return {"wait_ns": end[0] - self._cpu0[0], "steps": end[1] - self._cpu0[1]}

    def fail(self, where: str, exc: BaseException) -> None:
        if self.disabled_reason is None:
            self.disabled_reason = f"{where}: {type(exc).__name__}: {exc}"
            logger.warning(
                "tpcomm hook disabled after an error in %s (%s: %s); serving continues unrecorded",
                where,
                type(exc).__name__,
                exc,
            )
        self.armed = False

    def poll(self, block: bool = False) -> None:
        """Read what the GPU has finished: eager collective pairs, step boundaries, then sampled graph replays
        (checked against their step's GPU span). Event.query() only, unless `block` (stop/records time)."""
        if self.cuda is None or self.rec is None:
            return
        try:
            rec = self.rec
            code = rec.timings.code(timing.CUDA_EVENT_EAGER)
            self.cuda.poll(lambda row, t0, t1: rec.update_span(row, t0, t1, code), block=block)
            if self.clock is not None:
                self.clock.poll(rec.set_step_gpu, self.cuda.anchor, block=block)
            if self.graphs.notes:
                self.graphs.poll(self._graph_row, self.cuda.anchor, self._span_of, self._graph_dropped, block=block)
        except Exception as e:  # noqa: BLE001 - the hook must never take serving down
            self.fail("reading CUDA events", e)

    def _graph_row(self, meta, t0: int, t1: int, step: int, idx: int) -> None:
        group, op, sized, backend, path = meta
        self._add(group, op, sized, backend, t0, t1, timing.CUDA_EVENT_GRAPH, path, at=(step, idx))

    def _span_of(self, step: int):
        """A sampled step's GPU span on the host clock, None while it may still be read, False if it never will."""
        if step == self.step and self.in_step:
            return None
        rec = self.rec
        row = rec.step_row(step) if rec is not None and step >= 0 else -1
        if row < 0:
            return False
        g0, g1 = int(rec._s["gpu_start_ns"][row]), int(rec._s["gpu_end_ns"][row])
        if g0 > 0:
            return (g0, g1)
        return None if self.clock is not None and self.clock.is_pending(row) else False

    def _graph_dropped(self, note) -> None:
        """A sampled replay that could not be read: its collectives count as untimed in its step."""
        self._untimed(len(note.graph._tpcomm_events.metas), note.step)

    def _untimed(self, n: int, step: int) -> None:
        if step == self.step and self.step_row < 0:
            self._step_untimed += n  # the row is written at the step's end
        elif self.rec is not None and step >= 0:
            self.rec.add_untimed(self.step_row if step == self.step else self.rec.step_row(step), n)

    # ---- one collective -------------------------------------------------
    def timed(self, group: Any, op: str, probe: Any, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (the original collective) and record it when armed.

        Only the outermost timed call is recorded: `dispatch`/`combine` and the dict/list collectives
        (`broadcast_tensor_dict`, ...) call other timed collectives inside, and one transfer must be one row."""
        return self.timed_path(GROUP_COORDINATOR, group, op, probe, fn, *args, **kwargs)

    def timed_path(self, path: str, group: Any, op: str, probe: Any, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """`timed` with an explicit `path` column (GROUP_COORDINATOR from the plugin's wrapper, or a fused kernel's)."""
        if self.depth or self.disabled_reason is not None or not (self.armed or self.gpu):
            return fn(*args, **kwargs)
        self.depth = 1
        try:
            # CUDA or not from the tensor, or from the group's device when the input is a list/dict (or absent).
            on_cuda = self.gpu and (
                probe.is_cuda
                if type(probe) is _Tensor()
                else getattr(getattr(group, "device", None), "type", "") == "cuda"
            )
            if on_cuda:
                return self._timed_cuda(group, op, probe, fn, args, kwargs, path)
            if not self.armed:
                return fn(*args, **kwargs)
            LAST_BACKEND[0], SYMM_PENDING[0] = None, False
            t0 = time.time_ns()
            out = fn(*args, **kwargs)
            t1 = time.time_ns()
        finally:
            self.depth = 0
        try:
            backend = LAST_BACKEND[0]  # set by a path that knows its transport (fused.py), else the group's
            self._add(group, op, probe if probe is not None else out, backend, t0, t1, timing.HOST_SYNC, path)
        except Exception as e:  # noqa: BLE001
            self.fail(f"recording {op}", e)
        return out

    def _timed_cuda(self, group, op, probe, fn, args, kwargs, path=GROUP_COORDINATOR):
        import torch

        try:
            capturing = torch.cuda.is_current_stream_capturing()
            timer = self.cuda
            if capturing and (not timer.capturing or failsafe.off("graph_capture")):
                # outside a graph the hook saw begin, or its capture timing off (failsafe.py): no events
                timer.untimed_graph_calls += 1
                capturing = None
            elif capturing and not timer.graph_timing:  # graph timing off: counted, no events in the graph
                timer.capture_untimed()
                capturing = None
            if capturing is None or (not capturing and not self.armed):
                return fn(*args, **kwargs)
            LAST_BACKEND[0], SYMM_PENDING[0] = None, False
            t0 = time.time_ns()
            ev = timer.graph_begin() if capturing else timer.eager_begin()
        except Exception as e:  # noqa: BLE001
            self.fail(f"timing {op}", e)
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)
        try:
            backend = LAST_BACKEND[0]
            if probe is None:  # recv: the size is that of what arrived
                probe = out
            if capturing:
                timer.graph_end(ev, (group, op, Sized(*tensor_bytes(probe)), backend, path))
            elif ev is None:
                self._add(group, op, probe, backend, t0, time.time_ns(), timing.HOST_ENQUEUE, path)
            else:
                row = self._add(group, op, probe, backend, t0, t0, timing.CUDA_EVENT_EAGER, path)
                if row >= 0:
                    timer.eager_end(ev, row, t0)
                else:
                    timer.release(ev)
        except Exception as e:  # noqa: BLE001
            self.fail(f"timing {op}", e)
        return out

    def before_replay(self, graph: Any) -> None:
        """Called before every replay of a graph that holds timed collectives. A replay re-records the graph's
        events when it is enqueued: a noted replay still in them (no rotation, graphs.py) is read now if the GPU
        has run it (Event.query()), else dropped and counted. Never waits."""
        if not self.graphs.notes or self.cuda is None:
            return
        try:
            self.graphs.before_replay(graph, self._graph_row, self.cuda.anchor, self._graph_dropped)
        except Exception as e:  # noqa: BLE001
            self.fail("reading a CUDA graph replay", e)

    def after_replay(self, graph: Any, t_replay_ns: int) -> None:
        """Called after every CUDA graph replay that holds captured collectives. While armed, every replay
        takes call indices for its collectives, sampled or not, so the collectives after it have the same
        call_idx in every step. In a sampled step a graph with timed collectives is noted (and its events
        rotated, graphs.py), to be read at a later step; collectives captured untimed count in the step's
        `untimed_collectives`."""
        if not self.armed or self.cuda is None:
            return
        try:
            slots = getattr(graph, "_tpcomm_slots", None) or ()
            untimed = getattr(graph, "_tpcomm_untimed", 0)
            first = self.call_idx
            self.call_idx += len(slots) + untimed
            if not self.cuda.due(self.step):
                return
            step = self.step if self.in_step else -1
            if untimed:
                self._untimed(untimed, step)
            if slots:
                rotate = self.cuda.rotate(graph) if self.cuda.driver is not None else None
                if not self.graphs.note(graph, step, first, t_replay_ns, rotate, self._graph_dropped):
                    self._untimed(len(slots), step)
        except Exception as e:  # noqa: BLE001
            self.fail("noting a CUDA graph replay", e)

    def _add(self, group, op, probe, backend, t0, t1, how, path=GROUP_COORDINATOR, at=None) -> int:
        """One row; `at` = (step, call index) when the row is emitted after its step (graph replays)."""
        rec = self.rec if self.rec is not None else self.recorder()
        if self.fault_after is not None and self.n_added >= self.fault_after:
            raise RuntimeError("injected test fault (TPCOMM_HOOK_TEST_FAULTS)")
        self.n_added += 1
        # Per (group, op, backend, timing, path): the row's constant codes, computed once (serving path).
        codes = group.__dict__.get("_tpcomm_codes")
        if codes is None:
            codes = group._tpcomm_codes = {}
        c = codes.get((op, backend, how, path))
        if c is None or c[0] is not rec:
            c = codes[(op, backend, how, path)] = self._codes(rec, group, op, backend, how, path)
        if type(probe) is _Tensor():
            nbytes = probe.nbytes
            dc = rec.dtype_codes.get(probe.dtype)
            if dc is None:
                dc = rec.dtype_codes[probe.dtype] = rec.dtypes.code(str(probe.dtype).removeprefix("torch."))
        else:
            nbytes, dtype = (probe.nbytes, probe.dtype) if isinstance(probe, Sized) else tensor_bytes(probe)
            dc = rec.dtypes.code(dtype)
        if at is None:
            step, idx = self.step if self.in_step else -1, self.call_idx
            self.call_idx = idx + 1
        else:
            step, idx = at
        return rec.add(c[1], c[2], nbytes, dc, c[3], step, idx, t0, t1, c[4], c[5])

    @staticmethod
    def _codes(rec: Recorder, group: Any, op: str, backend: str | None, how: str, path: str) -> tuple:
        kind = group.unique_name.split(":")[0]
        gi = rec.group_code(kind, group.unique_name, group.rank_in_group, group.world_size)
        b = backend if backend is not None else group_backend(group, op)
        return rec, gi, rec.ops.code(op), rec.backends.code(b), rec.timings.code(how), rec.paths.code(path)

    # ---- engine steps ---------------------------------------------------
    def step_begin(self, scheduler_output: Any) -> None:
        if self.step_tid is None:  # once: the thread whose CPU wait a recording reads (cpu_wait)
            self.step_tid = threading.get_native_id()
        self.step += 1
        self.in_step = True
        self.call_idx = 0
        self.step_row = -1
        self._step_meta = None
        self._step_untimed = 0
        if not self.armed or self.disabled_reason:
            return
        try:
            if self.cuda is not None:
                self.cuda.maybe_refresh_anchor()
                self.poll()
            per_req = scheduler_output.num_scheduled_tokens
            tokens = int(scheduler_output.total_num_scheduled_tokens)
            if tokens:
                new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
                # Speculative decoding (MTP, EAGLE, n-gram): a decode step schedules 1 + the request's draft
                # tokens (scheduled_spec_decode_tokens, vLLM 0.32's SchedulerOutput); more than that is prefill.
                spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
                prefill = sum(1 for rid, n in per_req.items() if rid in new or n > 1 + len(spec.get(rid, ())))
                kind = 0 if prefill == 0 else (1 if prefill == len(per_req) else 2)
                if self.req_tokens:
                    self._note_requests(per_req)
            else:  # an empty step: PP's batch queue slots, or a step that only delivers finished_req_ids
                kind = 3
            if self.req_tokens:  # forget the finished requests' parsed ids, on an empty step too
                for rid in getattr(scheduler_output, "finished_req_ids", None) or ():
                    self._req_nums.pop(rid, None)
            self._step_meta = (time.time_ns(), len(per_req), tokens, kind)
            if self.clock is not None:
                self.clock.begin()  # before vLLM enqueues anything of this step
        except Exception as e:  # noqa: BLE001
            self.fail("step start", e)

    def _note_requests(self, per_req: dict) -> None:
        """Which of the measuring client's requests this step serves (recorder.py, step requests): one dict
        lookup per scheduled request, its id parsed once."""
        nums, rec = self._req_nums, self.recorder()
        for rid, n in per_req.items():
            num = nums.get(rid)
            if num is None:
                if len(nums) >= MAX_REQUEST_IDS:
                    nums.clear()
                num = nums[rid] = request_number(rid, self.req_tokens)
            if num >= 0:
                rec.add_step_request(self.step, num, n)

    def step_end(self, output: Any) -> None:
        """End of execute_model. `output` None: sample_tokens follows and belongs to this step (its end is the
        step's end); else the step ends here."""
        self.in_step = output is None
        t_end = time.time_ns()
        if self._step_meta is None or not self.armed or self.lease_over(t_end):
            return
        try:
            t0, seqs, toks, kind = self._step_meta
            rec = self.recorder()
            if self.clock is not None:
                rec.gpu_clock = True
            self.step_row = rec.add_step(self.step, t0, t_end, seqs, toks, kind, self._step_untimed)
            self._step_untimed = 0
            if output is not None and self.clock is not None:
                self.clock.end(self.step_row)
        except Exception as e:  # noqa: BLE001
            self.fail("step end", e)

    def sample_end(self) -> None:
        """End of sample_tokens, the second half of a step (vLLM's sampler, and its drafter's graph replays):
        the step row is extended to now and the step's end event recorded. Nothing is read or waited for."""
        t_end = time.time_ns()
        if self.step_row >= 0 and self.armed:
            try:
                self.rec.extend_step(self.step_row, t_end)
                if self.clock is not None:
                    self.clock.end(self.step_row)
            except Exception as e:  # noqa: BLE001
                self.fail("sample end", e)
        elif self.clock is not None:
            self.clock.discard_open()
        self.in_step = False


MAX_REQUEST_IDS = 65_536  # parsed request ids kept (finished ones are dropped; past this the cache restarts)
_REQUEST_ID = re.compile(r"tpcomm-([0-9a-f]{8,32})-(\d{1,15})(?![0-9])")
_TOKEN = re.compile(r"[0-9a-f]{8,32}")


def session_tokens(session: str | None) -> frozenset[str]:
    """The request tokens a recording accepts: the session name's dash-separated parts that are 8-32 hex digits
    (`attribute-<run id>-c2-r0` accepts the run id)."""
    return frozenset(p for p in (session or "").split("-") if _TOKEN.fullmatch(p))


def request_number(request_id: str, tokens: frozenset[str]) -> int:
    """<n> of a vLLM request id that carries `tpcomm-<token>-<n>` with one of `tokens`, else -1. vLLM 0.32 makes
    the id `cmpl-<X-Request-Id>-<prompt index>-<8 hex>` for a completion (completion/serving.py) and
    `chatcmpl-<X-Request-Id>-<8 hex>` for a chat request (chat_completion/serving.py); the 8 hex characters are
    input_processor.py's `assign_request_id` (none with VLLM_DISABLE_REQUEST_ID_RANDOMIZATION)."""
    m = _REQUEST_ID.search(request_id) if "tpcomm-" in request_id else None
    return int(m.group(2)) if m and m.group(1) in tokens else -1


def group_backend(group: Any, op: str) -> str:
    """Which transport a collective on this group used, when no backend tag said so."""
    cache = getattr(group, "_tpcomm_backends", None)
    if cache is None:
        cache = group._tpcomm_backends = {}
    b = cache.get(op)
    if b is None:
        b = cache[op] = _infer_backend(group, op)
    return b


def _infer_backend(group: Any, op: str) -> str:
    import torch.distributed as dist

    dc = group.device_communicator
    try:
        pg_backend = str(dist.get_backend(group.device_group))
    except Exception:  # noqa: BLE001
        pg_backend = "torch_distributed"
    if op == "broadcast" or dc is None:
        return pg_backend
    dist_module = getattr(dc, "dist_module", None)
    if type(dist_module).__name__ == "_CPUSHMDistributed":
        if op in ("all_reduce", "all_gather", "gather") or (op in ("send", "recv") and group.use_cpu_custom_send_recv):
            return "shm"
    return pg_backend


HOOK = Hook()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
