"""Worker methods added to vLLM's WorkerWrapperBase, reached with `collective_rpc`.

Each returns plain data (dicts, lists, numpy arrays) that vLLM's msgpack
transport carries from every worker back to the API server. They run on the
worker's own thread between engine steps, so they never race the recording.
Each echoes the `seq` the API server sent with the call (in `meta` for
records): vLLM reads one reply per worker per call in order, so a reply left
behind by a call that timed out would otherwise answer the next call
(routes.py discards such a reply and re-reads the state).
"""

from __future__ import annotations

import functools
import os
import socket
import time
from typing import Any

import numpy as np

from tpcomm.hook import failsafe, timing
from tpcomm.hook.core import HOOK, env_flag
from tpcomm.hook.recorder import (
    COLLECTIVE_COLUMNS,
    DEFAULT_MAX_RECORDS,
    DEFAULT_MAX_STEP_REQUESTS,
    DEFAULT_MAX_STEPS,
    STEP_COLUMNS,
    STEP_REQUEST_COLUMNS,
    Recorder,
    _env_int,
)
from tpcomm.procid import identity

METHODS = ("tpcomm_status", "tpcomm_start", "tpcomm_stop", "tpcomm_records", "tpcomm_metrics")
# Rows of each table per page of GET /tpcomm/v1/records (a full buffer is 262,144 collective rows per rank);
# TPCOMM_RECORDS_PAGE_ROWS on the server sets it (tests use small pages).
PAGE_ROWS = _env_int("TPCOMM_RECORDS_PAGE_ROWS", 65_536)

_versions: dict | None = None
_served_config: dict | None = None
# Keys of a Hugging Face config that no plan reads and that can be large (label maps, chat templates).
_CONFIG_DROP = ("id2label", "label2id", "chat_template", "auto_map")
_CONFIG_MAX_BYTES = 64_000


def _sequenced(fn):
    """Echo the caller's sequence number (routes._rpc) in the reply."""

    @functools.wraps(fn)
    def method(self: Any, *args: Any, seq: str | None = None, **kwargs: Any) -> dict:
        HOOK.lease_over(time.time_ns())  # a lease that ran out while no step ran ends now, before any renewal
        HOOK.renew()  # a client called: the recording's lease starts again (core.py)
        out = fn(self, *args, **kwargs)
        if seq is not None:
            (out["meta"] if "meta" in out else out)["seq"] = seq
        return out

    return method


def _rank(worker: Any) -> int:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.get_rank()
    except Exception:  # noqa: BLE001
        pass
    return int(getattr(worker, "global_rank", getattr(worker, "rpc_rank", -1)))


def _graph_breaks() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(sum(counters["graph_break"].values()))
    except Exception:  # noqa: BLE001
        return None


def _compile_counters() -> dict:
    """vLLM's own counters: did this worker compile, or load a compiled graph from its cache?"""
    try:
        from vllm.compilation.counter import compilation_counter as c

        return {
            k: int(getattr(c, k))
            for k in ("num_aot_compiles", "num_aot_artifacts_loaded", "num_graphs_seen")
            if hasattr(c, k)
        }
    except Exception:  # noqa: BLE001
        return {}


def served_model_config(worker: Any) -> dict | None:
    """The served model's Hugging Face config as vLLM loaded it (vllm_config.model_config.hf_config, with the
    dtype the server runs in): what `attribute` plans from, never a path resolved on the client."""
    global _served_config
    if _served_config is None:
        try:
            import json

            mc = worker.vllm_config.model_config
            cfg = json.loads(mc.hf_config.to_json_string(use_diff=False))
            cfg = {k: v for k, v in cfg.items() if k not in _CONFIG_DROP}
            cfg["dtype"] = str(mc.dtype).removeprefix("torch.")
            if len(json.dumps(cfg)) > _CONFIG_MAX_BYTES:  # keep the status small: scalars only
                cfg = {k: v for k, v in cfg.items() if not isinstance(v, (dict, list))}
            _served_config = cfg
        except Exception:  # noqa: BLE001 - the status must answer even if the config cannot be read
            return None
    return _served_config


