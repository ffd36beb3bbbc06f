"""Run one round of load on an event loop, with Ctrl-C landing only where it can be handled.

`asyncio.run` leaves a window either side of the coroutine: a Ctrl-C while the loop is being built or closed
raises KeyboardInterrupt inside asyncio's own constructors, leaving a half-built loop whose finaliser prints a
traceback ("'_UnixSelectorEventLoop' object has no attribute '_ssock'") and a coroutine never awaited. CI hit it
on a 2-core machine. Here a Ctrl-C in those windows is held and raised once the loop is closed; a Ctrl-C while
the round runs cancels it (as asyncio.run does), so its clients' finished rows are kept by the caller.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class _CtrlC:
    """The SIGINT handler while a round's loop lives: cancel the running round, else remember the press."""

    def __init__(self) -> None:
        self.presses = 0
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, signum, frame) -> None:
        self.presses += 1
        task = self.task
        if task is None or task.done():
            return  # the loop is being built or closed: raised once it is closed
        if self.presses == 1:
            task.cancel()
            self.loop.call_soon_threadsafe(lambda: None)  # wake the selector
            return
        raise KeyboardInterrupt  # a second press while the round still winds down: stop now


def run(make: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(make())`, except that Ctrl-C outside the round is held (see the module's docstring).

    `make` builds the coroutine only once the loop runs, so an early Ctrl-C leaves none unawaited.
    """
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(make())  # signal handlers belong to the main thread
    ctrl_c = _CtrlC()
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return asyncio.run(make())  # someone else owns Ctrl-C (an embedding program, SIG_IGN): leave it theirs

    async def main() -> T | None:
        if ctrl_c.presses:
            return None
        ctrl_c.loop = asyncio.get_running_loop()
        ctrl_c.task = asyncio.current_task()
        try:
            return await make()
        finally:
            ctrl_c.task = None

    signal.signal(signal.SIGINT, ctrl_c)
    try:
        with asyncio.Runner() as runner:
            try:
                result = runner.run(main())
            except asyncio.CancelledError:
                if not ctrl_c.presses:
                    raise
                result = None
    finally:
        signal.signal(signal.SIGINT, previous)
    if ctrl_c.presses:
        raise KeyboardInterrupt
    return result
