"""Timing paths switched off for the life of the process, and the test-only fault switch.

Minimal version of the shared interface (branch i27a writes the full fail-safe mechanism; its
version replaces this one at the merge). A site is one place where tpcomm wraps or patches vLLM or
torch, e.g. "graph_capture": `disable(site, reason)` switches that timing path off (idempotent, one
log line the first time), `disabled()` says which are off and why (status lists them), and
`fault(site)` raises where TPCOMM_FAULT=SITE[,SITE...] or TPCOMM_FAULT=all names the site, so tests
can prove that vLLM's own code path runs whatever tpcomm's part does.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm.tpcomm.hook")
FAULT_ENV = "TPCOMM_FAULT"

_DISABLED: dict[str, str] = {}


def disable(site: str, reason: str) -> None:
    """Switch the timing path at `site` off for this process (first reason kept, logged once)."""
    if site in _DISABLED:
        return
    _DISABLED[site] = reason
    logger.warning("tpcomm: %s timing off for this process: %s; serving continues", site, reason)


def disabled() -> dict[str, str]:
    """{site: reason} of the timing paths switched off in this process."""
    return dict(_DISABLED)


def fault(site: str) -> None:
    """Raise when TPCOMM_FAULT names `site` (comma-separated) or is `all`: fault injection for tests."""
    want = {s.strip() for s in os.environ.get(FAULT_ENV, "").split(",") if s.strip()}
    if site in want or "all" in want:
        raise RuntimeError(f"injected fault at {site} ({FAULT_ENV})")