@_sequenced
def tpcomm_status(self: Any) -> dict:
    global _versions
    if _versions is None:
        from tpcomm.versions import stack_versions

        _versions = stack_versions()
    rec = HOOK.rec
    cap = rec.capacity if rec else _env_int("TPCOMM_HOOK_MAX_RECORDS", DEFAULT_MAX_RECORDS)
    scap = rec.step_capacity if rec else _env_int("TPCOMM_HOOK_MAX_STEPS", DEFAULT_MAX_STEPS)
    row_b = sum(np.dtype(d).itemsize for d in COLLECTIVE_COLUMNS.values())
    step_b = sum(np.dtype(d).itemsize for d in STEP_COLUMNS.values())
    rcap = rec.req_capacity if rec else _env_int("TPCOMM_HOOK_MAX_STEP_REQUESTS", DEFAULT_MAX_STEP_REQUESTS)
    req_b = sum(np.dtype(d).itemsize for d in STEP_REQUEST_COLUMNS.values())
    return {
        "rank": _rank(self),
        "pid": os.getpid(),
        "host": socket.gethostname(),  # /tpcomm/v1/workers checks the pids of workers on the API server's host only
        "identity": identity(os.getpid()),  # boot id/pid/start: lets a client on this machine watch the pid itself
        "enabled": HOOK.disabled_reason is None,
        "disabled_reason": HOOK.disabled_reason,
        # Timing paths switched off after an error in the hook's own part (failsafe.py): site -> {reason, at_ns}
        "sites_off": failsafe.details(),
        "armed": HOOK.armed,
        "records": rec.n if rec else 0,
        "record_capacity": cap,
        "dropped": rec.dropped if rec else 0,
        "steps": rec.n_steps if rec else 0,
        "step_capacity": scap,
        "dropped_steps": rec.dropped_steps if rec else 0,
        "step_requests": rec.n_reqs if rec else 0,  # the client's own requests per step (recorder.py)
        "dropped_step_requests": rec.dropped_reqs if rec else 0,
        "buffer_bytes": cap * row_b + scap * step_b + rcap * req_b,
        "buffer_allocated": rec is not None,
        "engine_step": HOOK.step,
        "timing": _timing_modes(),
        "graph_sample_every": HOOK.cuda.sample_every if HOOK.cuda else None,
        "untimed_graph_calls": HOOK.cuda.untimed_graph_calls if HOOK.cuda else 0,
        "graph_timing": _graph_timing(),
        "step_clock": _step_clock(),
        "async_scheduling": _async_scheduling(self),
        "graph_breaks": _graph_breaks(),
        "compile": _compile_counters(),
        "compiled_op_calls": HOOK.compiled_op_calls,
        "allreduce_fusion": _fusion_status(self),
        "patched": list(HOOK.patched),
        "groups": [
            {"group": g[0], "name": g[1], "group_rank": g[2], "group_size": g[3]} for g in (rec.groups if rec else [])
        ],
        "started_ns": HOOK.started_ns,
        "stopped_ns": HOOK.stopped_ns,
        "lease_s": HOOK.lease_s,  # the recording ends by itself after this long without a client call
        "lease_ended_ns": HOOK.lease_ended_ns,  # when it did (0: it did not)
        "cpu_wait": HOOK.cpu_wait(),  # the step thread's CPU wait over the recording (core.py)
        "session": HOOK.session,
        "metrics_file": HOOK.metrics_file,
        "versions": _versions,
        "model_config": served_model_config(self),
    }


def _graph_timing() -> dict:
    """Whether collectives inside CUDA graphs are timed (a start-up choice: TPCOMM_GRAPH_TIMING, timing.py) and
    how the sampled replays were read (graphs.py): what a report needs to say when graph collectives were not
    timed, or when samples were dropped."""
    if HOOK.cuda is None:
        return {"enabled": False, "applies": False, "note": "no CUDA in this worker: no CUDA graphs"}
    c = HOOK.cuda
    st = c.status()
    why = st.get("graph_timing_off_why")  # switched off in this process (start-time self-test, a capture fault)
    return {
        "enabled": bool(c.graph_timing),
        "applies": True,
        "how": f"{timing.GRAPH_TIMING_ENV}=1 in the server's environment at start-up (default off)",
        "note": None
        if c.graph_timing
        else (
            f"collectives inside CUDA graphs are not timed (graph timing {f'off: {why}' if why else 'off at server start'})"
            "; they are counted per sampled step in steps.untimed_collectives"
        ),
        **st,
        **HOOK.graphs.status(),
    }


