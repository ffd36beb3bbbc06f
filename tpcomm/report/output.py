"""Where a report may be written: a regular file (new or existing) in a writable folder, nothing else.

`report --out /dev/full` once replaced the device node with a PDF (the PDF is
written to a temporary file and renamed over the target). A target that exists
and is not a regular file (device, directory, FIFO, socket) is refused, and so
is a symbolic link, whatever it names: run directories are shared, and a link
planted at report.pdf once had `report` overwrite the file it named. A folder
or file we cannot write: one line, exit 2. The write itself goes through
safefs.write_atomic, which refuses a link planted after this check too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.rundir import safefs


def check_target(path: Path, option: str = "--out") -> Path:
    """The path, made absolute, when a report can be written there; InputError otherwise."""
    p = Path(path).expanduser()
    if p.is_symlink():
        raise InputError(
            f"{option} {path}",
            f"is a symbolic link (to {os.readlink(p)}); tpcomm does not write through links",
            "a new file name or an existing regular file",
        )
    if p.exists():
        try:
            mode = os.stat(p).st_mode
        except OSError as e:
            raise InputError(f"{option} {path}", f"cannot be inspected ({e.strerror})", "a regular file path") from None
        if not stat.S_ISREG(mode):
            raise InputError(
                f"{option} {path}",
                f"exists and is {safefs.kind(mode)}; tpcomm writes only regular files",
                "a new file name or an existing regular file",
            )
        # Root may write anything: a file without write bits is still the owner's "do not overwrite".
        if not os.access(p, os.W_OK) or not os.stat(p).st_mode & 0o222:
            raise InputError(f"{option} {path}", "is not writable (read-only file)", "a writable file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{option} {path}", f"its folder {parent} does not exist", "a path in an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}", f"its folder {parent} is not writable", "a path in a writable folder")
    return p.absolute()
