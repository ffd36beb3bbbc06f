"""vLLM endpoint plugin: the /tpcomm/v1/* routes on the API server.

Entry point ``vllm.endpoint_plugins: tpcomm = tpcomm.hook.routes:make_plugin``;
vLLM loads it when VLLM_PLUGINS names tpcomm, and switch.py adds it when
TPCOMM_HOOK=1 with VLLM_PLUGINS unset. Each route reaches every
worker with ``engine_client.collective_rpc("tpcomm_...")`` (the methods that
plugin.py adds to the workers) and returns the per-rank answers together.

    GET  /tpcomm/v1/status    enabled, ranks, versions, buffer use, drops, session
    POST /tpcomm/v1/start     clear the buffers and arm recording on every rank (?session=ID names the run)
    POST /tpcomm/v1/stop      disarm (records stay until the next start); ?session=ID: only that recording
    GET  /tpcomm/v1/records   columnar JSON {"meta", "collectives", "steps"}, ?page=N (required) for PAGE_ROWS
                              rows of each table per rank (meta.pages says how many); ?session=ID: 409 unless
                              the workers still record that session; one answer at a time, others 429
    GET  /tpcomm/v1/metrics   Prometheus text (histograms kept on the workers, see metrics.py)
    GET  /tpcomm/v1/workers   each worker (rank, pid last seen): alive, process state (T = stopped), and
                              this API server's own pid: checked here, no engine round trip

Control that cannot drift (issue 22): vLLM's executor reads one reply per
worker per call, in order; a call that times out there leaves the late
worker's reply queued, and it then answers the next call (ranks one call
apart until the server restarts). So the workers are called with no timeout
in the executor (a call that waits here is abandoned after RPC_TIMEOUT_S,
TPCOMM_RPC_TIMEOUT_S on the server, answering 504, while the engine still
reads every reply when the worker runs again), and every call carries a
sequence number each worker echoes: a reply of another call is discarded and
the state re-read once; if that is out of step too, 502, never a mixed answer.

vLLM's API-key middleware guards only /v1, /v2, /inference and /cohere, so
these routes check ``Authorization: Bearer KEY`` against the server's
--api-key (or VLLM_API_KEY) themselves: 401 without it, before anything else
is looked at. Query parameters are validated after that and errors never
carry internals (they go to the server log). The test-only fault parameter
of /start is ignored unless TPCOMM_HOOK_TEST_FAULTS=1 is set on the server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import secrets
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tpcomm.hook import failsafe
from tpcomm.procid import identity
from tpcomm.procid import state as proc_state

logger = logging.getLogger("vllm.tpcomm.routes")
_SESSION = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # fullmatch: `$` would accept a trailing newline
_NONCE = secrets.token_hex(4)  # this API server's calls, told from another process's
_calls = itertools.count(1)


def rpc_timeout_s() -> float:
    try:
        return max(1.0, float(os.environ.get("TPCOMM_RPC_TIMEOUT_S", "120")))
    except ValueError:
        return 120.0


_pull_lock: asyncio.Lock | None = None  # one /records answer at a time: each holds a page of every rank in memory


class TpcommEndpoints:
    """The `EndpointPlugin` (vllm/plugins/endpoint_plugins/interface.py) for tpcomm."""

    name = "tpcomm"
    required_tasks = None

    # vLLM calls these while it builds the app: an exception would stop the server from starting. Through
    # failsafe.attempt (site `routes`): a failure leaves the routes out (attach) or answering 503 (state).
    def attach_router(self, app: FastAPI) -> None:
        failsafe.attempt("routes", app.include_router, router)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        failsafe.attempt("routes", _init_state, engine_client, state, args)


def _init_state(engine_client: Any, state: Any, args: Any) -> None:
    keys = getattr(args, "api_key", None)
    if isinstance(keys, str):
        keys = [keys]
    state.tpcomm_api_keys = [k for k in (keys or [os.environ.get("VLLM_API_KEY")]) if k]
    state.tpcomm_engine = engine_client
    _note_shutdown(engine_client)


# When this API server began its own shutdown (time.time_ns()), if it has. On SIGTERM or SIGINT vLLM's
# serve_http stops the engine client first (engine core, then workers): the workers that end next were stopped,
# not failed. A client that sees a worker end reads this from GET /workers, or, where vLLM closed HTTP with the
# workers (vLLM-CPU's default shutdown does, within the second), from the note file (publish.ShutdownNote)
# written before the workers are stopped (issue 32). After a worker's own death vLLM calls it too, but only
# after that death.
_SHUTDOWN: dict[str, Any] = {}


def _note_shutdown(engine: Any) -> None:
    """Note the time of the engine client's shutdown() (through failsafe.patch: vLLM's shutdown runs whatever
    the note does), in memory and in the note file. A client object that refuses the attribute, a folder that
    cannot be made: no note there, serving unchanged."""
    orig = getattr(engine, "shutdown", None)
    if not callable(orig) or getattr(orig, "_tpcomm_site", None):
        return
    try:
        from tpcomm.hook.publish import ShutdownNote

        _SHUTDOWN["file"] = ShutdownNote()
    except Exception as e:  # noqa: BLE001
        logger.info("tpcomm: no shutdown note file (%s): a client reads the shutdown from GET /workers only", e)

    def part(call: Any, *args: Any, **kwargs: Any) -> Any:
        if "ns" not in _SHUTDOWN:
            _SHUTDOWN["ns"] = time.time_ns()
            if (note := _SHUTDOWN.get("file")) is not None:
                try:
                    note.write(_SHUTDOWN["ns"])
                except Exception as e:  # noqa: BLE001 (a full /dev/shm: the in-memory note stays)
                    logger.info("tpcomm: shutdown note not written (%s)", e)
        return call(*args, **kwargs)

    try:
        failsafe.patch(engine, "shutdown", "routes", part)
    except Exception:  # noqa: BLE001
        pass


def make_plugin() -> TpcommEndpoints:
    return TpcommEndpoints()


router = APIRouter(prefix="/tpcomm/v1")


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def _check(request: Request) -> Any:
    state = request.app.state
    if failsafe.off("routes"):  # before the key check too: without its state, the key is not known
        raise _HTTPError(503, "the tpcomm routes are off on this server (see its log: 'tpcomm: routes off')")
    keys = getattr(state, "tpcomm_api_keys", [])
    if keys:
        auth = request.headers.get("Authorization", "")
        given = auth[7:] if auth[:7].lower() == "bearer " else ""
        if not any(secrets.compare_digest(given.encode(), k.encode()) for k in keys):
            raise _HTTPError(401, "Unauthorized: this server needs Authorization: Bearer <its --api-key>")
    engine = getattr(state, "tpcomm_engine", None)
    if engine is None:
        raise _HTTPError(503, "no engine behind this server (render-only server)")
    return engine


async def _rpc(request: Request, method: str, **kwargs: Any) -> list[dict]:
    """Every worker's answer to `method`, all to this very call (see the module docstring)."""
    engine = _check(request)
    answers = await _call(engine, method, kwargs)
    stale = _stale(answers, kwargs["seq"], method)
    if stale:
        # A reply of an earlier call: discard it and re-read (start and stop answer with the status they left).
        again = "tpcomm_status" if method in ("tpcomm_start", "tpcomm_stop") else method
        logger.warning("tpcomm: %s: %s; re-reading with %s", method, stale, again)
        kw = {k: v for k, v in kwargs.items() if again == method or k == "seq"}
        answers = await _call(engine, again, kw)
        if again_stale := _stale(answers, kw["seq"], again):
            raise _HTTPError(
                502,
                f"the workers answer out of step ({again_stale}): a call to them timed out in vLLM's executor "
                "earlier, and their replies stay one call apart until the server restarts",
            )
    _remember_workers(request, answers)
    return answers


