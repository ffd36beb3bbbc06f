"""What the server at --server-url is: reachable, OpenAI-compatible, serving
the model asked for, accepting our key, and whether the tpcomm plugin is on.

Each problem a user can fix becomes an InputError naming the option at fault.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from tpcomm.errors import InputError
from tpcomm.hook.client import ENABLE_HINT, enable_hint  # noqa: F401 - the one enable hint


@dataclass
class ServerInfo:
    url: str
    model: str
    served: list[str]
    root: str | None = None  # the model path the server loaded (a local folder or a hub name)
    max_model_len: int | None = None
    api_key: str | None = None
    plugin: dict[str, Any] | None = None  # GET /tpcomm/v1/status, None when the routes are absent
    plugin_note: str = ""
    fingerprint: str | None = None  # "vllm-0.32.0-tp2-..." from a completion, when seen
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    def enable_hint(self, tp: int | str = "N") -> str:
        return enable_hint(self.root or self.model, tp)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_server(url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 10) -> ServerInfo:
    """Probe the server; raise InputError for anything the user must fix."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError("--server-url", f"{url!r} is not an http(s) URL", "e.g. http://localhost:8000")
    api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
    try:
        r = httpx.get(url + "/v1/models", headers=auth_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as e:
        raise InputError(
            "--server-url", f"cannot reach {url} ({type(e).__name__}: {e})", "a running vLLM OpenAI-compatible server"
        ) from None
    if r.status_code == 401:
        problem = "the server rejected the API key" if api_key else "the server requires an API key"
        raise InputError(
            "--api-key",
            f"{problem} (HTTP 401 from {url}/v1/models)",
            "the key given to vLLM's --api-key (or set OPENAI_API_KEY)",
        )
    try:
        body = r.json()
        served = [m["id"] for m in body["data"]]
    except Exception:
        raise InputError(
            "--server-url",
            f"{url}/v1/models answered HTTP {r.status_code} without an OpenAI model list",
            "an OpenAI-compatible server (vLLM)",
        ) from None
    if not served:
        raise InputError("--server-url", f"{url} serves no model", "a server with a loaded model")
    if model is None:
        if len(served) > 1:
            raise InputError("--model", f"the server serves several models: {', '.join(served)}", "one of them")
        model = served[0]
    if model not in served:
        raise InputError("--model", f"{model!r} is not served by {url}", "one of: " + ", ".join(served))
    card = next(m for m in body["data"] if m["id"] == model)
    info = ServerInfo(
        url=url,
        model=model,
        served=served,
        root=card.get("root"),
        max_model_len=card.get("max_model_len"),
        api_key=api_key,
    )
    info.plugin, info.plugin_note = plugin_status(url, api_key, timeout_s)
    return info


def plugin_status(url: str, api_key: str | None, timeout_s: float = 10) -> tuple[dict | None, str]:
    """The hook's status document (through the one hook client), or None and why not."""
    from tpcomm.hook.client import HookClient, HookError, HookUnavailable

    try:
        doc = HookClient(url, api_key=api_key, timeout_s=timeout_s).status()
    except HookUnavailable:
        return None, "the server has no /tpcomm/v1 routes (plugin not loaded)"
    except (HookError, ValueError) as e:
        return None, f"/tpcomm/v1/status failed ({e})"
    if not doc.get("enabled", True):
        reasons = sorted({str(r.get("disabled_reason")) for r in doc.get("per_rank") or [] if r.get("disabled_reason")})
        return doc, "plugin loaded but disabled: " + ("; ".join(reasons) or "see the server log")
    return doc, "plugin on"


def is_alive(url: str, timeout_s: float = 3) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False
