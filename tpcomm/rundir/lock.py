"""One writer per run directory: the command that writes RUN_DIR holds an exclusive lock on RUN_DIR/.lock
for as long as its process lives (flock: the kernel lets it go when the process ends, kill -9 included).

Two `attribute` runs into one `--out` once mixed their files: the first said "what was measured is in DIR"
while DIR held the second's data, marked complete. Now the second stops before it writes anything, with one
line saying who holds the directory (command, pid, host, since when). The lock file holds that as JSON.

A command the holder starts itself (`tpcomm demo` runs `attribute`, `report`, ... as children into its own run
directory) inherits the right to write: the holder names the directory and its pid in TPCOMM_RUN_LOCK, and
a child that finds the lock held by that pid goes on without taking it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.rundir import safefs

NAME = ".lock"
ENV = "TPCOMM_RUN_LOCK"
_MAX = 4096  # the lock file's document: a few hundred bytes

_held: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of a run directory -> the locked descriptor


class RunDirBusy(InputError):
    """Another process writes this run directory now."""


def lock(path: str | os.PathLike, command: str) -> None:
    """Hold RUN_DIR/.lock for this process (a no-op when it already does); RunDirBusy when another holds it."""
    path = Path(path)
    dfd = safefs.open_dir(path, [], create=False)
    try:
        dst = os.fstat(dfd)
        key = (dst.st_dev, dst.st_ino)
        if key in _held:
            return
        try:  # never through a link planted at .lock; a FIFO there cannot block the open
            fd = os.open(NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise safefs.UnsafePath(
                    str(path / NAME), "is a symbolic link; tpcomm does not write through links", "a regular file"
                ) from None
            raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise safefs.UnsafePath(str(path / NAME), f"is {safefs.kind(st.st_mode)}", "a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            if _inherited(key, holder):
                os.close(fd)
                return
            raise RunDirBusy(
                f"run directory {path}",
                f"is being written by {_who(holder)}; two runs into one directory would mix their files",
                "another --out, or wait for that run to end",
            ) from None
        doc = {"command": f"tpcomm {command}", "pid": os.getpid(), "host": socket.gethostname(), "since_utc": _utc()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(doc) + "\n").encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    _held[key] = fd
    # children this process starts may write here too (a list: one process may hold several directories)
    os.environ[ENV] = ",".join(filter(None, [os.environ.get(ENV), f"{key[0]}:{key[1]}:{os.getpid()}"]))


def holder(path: str | os.PathLike) -> dict | None:
    """Who holds RUN_DIR's lock now ({command, pid, host, since_utc}), or None when nobody does (the run that
    wrote it has ended, however it ended). Never creates anything."""
    try:
        fd = os.open(Path(path) / NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # flock is per open file: this process's own lock blocks this descriptor too
            return _read(fd) or {"command": "a tpcomm command"}
        return None
    finally:
        os.close(fd)


def _read(fd: int) -> dict:
    try:
        doc = json.loads(os.pread(fd, _MAX, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _inherited(key: tuple[int, int], holder: dict) -> bool:
    """The lock is held by the process that started us, for this very directory (see the module docstring)."""
    for item in os.environ.get(ENV, "").split(","):
        try:
            dev, ino, pid = (int(x) for x in item.split(":"))
        except ValueError:
            continue
        if (dev, ino) == key and holder.get("pid") == pid:
            return True
    return False


def _who(h: dict) -> str:
    def clean(v: object) -> str:  # the file is writable by whoever may write the folder: printable, short
        return "".join(c for c in str(v) if c.isprintable())[:80]

    if not h:
        return "another tpcomm process"
    return (
        f"`{clean(h.get('command', 'tpcomm'))}` (pid {clean(h.get('pid', '?'))} on {clean(h.get('host', '?'))}, "
        f"since {clean(h.get('since_utc', '?'))})"
    )


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