async def _call(engine: Any, method: str, kwargs: dict) -> list:
    kwargs["seq"] = f"{_NONCE}-{next(_calls)}"
    try:
        # No timeout in the executor (see the module docstring): the wait is bounded here instead.
        return await asyncio.wait_for(engine.collective_rpc(method, timeout=None, kwargs=kwargs), rpc_timeout_s())
    except TimeoutError:
        raise _HTTPError(
            504,
            f"the workers did not answer {method} within {rpc_timeout_s():g} s (a worker stopped or hung? "
            "GET /tpcomm/v1/workers shows each one's state)",
        ) from None
    except NotImplementedError as e:
        raise _HTTPError(
            503, f"the tpcomm hook is not installed in the workers ({e}); start the server with TPCOMM_HOOK=1"
        ) from None
    except Exception as e:  # noqa: BLE001 - an engine error is the server's problem, say so
        if "not implemented" in str(e).lower() or "has no attribute 'tpcomm_" in str(e):
            raise _HTTPError(
                503, "the tpcomm hook is not installed in the workers; start the server with TPCOMM_HOOK=1"
            ) from None
        # The details go to the server's log, not to the client.
        logger.warning("tpcomm: collective_rpc %s failed: %s: %s", method, type(e).__name__, e)
        raise _HTTPError(500, f"the workers did not answer {method} (see the server log)") from None


