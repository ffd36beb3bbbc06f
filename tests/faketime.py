"""A process's wall clock moved for real (libfaketime's LD_PRELOAD library, from PyPI's libfaketime), the
monotonic clock left alone: a clock offset between hosts, or a step of the wall clock (NTP correcting a
freshly booted or resumed machine). Faking the monotonic clock too makes this build's sleeps hang."""

from __future__ import annotations

import os
from pathlib import Path


def _lib() -> Path:
    import libfaketime

    lib = Path(libfaketime.__file__).parent / "vendor/libfaketime/src/libfaketime.so.1"
    assert lib.is_file(), lib
    return lib


def offset_env(offset_s: float) -> dict:
    """The environment for a process whose wall clock runs `offset_s` ahead."""
    return {"LD_PRELOAD": str(_lib()), "FAKETIME": f"+{offset_s:g}", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def stepping_env(step_file: Path) -> dict:
    """os.environ for a process whose wall clock follows `step_file` ('+0' now; write '+10' to step it 10 s
    forward, '-3600' an hour back), read at every call."""
    step_file.write_text("+0\n")
    return {
        **os.environ,
        "LD_PRELOAD": str(_lib()),
        "FAKETIME_TIMESTAMP_FILE": str(step_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
