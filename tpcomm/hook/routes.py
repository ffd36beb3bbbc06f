"""vLLM endpoint plugin: the /tpcomm/v1/* routes on the API server.

Entry point ``vllm.endpoint_plugins: tpcomm = tpcomm.hook.routes:make_plugin``;
vLLM loads it only when VLLM_PLUGINS names tpcomm. Each route reaches every
worker with ``engine_client.collective_rpc("tpcomm_...")`` (the methods that
plugin.py adds to the workers) and returns the per-rank answers together.

    GET  /tpcomm/v1/status    enabled, ranks, versions, buffer use, drops
    POST /tpcomm/v1/start     clear the buffers and arm recording on every rank
    POST /tpcomm/v1/stop      disarm (records stay until the next start)
    GET  /tpcomm/v1/records   columnar JSON {"meta", "collectives", "steps"}
    GET  /tpcomm/v1/metrics   Prometheus text (histograms, see metrics.py)

vLLM's API-key middleware guards only /v1, /v2, /inference and /cohere, so
these routes check ``Authorization: Bearer KEY`` against the server's
--api-key (or VLLM_API_KEY) themselves: 401 without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

RPC_TIMEOUT_S = 120.0


class TpcommEndpoints:
    """The `EndpointPlugin` (vllm/plugins/endpoint_plugins/interface.py) for tpcomm."""

    name = "tpcomm"
    required_tasks = None

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(router)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        keys = getattr(args, "api_key", None)
        if isinstance(keys, str):
            keys = [keys]
        state.tpcomm_engine = engine_client
        state.tpcomm_api_keys = [k for k in (keys or [os.environ.get("VLLM_API_KEY")]) if k]


def make_plugin() -> TpcommEndpoints:
    return TpcommEndpoints()


router = APIRouter(prefix="/tpcomm/v1")


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def _check(request: Request) -> Any:
    state = request.app.state
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
    engine = _check(request)
    try:
        return await engine.collective_rpc(method, timeout=RPC_TIMEOUT_S, kwargs=kwargs or None)
    except NotImplementedError as e:
        raise _HTTPError(503, f"the tpcomm hook is not installed in the workers ({e}); "
                              "start the server with VLLM_PLUGINS=tpcomm") from None
    except Exception as e:  # noqa: BLE001 - an engine error is the server's problem, say so
        if "not implemented" in str(e).lower() or "has no attribute 'tpcomm_" in str(e):
            raise _HTTPError(503, "the tpcomm hook is not installed in the workers; "
                                  "start the server with VLLM_PLUGINS=tpcomm") from None
        raise _HTTPError(500, f"collective_rpc {method} failed: {type(e).__name__}: {e}") from None


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
        "versions": per_rank[0]["versions"] if per_rank else {},
        "per_rank": per_rank,
    }


@router.get("/status")
async def status(request: Request) -> Response:
    try:
        return JSONResponse(_summary(await _rpc(request, "tpcomm_status")))
    except _HTTPError as e:
        return _error(e)


@router.post("/start")
async def start(request: Request, inject_fault_after: int | None = None) -> Response:
    try:
        kw = {"fault_after": inject_fault_after} if inject_fault_after is not None else {}
        return JSONResponse(_summary(await _rpc(request, "tpcomm_start", **kw)))
    except _HTTPError as e:
        return _error(e)


@router.post("/stop")
async def stop(request: Request) -> Response:
    try:
        return JSONResponse(_summary(await _rpc(request, "tpcomm_stop")))
    except _HTTPError as e:
        return _error(e)


def unpack(v: Any) -> np.ndarray:
    """A column as sent by rpc.tpcomm_records: {"nd": dtype, "b": bytes} or a list."""
    if isinstance(v, dict) and "nd" in v:
        return np.frombuffer(bytes(v["b"]), dtype=np.dtype(v["nd"]))
    return np.asarray(list(v), dtype=object)


def merge_records(per_rank: list[dict]) -> dict:
    """Per-rank columnar answers -> one columnar document, plain JSON types."""
    per_rank = sorted(per_rank, key=lambda r: r["meta"]["rank"])
    doc: dict[str, Any] = {"meta": _summary([r["meta"] for r in per_rank])}
    for table in ("collectives", "steps"):
        cols: dict[str, list] = {}
        for r in per_rank:
            for k, v in r[table].items():
                cols.setdefault(k, []).extend(unpack(v).tolist())
        doc[table] = cols
    return doc


@router.get("/records")
async def records(request: Request) -> Response:
    try:
        per_rank = await _rpc(request, "tpcomm_records")
    except _HTTPError as e:
        return _error(e)
    # Merging and encoding a full buffer takes ~1 s: off the event loop, so token streams keep flowing.
    body = await asyncio.to_thread(lambda: json.dumps(merge_records(per_rank), separators=(",", ":")))
    return Response(body, media_type="application/json")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    from tpcomm.hook.metrics import prometheus_text

    try:
        per_rank = await _rpc(request, "tpcomm_records")
    except _HTTPError as e:
        return _error(e)
    text = await asyncio.to_thread(lambda: prometheus_text(merge_records(per_rank)))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