def _async_scheduling(worker: Any) -> bool | None:
    """vLLM's scheduler_config.async_scheduling in this worker (on by default on CUDA in vLLM 0.32, forced off
    on CPU): with it on, the host span of a step is only its enqueue span (gpuclock.py)."""
    try:
        return bool(worker.vllm_config.scheduler_config.async_scheduling)
    except Exception:  # noqa: BLE001
        return None


def _step_clock() -> dict:
    """Which clock the step rows carry besides the host's: the GPU's (gpuclock.py) on CUDA workers."""
    if HOOK.clock is None:
        return {"clock": "host", "steps_read": 0, "steps_missed": 0, "pending": 0}
    return {**HOOK.clock.status(), "anchor": HOOK.cuda.anchor.how if HOOK.cuda else None}


def _fusion_status(worker: Any) -> dict:
    """Which all-reduce paths are active: FlashInfer's fused all-reduce + RMSNorm or not (hook/fused.py)."""
    from tpcomm.hook import fused

    return fused.status(worker)


def _timing_modes() -> list[str]:
    if HOOK.rec is not None and HOOK.rec.timings.names:
        return list(HOOK.rec.timings.names)
    return [timing.CUDA_EVENT_EAGER, timing.CUDA_EVENT_GRAPH] if HOOK.gpu else [timing.HOST_SYNC]


@_sequenced
def tpcomm_start(
    self: Any, fault_after: int | None = None, session: str | None = None, lease_s: float | None = None
) -> dict:
    """Clear the buffer and arm recording under `session`, for `lease_s` seconds without a client call (None:
    TPCOMM_HOOK_LEASE_S or core.DEFAULT_LEASE_S). ``fault_after`` (tests only) needs TPCOMM_HOOK_TEST_FAULTS=1
    in the workers too."""
    if fault_after is not None and not env_flag("TPCOMM_HOOK_TEST_FAULTS"):
        fault_after = None
    HOOK.start(fault_after=fault_after, session=session, lease_s=lease_s)
    return tpcomm_status(self)


@_sequenced
def tpcomm_stop(self: Any, session: str | None = None) -> dict:
    """Disarm; with `session`, only the recording of that session (a client's late stop never ends another
    client's recording)."""
    if session is None or HOOK.session == session:
        HOOK.stop()
    return tpcomm_status(self)


@_sequenced
def tpcomm_records(self: Any, page: int | None = None) -> dict:
    """Records since the last start, columnar (the schema of hook/collectives.parquet, hook/steps.parquet):
    all of them, or page `page` of PAGE_ROWS rows of each table."""
    HOOK.poll(block=True)
    rank = _rank(self)
    rec = HOOK.rec if HOOK.rec is not None else Recorder(max_records=16, max_steps=16, max_step_requests=16)
    cols = rec.columns(rank) if page is None else rec.columns(rank, page=page, page_rows=PAGE_ROWS)
    packed = {t: {k: _pack(v) for k, v in c.items()} for t, c in cols.items()}
    meta = tpcomm_status(self)
    meta["page_rows"] = PAGE_ROWS
    return {"meta": meta, **packed}


@_sequenced
def tpcomm_metrics(self: Any) -> dict:
    """The per-op histograms now (the fallback when the published file cannot be read, see publish.py)."""
    from tpcomm.hook.publish import snapshot

    HOOK.poll(block=False)
    return snapshot(HOOK, _rank(self))


def _pack(v: Any) -> Any:
    # vLLM's msgpack transport does not hand untyped numpy arrays back as arrays:
    # send numeric columns as raw bytes plus dtype (see routes.unpack).
    if isinstance(v, np.ndarray):
        return {"nd": v.dtype.str, "b": v.tobytes()}
    return v
