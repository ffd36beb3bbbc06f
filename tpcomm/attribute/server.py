"""What the server at --server-url is: reachable, OpenAI-compatible, serving
the model asked for, accepting our key, and whether the tpcomm plugin is on.

Each problem a user can fix becomes an InputError naming the option at fault.
TLS: an https URL is verified against the system's CA bundle (certifi's), or
SSL_CERT_FILE / SSL_CERT_DIR when set, or the --ca-cert file; --insecure skips
verification (said on the terminal). Every request of the run (load, hook,
watch) uses the same setting: `ServerInfo.verify`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from tpcomm import jsonsafe, netread
from tpcomm.errors import InputError
from tpcomm.judge.definitions import enable_hint


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
    verify: Any = True  # httpx's `verify`: True (system CAs, SSL_CERT_FILE), an ssl.SSLContext, or False
    plugin_error: Exception | None = None  # why /tpcomm/v1/status failed, when it did (a HookError)

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    def enable_hint(self, tp: int | str = "N") -> str:
        return enable_hint(self.root or self.model, tp)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def clean_key(raw: str | None, source: str = "--api-key") -> str | None:
    """The API key as it goes in a header: surrounding whitespace stripped (a key read from a secret file ends
    in a newline), None when nothing is left; InputError when a character cannot go in an HTTP header. The
    message names the position and kind of character, never the key (httpx's own error quotes the header)."""
    if raw is None:
        return None
    key = raw.strip()
    for i, ch in enumerate(key):
        if not 0x21 <= ord(ch) <= 0x7E:
            what = "a non-ASCII character" if ord(ch) > 0x7E else "a space or control character"
            raise InputError(
                source,
                f"holds {what} at position {i + 1} of {len(key)} (the key is not shown)",
                "the key as given to vLLM's --api-key: printable ASCII without spaces",
            )
    return key or None


def tls_verify(ca_cert: str | None = None, insecure: bool = False) -> Any:
    """httpx's `verify` for --ca-cert / --insecure (default: system CAs, or SSL_CERT_FILE when set)."""
    if insecure:
        return False
    if not ca_cert:
        return True
    import ssl

    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (OSError, ssl.SSLError) as e:
        raise InputError(
            f"--ca-cert {ca_cert}",
            f"cannot be loaded as CA certificates ({getattr(e, 'strerror', None) or e})",
            "a PEM file with the certificate(s) that signed the server's",
        ) from None


def check_server(
    url: str,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 10,
    verify: Any = True,
) -> ServerInfo:
    """Probe the server; raise InputError for anything the user must fix."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError("--server-url", f"{url!r} is not an http(s) URL", "e.g. http://localhost:8000")
    if api_key is None and os.environ.get("OPENAI_API_KEY") is not None:
        api_key = clean_key(os.environ["OPENAI_API_KEY"], "OPENAI_API_KEY")
    else:
        api_key = clean_key(api_key)
    try:  # bounded: a server that drips or sends gigabytes ends in one line (netread.py)
        r = netread.request(
            "GET", url + "/v1/models", headers=auth_headers(api_key), timeout_s=timeout_s, verify=verify
        )
    except netread.BodyTooLarge as e:
        raise InputError(
            "--server-url",
            f"{url}/v1/models: {_one_line(str(e).split(': ', 1)[-1])}",
            "an OpenAI-compatible server (vLLM)",
        ) from None
    except httpx.TimeoutException as e:
        raise InputError(
            "--server-url",
            f"{url}/v1/models did not answer in full within {timeout_s:g} s ({type(e).__name__})",
            "a running vLLM OpenAI-compatible server",
        ) from None
    except httpx.ConnectError as e:
        if "CERTIFICATE_VERIFY_FAILED" in str(e) or "certificate verify failed" in str(e):
            raise InputError(
                "--server-url",
                f"{url}: its TLS certificate could not be verified ({_one_line(str(e))})",
                "--ca-cert FILE with the certificate that signed it (or SSL_CERT_FILE=FILE), or --insecure to "
                "skip verification",
            ) from None
        raise InputError(
            "--server-url", f"cannot reach {url} ({type(e).__name__}: {e})", "a running vLLM OpenAI-compatible server"
        ) from None
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
        body = jsonsafe.loads(r.content, f"{url}/v1/models")
        served = [m["id"] for m in body["data"]]
        if not all(isinstance(m, str) for m in served):
            raise TypeError
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
        root=card.get("root") if isinstance(card.get("root"), str) else None,
        max_model_len=_positive_int(card.get("max_model_len")),
        api_key=api_key,
        verify=verify,
    )
    info.plugin, info.plugin_note, info.plugin_error = plugin_status(url, api_key, timeout_s, verify)
    return info


def plugin_status(
    url: str, api_key: str | None, timeout_s: float = 10, verify: Any = True
) -> tuple[dict | None, str, Exception | None]:
    """The hook's status document (through the one hook client), or None and why not (and the error)."""
    from tpcomm.attribute.hook_client import HookClient, HookError, HookUnavailable

    try:
        doc = HookClient(url, api_key=api_key, timeout_s=timeout_s, verify=verify).status()
    except HookUnavailable as e:
        return None, "the server has no /tpcomm/v1 routes (plugin not loaded)", e
    except (HookError, ValueError) as e:
        return None, f"/tpcomm/v1/status failed ({e})", e
    if not doc.get("enabled", True):
        reasons = sorted({str(r.get("disabled_reason")) for r in doc.get("per_rank") or [] if r.get("disabled_reason")})
        return doc, "plugin loaded but disabled: " + ("; ".join(reasons) or "see the server log"), None
    return doc, "plugin on", None


def is_alive(url: str, timeout_s: float = 3, verify: Any = True) -> bool:
    try:
        return (
            netread.request("GET", url.rstrip("/") + "/health", timeout_s=timeout_s, verify=verify).status_code == 200
        )
    except httpx.HTTPError:
        return False


def _positive_int(v: Any) -> int | None:
    """A field a server that is not vLLM may fill with anything: kept when it is a positive integer."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]
