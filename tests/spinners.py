"""Busy processes beside a measurement, for tests that check a figure rises when the CPUs are taken."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True: pass"


@contextmanager
def spinning(args: list[list[str]], settle_s: float = 0.3, new_session: bool = False) -> Iterator[None]:
    """One `python -c SPIN`-like process per entry of `args` (each: the arguments after the interpreter), left
    `settle_s` to be scheduled, killed and reaped when the block ends, whatever happened in it."""
    procs = [subprocess.Popen([sys.executable, *a], start_new_session=new_session) for a in args]
    try:
        time.sleep(settle_s)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
