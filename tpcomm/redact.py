"""Secrets never reach a run directory, a log or a report.

Run directories and reports are meant to be shared, so everything tpcomm writes
passes through here: command lines (`--api-key K` -> `--api-key ***`), URLs
(`http://user:pw@host/?token=T` -> `http://user:***@host/?token=***`) and, as a
last line of defence, any text that contains a secret this process was handed
(`register()`; `RunDir.write_json` scrubs every document with `scrub()`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# Options whose value is a secret (vLLM's and tpcomm's spellings, and the usual hub/token ones).
SECRET_OPTIONS = ("--api-key", "--token", "--hf-token", "--password", "--secret", "--auth", "--authorization")
# URL query parameters that carry credentials.
_SECRET_PARAM = re.compile(r"(key|token|secret|password|passwd|auth|signature|sig|credential)", re.I)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", re.I)
_BEARER = re.compile(r"(Bearer\s+)[^\s'\"]+", re.I)

_registered: set[str] = set()


def register(secret: str | None) -> None:
    """Remember a secret value so that `scrub()` removes it from anything written later."""
    if secret and len(secret) >= 3:  # a 1-2 character "secret" would mask ordinary text
        _registered.add(secret)


def url(u: str) -> str:
    """The URL with its password and credential-like query values masked."""
    try:
        p = urlsplit(u)
    except ValueError:
        return u
    netloc = p.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name = user.split(":", 1)[0]
        netloc = f"{name}:{MASK}@{host}" if ":" in user else f"{MASK}@{host}"
    query = p.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAM.search(k) for k, _ in pairs):
            query = urlencode([(k, MASK if _SECRET_PARAM.search(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((p.scheme, netloc, p.path, query, p.fragment))


def text(s: str) -> str:
    """Mask URLs' credentials, bearer tokens and registered secrets inside free text."""
    s = _URL.sub(lambda m: url(m.group(0)), s)
    s = _BEARER.sub(lambda m: m.group(1) + MASK, s)
    for secret in _registered:
        s = s.replace(secret, MASK)
    return s


def argv(args: list[str]) -> list[str]:
    """A command line fit to record: secret option values become ***, URLs lose their credentials."""
    out: list[str] = []
    mask_next = False
    for a in map(str, args):
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        opt, eq, _ = a.partition("=")
        if opt in SECRET_OPTIONS:
            if eq:
                out.append(f"{opt}={MASK}")
            else:
                out.append(a)
                mask_next = True
            continue
        out.append(text(a))
    return out


def scrub(obj: Any) -> Any:
    """A JSON-like document with every string passed through `text()`."""
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v) for v in obj]
    return obj
