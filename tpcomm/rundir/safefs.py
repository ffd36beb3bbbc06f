"""Files in folders other people may write to: never written through a link, never read without bounds.

Run directories are meant to be shared (a group folder, a copy from a colleague), and `report` or
`attribute` may run as a user who can write where the folder's owner cannot. So, below the folder the
user named (`root`, which may itself be a link: the user chose it):

- writes create a new file under a random name with O_CREAT|O_EXCL|O_NOFOLLOW and rename it over the
  target, in a folder opened component by component with O_NOFOLLOW: a link planted at the target, at the
  temporary name or at any folder on the way is refused with one line (`UnsafePath`), never followed.
  Files are created 0666 and folders 0777, less the umask: as readable as the operator's umask allows.
- reads take regular files only (a FIFO, a device or a socket is refused before it is opened, so opening
  cannot block or act on a device), opened O_NONBLOCK and checked again on the open descriptor, and no
  larger than a stated bound: a 2 GB sparse file or /dev/zero costs a stat, not the memory.

Units: bytes.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from tpcomm.errors import InputError

MAX_JSON_BYTES = 64 << 20  # any JSON document of a run directory (a summary is ~100 kB)
MAX_TABLE_BYTES = 1 << 30  # any Parquet table (a full hook buffer is ~11 MB per rank and level)


class UnsafePath(InputError):
    """A path tpcomm will not write through or read from (a link, not a regular file, too large)."""


class WriteFailed(InputError):
    """The file system took no more (full, over quota, read-only): one line naming the file; what was written
    before stays whole (every write is a new file renamed into place)."""


# A full or read-only file system is the operator's to fix, not a bug: one line, exit 2.
_FS_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def _fs_full(e: OSError, target: Path) -> WriteFailed:
    return WriteFailed(
        str(target),
        f"cannot be written ({e.strerror or e}); the earlier version of this file, if any, is kept whole",
        "free space on that file system, or another --out",
    )


def kind(mode: int) -> str:
    """What a file is, in words ("a FIFO", "a directory", ...)."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_dir(root: str | os.PathLike, parts: tuple[str, ...] | list[str], create: bool = True) -> int:
    """A descriptor of root/parts[0]/parts[1]/..., each component below `root` a real folder (created 0777
    less the umask when `create`), never a link. The caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = Path(root)
    try:
        for name in parts:
            where = where / name
            if create:
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    raise UnsafePath(
                        str(where),
                        f"is {kind(st.st_mode)}, not a folder; tpcomm does not write through links",
                        "a real folder (remove the link)",
                    ) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(root: str | os.PathLike, rel: str | os.PathLike, data: bytes) -> Path:
    """Write root/rel whole or not at all (new file + rename), refusing a link or non-file at rel."""
    rel = Path(rel)
    dfd = open_dir(root, rel.parts[:-1])
    name, target = rel.name, Path(root) / rel
    try:
        _refuse_non_file(dfd, name, target)
        tmp, fd = _create_tmp(dfd, name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            # rename replaces the name itself: a link planted there since the check is replaced, not followed
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as e:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(e, OSError) and e.errno in _FS_FULL:
                raise _fs_full(e, target) from None
            raise
    except OSError as e:  # the temporary file could not even be created
        if e.errno in _FS_FULL:
            raise _fs_full(e, target) from None
        raise
    finally:
        os.close(dfd)
    return target


def _create_tmp(dfd: int, name: str, access: int = os.O_WRONLY) -> tuple[str, int]:
    """A new, empty file beside `name` under a random name: (that name, a write descriptor)."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
    return tmp, fd


def _refuse_non_file(dfd: int, name: str, target: Path) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(
            str(target),
            f"exists and is {kind(st.st_mode)}; tpcomm writes only regular files, never through links",
            "a new file name or an existing regular file",
        )


def open_new(root: str | os.PathLike, rel: str | os.PathLike, mode: str = "wb", buffering: int = -1):
    """A file object writing a new, empty root/rel that stays open (a log a child process writes, a stream of
    records): created beside under a random name and renamed over rel at once, so a link planted at rel is
    refused (checked) or replaced (planted after the check), never followed. What was at rel is replaced."""
    rel = Path(rel)
    dfd = open_dir(root, rel.parts[:-1])
    name = rel.name
    try:
        _refuse_non_file(dfd, name, Path(root) / rel)
        tmp, fd = _create_tmp(dfd, name, os.O_RDWR if "+" in mode else os.O_WRONLY)
        try:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)
    return os.fdopen(fd, mode, buffering=buffering)


def open_regular(path: str | os.PathLike, limit: int, what: str | None = None):
    """An open binary file object of a regular file of at most `limit` bytes; UnsafePath otherwise.
    Links are followed (a run directory may link a file of another run), but what they name must be a
    regular file: checked before opening (so a FIFO cannot block the open, a device is never opened) and
    again on the descriptor (the name may have changed between)."""
    what = what or str(path)
    st = os.stat(path)
    _check(st, limit, what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafePath(what, "changed while it was being opened", "a file nobody replaces meanwhile")
        _check(fst, limit, what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, limit: int, what: str | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see open_regular)."""
    with open_regular(path, limit, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafePath(what or str(path), f"grew past {limit} bytes while being read", _size_hint(limit))
    return data


def _check(st: os.stat_result, limit: int, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(what, f"is {kind(st.st_mode)}, not a regular file", "a regular file written by tpcomm")
    if st.st_size > limit:
        raise UnsafePath(what, f"is {st.st_size} bytes, more than the {limit} this reader takes", _size_hint(limit))


def _size_hint(limit: int) -> str:
    return f"a file of at most {limit} bytes as tpcomm writes it"