def _stale(answers: Any, seq: str, method: str) -> str | None:
    """Why `answers` are not every worker's reply to call `seq` (None: they are)."""
    if not isinstance(answers, list) or not answers:
        return "no answer"
    off = []
    for i, a in enumerate(answers):
        body = a.get("meta") if isinstance(a, dict) and method == "tpcomm_records" else a
        if not isinstance(body, dict) or body.get("seq") != seq or not isinstance(body.get("rank"), int):
            got = body.get("seq") if isinstance(body, dict) else None
            off.append(f"worker {i} answered call {got or 'of another kind'}")
    return f"{'; '.join(off)}, not call {seq}" if off else None


def _error(e: _HTTPError) -> JSONResponse:
    return JSONResponse({"error": e.message}, status_code=e.status)


def _summary(per_rank: list[dict]) -> dict:
    per_rank = sorted(per_rank, key=lambda r: r["rank"])
    return {
        "plugin": "tpcomm",
        "enabled": all(r["enabled"] for r in per_rank),
        "armed": all(r["armed"] for r in per_rank),
        "ranks": [r["rank"] for r in per_rank],
        "records": {str(r["rank"]): r["records"] for r in per_rank},
        "dropped": {str(r["rank"]): r["dropped"] for r in per_rank},
        "buffer_capacity": per_rank[0]["record_capacity"] if per_rank else 0,
        "buffer_bytes_per_worker": per_rank[0]["buffer_bytes"] if per_rank else 0,
        "timing": sorted({t for r in per_rank for t in r["timing"]}),
        # site -> reason, over every rank (the first rank's reason): the timing paths the hook switched off
        "sites_off": {s: d.get("reason") for r in reversed(per_rank) for s, d in (r.get("sites_off") or {}).items()},
        "versions": per_rank[0]["versions"] if per_rank else {},
        # One session on every rank, or None when the ranks disagree (a start that reached only some).
        "session": per_rank[0].get("session") if len({r.get("session") for r in per_rank}) == 1 and per_rank else None,
        "started_ns": max((r.get("started_ns") or 0 for r in per_rank), default=0),
        "stopped_ns": max((r.get("stopped_ns") or 0 for r in per_rank), default=0),
        # The recording's lease (core.py): how long it lasts without a client call, and when it ran out (0: not)
        "lease_s": per_rank[0].get("lease_s") if per_rank else None,
        "lease_ended_ns": max((r.get("lease_ended_ns") or 0 for r in per_rank), default=0),
        # The served model's config (the same on every rank): what `attribute` plans its cross-check from.
        "model_config": per_rank[0].get("model_config") if per_rank else None,
        "per_rank": [{k: v for k, v in r.items() if k != "model_config"} for r in per_rank],
    }


@router.get("/status")
async def status(request: Request) -> Response:
    try:
        return JSONResponse(_summary(await _rpc(request, "tpcomm_status")))
    except _HTTPError as e:
        return _error(e)


