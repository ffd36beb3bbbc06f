"""HTTP reads with a size bound and a deadline, for servers tpcomm does not control.

httpx's `timeout` bounds each read, not the whole body: a `/v1/models` that sends one byte every 2 s kept
`attribute` waiting with no end, and a 1.5 GB body took 4.1 GB of memory. Here the body is read chunk by chunk
and the request ends (an httpx error, so callers' handlers stay as they are) when the body passes `limit`
bytes (checked on Content-Length first, then on what arrives, after decompression) or the whole exchange
passes `timeout_s` (at most one read's timeout later). The response handed back holds the body in memory and
has no Content-Encoding any more (it was decoded here), so `.json()` / `.text` work as on any response.

Units: bytes, seconds.
"""

from __future__ import annotations

import functools
import ssl
import time
from typing import Any

import httpx

SMALL = 16 << 20  # a model list, a /tokenize answer, a hook status: kB in practice
RECORDS_PAGE = 512 << 20  # one page of hook records (PAGE_ROWS rows of a few columns: tens of MB)


@functools.cache
def _context(verify: bool) -> ssl.SSLContext:
    return httpx.create_ssl_context(verify=verify)


def tls(verify: Any = True) -> Any:
    """httpx's `verify` as one SSL context per setting for the whole process. httpx builds a fresh context for
    every client it makes, loading the CA bundle each time: 0.3 s of CPU here, 10 times in one `attribute`
    run (3.9 of its 14.2 s, http:// included). True (system CAs, SSL_CERT_FILE) and False are built once; a
    context given (--ca-cert) is used as it is. SSL_CERT_FILE / SSL_CERT_DIR are read when the first context is
    built, as httpx reads them per client: set them before the first request of the process."""
    return _context(verify) if isinstance(verify, bool) else verify


class BodyTooLarge(httpx.HTTPError):
    """The server sent more than the reader takes."""


class DeadlineExceeded(httpx.ReadTimeout):
    """The whole exchange took longer than its deadline (a slow drip: every single read was on time)."""


def request(
    method: str,
    url: str,
    *,
    limit: int = SMALL,
    timeout_s: float = 10.0,
    client: httpx.Client | None = None,
    verify: Any = True,
    **kw: Any,
) -> httpx.Response:
    """`method url` through `client` (or a fresh one), the body read whole within `limit` bytes and `timeout_s`
    seconds in all; BodyTooLarge / DeadlineExceeded (httpx errors) otherwise."""
    deadline = time.monotonic() + timeout_s
    own = client is None
    c = httpx.Client(timeout=timeout_s, verify=tls(verify)) if own else client
    try:
        with c.stream(method, url, **kw) as r:
            declared = r.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise BodyTooLarge(f"{method} {url}: the body is {int(declared)} bytes, more than the {limit} read")
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise BodyTooLarge(f"{method} {url}: the body passed {limit} bytes")
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"{method} {url}: the body was still arriving after {timeout_s:g} s", request=r.request
                    )
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"{method} {url}: the answer took more than {timeout_s:g} s", request=r.request)
            headers = [
                (k, v)
                for k, v in r.headers.multi_items()
                if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
            ]
            return httpx.Response(r.status_code, headers=headers, content=bytes(body), request=r.request)
    finally:
        if own:
            c.close()
