"""Run a function or a command as another user (nobody) for the shared-folder tests.

The tests run as root here; a forked child that drops to uid/gid 65534 is a real other user to the kernel
(its links are followed by root when fs.protected_symlinks is 0, its files are not root's). Where the
process cannot change uid, `skip_reason()` says why and the tests that need it skip with that reason.
"""

from __future__ import annotations

import os
import pickle
import subprocess
from collections.abc import Callable
from typing import Any

NOBODY = 65534


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return f"acting as another user needs root (this test process runs as uid {os.geteuid()})"
    try:
        r = as_nobody(os.getuid)
    except Exception as e:  # noqa: BLE001 - any failure to switch is a reason to skip
        return f"cannot switch to uid {NOBODY}: {e}"
    return None if r == NOBODY else f"switched to uid {r}, not {NOBODY}"


def as_nobody(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a forked child running as uid/gid 65534; its result, or its exception re-raised here."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001
            out = ("err", e)
        try:
            data = pickle.dumps(out)
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            data = pickle.dumps(("err", RuntimeError(repr(e))))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "err":
        raise value
    return value


def run_as_nobody(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    """A command as uid/gid 65534 (setpriv is util-linux's; the same drop as as_nobody)."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        **kw,
    )