def _int_param(request: Request, name: str, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        v = int(raw)
    except ValueError:
        raise _HTTPError(400, f"{name} must be an integer from {lo} to {hi}") from None
    if not lo <= v <= hi:
        raise _HTTPError(400, f"{name} must be an integer from {lo} to {hi}")
    return v


@router.post("/start")
async def start(request: Request) -> Response:
    try:
        _check(request)  # authenticate first: nothing about the parameters leaks to a caller without the key
        kw: dict[str, Any] = {}
        session = _session_param(request)
        if session is not None:
            kw["session"] = session
        lease = _int_param(request, "lease_s", 1, 7 * 86400)  # the recording ends by itself after this long
        if lease is not None:
            kw["lease_s"] = lease
        if os.environ.get("TPCOMM_HOOK_TEST_FAULTS") == "1":
            fault = _int_param(request, "inject_fault_after", 0, 2**31 - 1)
            if fault is not None:
                kw["fault_after"] = fault
        return JSONResponse(_summary(await _rpc(request, "tpcomm_start", **kw)))
    except _HTTPError as e:
        return _error(e)


@router.post("/stop")
async def stop(request: Request) -> Response:
    try:
        _check(request)
        session = _session_param(request)
        return JSONResponse(_summary(await _rpc(request, "tpcomm_stop", **({"session": session} if session else {}))))
    except _HTTPError as e:
        return _error(e)


def _session_param(request: Request) -> str | None:
    session = request.query_params.get("session")
    if session is not None and not _SESSION.fullmatch(session):
        raise _HTTPError(400, "session must be 1-64 characters of [A-Za-z0-9_.:-]")
    return session


def unpack(v: Any) -> np.ndarray:
    """A column as sent by rpc.tpcomm_records: {"nd": dtype, "b": bytes} or a list."""
    if isinstance(v, dict) and "nd" in v:
        return np.frombuffer(bytes(v["b"]), dtype=np.dtype(v["nd"]))
    return np.asarray(list(v), dtype=object)


def merge_records(per_rank: list[dict]) -> dict:
    """Per-rank columnar answers -> one columnar document, plain JSON types."""
    per_rank = sorted(per_rank, key=lambda r: r["meta"]["rank"])
    doc: dict[str, Any] = {"meta": _summary([r["meta"] for r in per_rank])}
    for table in ("collectives", "steps", "step_requests"):
        cols: dict[str, list] = {}
        for r in per_rank:
            for k, v in (r.get(table) or {}).items():
                cols.setdefault(k, []).extend(unpack(v).tolist())
        doc[table] = cols
    return doc


@router.get("/records")
async def records(request: Request) -> Response:
    global _pull_lock
    try:
        _check(request)
        page = _int_param(request, "page", 0, 2**20)
        session = _session_param(request)
        if page is None:  # a whole buffer at once is tens of MB per rank: always in pages
            raise _HTTPError(400, "records come in pages: ?page=0, then 1 .. meta.pages - 1")
    except _HTTPError as e:
        return _error(e)
    _pull_lock = _pull_lock or asyncio.Lock()
    if _pull_lock.locked():
        return JSONResponse(
            {"error": "another records pull is being served; retry shortly"},
            status_code=429,
            headers={"Retry-After": "1"},
        )
    async with _pull_lock:
        try:
            per_rank = await _rpc(request, "tpcomm_records", page=page)
            now = sorted({str(r["meta"].get("session")) for r in per_rank})
            if session is not None and now != [session]:
                raise _HTTPError(
                    409,
                    f"the workers record session {' / '.join(now)} now, not {session}: another client started "
                    "recording (its start cleared the records of this session)",
                )
        except _HTTPError as e:
            return _error(e)
        # Merging and encoding a page takes a while: off the event loop, so token streams keep flowing.
        body = await asyncio.to_thread(lambda: json.dumps(_paged(merge_records(per_rank), page), separators=(",", ":")))
    return Response(body, media_type="application/json")


def _paged(doc: dict, page: int | None) -> dict:
    per = doc["meta"]["per_rank"]
    rows = max([max(r.get("records", 0), r.get("steps", 0), r.get("step_requests", 0)) for r in per] or [0])
    size = max(per[0].get("page_rows") or 1, 1) if per else 1
    doc["meta"]["page"] = page
    doc["meta"]["pages"] = max(1, -(-rows // size)) if page is not None else 1
    return doc


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """From the files the workers publish (no engine round trip); the RPC only when a file cannot be served.
    The files are read off the event loop and checked there (publish.read_one): a FIFO, a link, a foreign or
    huge file planted at their path never stalls /health or the token streams."""
    from tpcomm.hook.metrics import prometheus_text

    try:
        _check(request)
        state = request.app.state
        files = getattr(state, "tpcomm_metric_files", None)
        per_rank = await _published(files) if files else None
        if per_rank is None:
            st = await _rpc(request, "tpcomm_status")
            state.tpcomm_metric_files = [{"pid": r["pid"], "metrics_file": r.get("metrics_file")} for r in st]
            per_rank = await _published(state.tpcomm_metric_files)
            source = "published"
            if per_rank is None:
                per_rank, source = await _rpc(request, "tpcomm_metrics"), "rpc"
        else:
            source = "published"
    except _HTTPError as e:
        return _error(e)
    return PlainTextResponse(prometheus_text(per_rank, source), media_type="text/plain; version=0.0.4")


_refused: set[str] = set()  # metrics files refused so far (logged once each)


async def _published(files: list[dict]) -> list[dict] | None:
    from tpcomm.hook.publish import read_published

    problems: list[str] = []
    got = await asyncio.to_thread(read_published, files, problems)
    for p in problems:
        if p not in _refused and len(_refused) < 64:
            _refused.add(p)
            logger.warning("tpcomm: published metrics refused (%s); /tpcomm/v1/metrics asks the workers instead", p)
    return got


def _remember_workers(request: Request, answers: Any) -> None:
    """(pid, host, identity) of every worker by rank from its last answer, for /workers to check without the engine."""
    try:
        seen = {
            int(a["rank"]): (int(a["pid"]), a.get("host"), a.get("identity"))
            for a in answers
            if isinstance(a, dict) and "pid" in a
        }
    except (TypeError, KeyError, ValueError):
        return
    if seen:
        request.app.state.tpcomm_workers = seen


def _pid_alive(pid: int) -> bool:
    try:  # a killed worker stays a zombie until its parent reaps it: dead all the same
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@router.get("/workers")
async def workers(request: Request) -> Response:
    """Liveness of the workers last seen by /status, /start or /stop, for those on this host (vLLM's
    multiprocessing executor runs them here; a worker on another node answers alive=null). Cheap enough to poll during load: it never reaches the engine, which a dead worker blocks."""
    try:
        _check(request)
    except _HTTPError as e:
        return _error(e)
    import socket
    import time

    seen = getattr(request.app.state, "tpcomm_workers", None) or {}
    me = os.getpid()
    return JSONResponse(
        {
            "workers": worker_liveness(seen, socket.gethostname()),
            # the API server itself: a client on this machine tells a whole-server stop from one rank's death
            "api_server": {
                "pid": me,
                "host": socket.gethostname(),
                "identity": identity(me),
                "shutdown_ns": _SHUTDOWN.get("ns"),  # when it began shutting down (SIGTERM), else None
                # where it notes that moment before vLLM stops the workers (read by a client on this machine)
                "shutdown_file": str(_SHUTDOWN["file"].path) if "file" in _SHUTDOWN else None,
            },
            "checked_ns": time.time_ns(),
        }
    )


def worker_liveness(seen: dict[int, tuple], here: str) -> list[dict]:
    """[{rank, pid, host, identity, alive}] for {rank: (pid, host[, identity])}. A worker on another host
    (multi-node) cannot be checked from here: alive is None ("not known"), never False. `identity` (see
    tpcomm.procid) lets a client on the workers' machine watch the pids itself."""
    out = []
    for r, (p, h, *known) in sorted(seen.items()):
        ident = known[0] if known else None
        # a pid reused by another process since the worker answered is not the worker: dead; an identity
        # this process cannot read (a hidepid /proc, no boot id) proves nothing either way
        cur = identity(p) if ident is not None and h in (None, here) else None
        alive = _pid_alive(p) and (cur is None or cur == ident) if h in (None, here) else None
        # T: stopped by a signal (SIGSTOP, a debugger): alive, but answering nothing until continued
        st = proc_state(p) if alive else None
        out.append({"rank": r, "pid": p, "host": h, "identity": ident, "alive": alive, "state": st})
    return out
