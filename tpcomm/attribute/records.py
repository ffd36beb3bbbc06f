"""The hook's routes for `attribute`, through the one hook client (tpcomm/hook/client.py).

start/stop/fetch take the ServerInfo that check_server() built (URL and key);
every failure is a `HookError` (an InputError), the client's one error type.
"""

from __future__ import annotations

import pandas as pd

from tpcomm.attribute.server import ServerInfo
from tpcomm.hook.client import HookClient, HookError, merge, records_to_frames

__all__ = ["HookError", "start", "stop", "fetch", "merge", "from_columnar"]


def _client(info: ServerInfo, timeout_s: float = 60) -> HookClient:
    return HookClient(info.url, api_key=info.api_key, timeout_s=timeout_s)


def start(info: ServerInfo) -> dict:
    return _client(info).start()


def stop(info: ServerInfo) -> dict:
    return _client(info).stop()


def fetch(info: ServerInfo, timeout_s: float = 120) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(collectives, steps, meta) recorded since the last start, all ranks."""
    return _client(info, timeout_s).frames()


from_columnar = records_to_frames
