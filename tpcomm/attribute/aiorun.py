"""Run one round of load on an event loop, with Ctrl-C landing only where it can be handled.

`asyncio.run` leaves windows either side of the coroutine: a Ctrl-C while the loop is being built or closed
raises KeyboardInterrupt inside asyncio's own constructors, leaving a half-built loop whose finaliser prints a
traceback ("'_UnixSelectorEventLoop' object has no attribute '_ssock'") and a coroutine never awaited (CI hit
it on a 2-core machine); and a closed loop is freed later by the cycle collector, at any moment: a Ctrl-C
during its finaliser is printed as "Exception ignored" and lost. Here, while a round's loop lives and until
it is collected, a Ctrl-C outside the running round is held and raised once the loop is gone; a Ctrl-C while
the round runs cancels it (as asyncio.run does), so the caller keeps its clients' finished rows. A held press
wins over whatever else ended the round (a server gone, a worker stalled): the user asked to stop.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import traceback
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
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
            return  # the loop is being built or closed: raised once it is gone
        if self.presses == 1:
            task.cancel()
            self.loop.call_soon_threadsafe(lambda: None)  # wake the selector
            return
        self.task = None  # presses from here on are held while the loop closes
        raise KeyboardInterrupt  # a second press while the round still winds down: stop now


def _release_frames(error: BaseException | None) -> None:
    """The locals of the frames an error passed through (and of its causes) are dropped, its traceback lines
    kept: those locals hold the round's task and loop, which would then wait for a later collection."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


@contextmanager
def ctrl_c_held():
    """Ctrl-C held for the block (a clean-up that must reach the server), then raised; in the main thread with
    Python's own handler only, else the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield
        return
    presses: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: presses.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if presses:
        raise KeyboardInterrupt


def run(make: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(make())`, except that Ctrl-C outside the round is held (see the module's docstring).

    `make` builds the coroutine only once the loop runs, so an early Ctrl-C leaves none unawaited.
    """
    if asyncio._get_running_loop() is not None:
        raise RuntimeError("aiorun.run() cannot be called from a running event loop")
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is not signal.default_int_handler:
        # Signal handlers belong to the main thread; and where someone else owns Ctrl-C (an embedding program,
        # SIG_IGN) it stays theirs.
        return asyncio.run(make())
    ctrl_c = _CtrlC()

    async def main() -> T | None:
        ctrl_c.loop = asyncio.get_running_loop()
        ctrl_c.task = asyncio.current_task()
        try:
            if ctrl_c.presses:  # pressed while the loop was built: no round at all
                return None
            return await make()
        finally:
            ctrl_c.task = None

    signal.signal(signal.SIGINT, ctrl_c)
    result: T | None = None
    error: BaseException | None = None
    try:
        with asyncio.Runner() as runner:
            result = runner.run(main())
        del runner
    except BaseException as e:  # noqa: BLE001 - raised below, after the loop is gone and Ctrl-C is Python's again
        error = e
    finally:
        ctrl_c.loop = None
        if ctrl_c.presses and isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)):
            error = None  # the press's own: a KeyboardInterrupt is raised below
        _release_frames(error)
        gc.collect()  # the closed loop and its transports finalised now, while a press is still held (~25 ms)
        signal.signal(signal.SIGINT, previous)
    if ctrl_c.presses and not isinstance(error, SystemExit):
        raise KeyboardInterrupt from (None if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)) else error)
    if error is not None:
        raise error
    return result
