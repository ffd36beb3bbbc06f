"""Watch the server's TP workers during a level, so that a worker that dies is named.

vLLM 0.32's multiprocessing executor answers the death of one worker by
shutting the whole engine down (MultiprocExecutor.start_worker_monitor):
it closes the other workers' death pipe at once (they exit, or are
terminated after a grace period), the engine fails every request, and the
API server stops answering within about a second. From the client all that
shows is requests failing and then a server that no longer answers. The
hook's status names each worker's pid and process identity, so a client on
the same machine watches the pids themselves (pidfd) and sees the first
death as it happens; the hook's GET /tpcomm/v1/workers says which worker
pids are alive without reaching the engine, polled for workers seen only
over HTTP. The first rank seen dead is the one that failed first, the others
followed it.

Two more ways a run is not one rank's death (issue 22): a worker stopped
(SIGSTOP, a debugger: alive, process state T, answering nothing; seen in
/proc here or in the route's `state` for workers elsewhere), named once it
stays stopped STOPPED_S, so the level ends then instead of after every
request's timeout; and the whole server killed at once (the API server's own
pid, which the route reports, ends before the first rank or at most WHOLE_S
after it): then no rank is blamed. Units: t_*_ns wall clock (time.time_ns),
*_s seconds.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

from tpcomm.attribute import load, records
from tpcomm.attribute.hook_client import HookClient, HookTimeout, HookUnavailable
from tpcomm.attribute.server import ServerInfo
from tpcomm.procid import identity

# HTTP polls (GET /tpcomm/v1/workers, no engine round trip) during a level: of workers not watched through a
# pidfd, and always of the API server's own shutdown note. On SIGTERM vLLM 0.32 stops the engine client while HTTP
# still answers (launchers/launcher.py, handle_shutdown) and closes HTTP as soon as that returns: asking only after
# a worker's death came too late (issue 32 item 2), so the watch reads the note all along.
POLL_S = 1.0
GRACE_S = 5.0  # after requests failed: how long stop() waits for a watched worker to be seen dead
STOPPED_S = 5.0  # a worker stopped (state T) this long has stopped answering: the level ends
DEATH_ABORT_S = 3.0  # a worker dead this long and requests still in flight: they cannot finish (RankWatch.dead_for)
# The API server dying at most this long after the first rank (or before it) is a whole-server stop: when one
# rank fails, vLLM's engine core shuts the rest down and the API server exits only after it noticed (seconds).
WHOLE_S = 0.25  # measured: a whole-group SIGKILL had the API server end 150 ms before rank 0's exit was seen
# The level's first look at the workers: one late answer (a loaded host: 2 cores, TP workers spinning) is asked
# again, LOOK_TIMEOUT_S each, before the level goes unwatched. CI failed once so (stop 38): the look timed out, a
# worker killed in that level was then told as "server stopped answering".
START_TRIES = 3
LOOK_TIMEOUT_S = 5.0
CALL_POLL_S = 0.05  # RankWatch.call: how often a hook call in flight checks for a death seen meanwhile
T = TypeVar("T")
_STOPPED_STATES = ("T", "t")


@dataclass
class RankDeath:
    rank: int
    pid: int
    t_ns: int  # when the watch first saw it dead (at once through a pidfd; within POLL_S over HTTP)
    concurrency: int
    same_time: list[int]  # other ranks already dead at the same look (which went first is unknown)
    others: list[int]  # ranks seen dead at later looks (vLLM shuts the rest down after the first)
    seen_by: str = "pidfd"  # "pidfd" (on this machine, at once) or "hook poll" (GET /tpcomm/v1/workers)
    # every rank and the API server died together (killed at once): no rank is to blame
    whole_server: bool = False
    api_server_after_ms: float | None = None  # when the API server died, after the first rank (< 0: before)
    # the API server began its own shutdown (SIGTERM, SIGINT) this long before the first rank ended: the ranks
    # were stopped by it, no rank is to blame (GET /tpcomm/v1/workers' api_server.shutdown_ns)
    shutdown_before_ms: float | None = None

    @property
    def server_shutdown(self) -> bool:
        return self.shutdown_before_ms is not None and self.shutdown_before_ms >= 0

    def message(self, level_start_ns: int | None = None, while_: str | None = None) -> str:
        """`while_`: what the run was doing when the death was seen, if not running the level's requests."""
        when = time.strftime("%H:%M:%S", time.gmtime(self.t_ns / 1e9))
        into = ""
        if level_start_ns:  # the watch starts before the level's recording and requests: a death may precede them
            s = (self.t_ns - level_start_ns) / 1e9
            into = f", {s:.1f} s into the level" if s >= 0 else ", before the level's first request"
        into += f", {while_}" if while_ and level_start_ns else f", while {while_}" if while_ else ""
        if self.server_shutdown:
            return (
                f"the vLLM server shut down during C={self.concurrency} at {when} UTC{into}: its API server began "
                f"shutting down {self.shutdown_before_ms:.0f} ms before TP rank {self.rank} ended (SIGTERM or "
                "SIGINT to the API server, e.g. an orchestrator's restart), not a rank's failure"
            )
        if self.whole_server:
            ms = self.api_server_after_ms or 0.0
            rel = f"{abs(ms):.0f} ms {'before' if ms < 0 else 'after'}"
            return (
                f"the whole vLLM server stopped during C={self.concurrency} at {when} UTC{into}: its API server "
                f"ended {rel} TP rank {self.rank} (killed together, e.g. the process group or the container; "
                "after one rank's failure vLLM's API server ends only seconds later), not one rank's failure"
            )
        also = f" (rank(s) {_join(self.same_time)} found dead at the same moment)" if self.same_time else ""
        after = f"; vLLM then shut down rank(s) {_join(self.others)}" if self.others else ""
        return f"TP rank {self.rank} (pid {self.pid}) died during C={self.concurrency} at {when} UTC{into}{also}{after}"

    def to_dict(self) -> dict:
        return {**asdict(self), "server_shutdown": self.server_shutdown}


@dataclass
class RankStopped:
    """A TP worker alive but stopped (process state T: SIGSTOP or a debugger) for at least STOPPED_S."""

    rank: int
    pid: int
    state: str
    since_ns: int  # when first seen stopped
    concurrency: int | None  # None: before the first level

    def message(self) -> str:
        when = time.strftime("%H:%M:%S", time.gmtime(self.since_ns / 1e9))
        during = f"during C={self.concurrency}" if self.concurrency else "before the first level"
        return (
            f"TP rank {self.rank} (pid {self.pid}) stopped answering {during}: its process is stopped "
            f"(state {self.state}: SIGSTOP or a debugger), seen at {when} UTC"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _join(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


class RankWatch:
    """Watches the TP workers from start() to stop(); `death` is the first rank seen dead.

    Workers on this machine (the pid the hook reports is the same process here: tpcomm.procid) are watched
    through pidfds, one thread blocked in poll(): a death is seen when it happens, so the rank that died first
    is told from the ranks vLLM shut down after it (its executor closes their death pipe at once, and the API
    server stops answering within a second, before a poll over HTTP may see anything). Workers elsewhere are
    polled through GET /tpcomm/v1/workers every `poll_s`, which also reads the API
    server's own shutdown (SIGTERM) while it still answers. A server whose hook lacks the route (older tpcomm)
    is not watched; `note` says so."""

    def __init__(self, info: ServerInfo, concurrency: int, poll_s: float = POLL_S):
        self.info, self.concurrency, self.poll_s = info, concurrency, poll_s
        self.death: RankDeath | None = None
        self.note: str | None = None
        self.local: dict[int, int] = {}  # rank -> pid, watched here through a pidfd
        self._fds: dict[int, tuple[int, int]] = {}  # pidfd -> (rank, pid), still alive
        self._wake: tuple[int, int] | None = None  # pipe that ends the pidfd thread's poll()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen = threading.Event()  # set at the first death recorded
        self._threads: list[threading.Thread] = []
        self.api: tuple[int, int] | None = None  # (pidfd, pid) of the API server, when on this machine
        self._api_note: str | None = None  # where that API server notes its shutdown (publish.ShutdownNote)
        self._api_dead_ns: int | None = None
        # rank -> (pid, state, first seen stopped: wall clock, monotonic clock). How long is the monotonic
        # clock's: a step of the wall clock (NTP) does not make a worker stopped for a moment look stopped long.
        self._stopped_since: dict[int, tuple[int, str, int, int]] = {}
        self._shutdown_ns: int | None = None  # when the API server began its own shutdown, if it said so
        self._death_mono: float | None = None  # when the first death was seen (monotonic clock)
        self._asking: threading.Thread | None = None
        self._remote = False  # workers not on this machine (watched through the HTTP look alone)
        # One connection for every look: start(), then the HTTP watch thread only (and stop() after joining it).
        self._hook = HookClient(
            info.url, api_key=info.api_key, timeout_s=LOOK_TIMEOUT_S, keep_alive=True, verify=info.verify
        )

    def start(self) -> RankWatch:
        doc = self._first_look()
        if doc is None:
            return self
        ws = list(doc.get("workers") or [])
        if not ws:
            self.note = "the hook listed no workers: TP ranks not watched"
            return self
        self._open_pidfds(ws)
        self._open_api(doc.get("api_server") or {})
        self._shutdown_ns = None
        # A worker already dead at the first look (it died between the level's start and this look, or the
        # pid now names another process) is a death all the same: named now, not a poll later.
        gone = [(int(w["rank"]), int(w["pid"])) for w in ws if w.get("alive") is False]
        if gone:
            self._record(gone, time.time_ns(), "hook poll")
        if self._fds:
            self._wake = os.pipe()
            self._look_states()
            self._threads.append(threading.Thread(target=self._run_local, name="tpcomm-rank-pidfd", daemon=True))
        # Always: workers elsewhere are polled here, and the API server's own shutdown is noted before it ends.
        self._remote = len(self.local) < len(ws)
        self._threads.append(threading.Thread(target=self._run_http, name="tpcomm-rank-watch", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def _first_look(self) -> dict | None:
        """The workers' pids and identities; None (and `note` says why) when they cannot be had."""
        for attempt in range(START_TRIES):
            try:
                return self._hook.workers_doc()
            except HookTimeout as e:  # late, not absent: look again
                if attempt < START_TRIES - 1:
                    continue
                why = f"{e} ({START_TRIES} looks)"
            except records.HookError as e:
                # An older hook without the route answers 404: say that, not the plugin's enable hint.
                why = (
                    "the server's tpcomm hook has no /tpcomm/v1/workers route (an older tpcomm)"
                    if isinstance(e, HookUnavailable)
                    else str(e)
                )
            self.note = "TP ranks not watched: " + why
            return None

    def stop(self, requests_failed: bool = False) -> RankDeath | None:
        """Stop watching; one last look first, so a death just before the end is not missed.

        requests_failed: the caller saw requests fail (or the server go). A pidfd turns readable only when the
        worker's exit has completed, while the pipes and sockets vLLM watches close earlier in that exit (and
        a loaded machine may run the watch thread late); so with no death seen yet, wait up to GRACE_S for a
        watched worker to be seen dead before stopping. A second call only returns `death`."""
        if self._stop.is_set():
            return self.death
        try:
            if requests_failed and self._fds and self.death is None:
                self._seen.wait(GRACE_S)
        finally:  # even when interrupted in the wait: no thread or pidfd left behind
            self._stop.set()
            if self._wake is not None:
                os.write(self._wake[1], b"x")
            for t in self._threads:
                t.join(timeout=10)
            if self._fds:
                self._poll_local(0)
            # One last look for workers elsewhere (the HTTP thread is theirs), and only with that thread ended: it
            # shares the one connection, closed below.
            alive = [t for t in self._threads if t.is_alive()]
            if self._remote and not alive:
                self._look()
            self._threads = []
            if self._asking is not None:
                self._asking.join(timeout=5)
            if self.death is not None:
                self._read_note()
            if self.death is not None and self._shutdown_ns is not None:
                self._note_shutdown(self._shutdown_ns)
            self._whole_server()
            for fd in list(self._fds) + list(self._wake or ()) + ([self.api[0]] if self.api else []):
                os.close(fd)
            self._fds, self._wake, self.api = {}, None, None
            if not alive:
                self._hook.close()
        return self.death

    def call(self, fn: Callable[..., T], *args, give_up: str | None = None, **kwargs) -> T:
        """fn(*args, **kwargs), given up as soon as a watched worker is seen dead (DeathSeen, a ServerGone). A
        dead worker never answers the hook (its routes are collective RPCs to every worker): a call after a
        death waited out its whole timeout, 30 s after a worker killed just after a level's requests, and the
        level was also flagged "a worker hung?" (2026-12-07). Once the watch has stopped, or watches nothing,
        fn runs as it is. A call given up goes on in a daemon thread until its own timeout; `give_up` names a
        keyword of fn's that takes a threading.Event, set when the call is given up (at a death or Ctrl-C), so
        a paged pull stops at its next page instead of holding the server's one pull slot to the end."""
        if self.death is not None:
            raise DeathSeen([])
        flag = threading.Event()
        if give_up is not None:
            kwargs[give_up] = flag
        if self._stop.is_set() or not self._threads:
            return fn(*args, **kwargs)
        box: dict = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=run, name="tpcomm-hook-call", daemon=True).start()
        try:
            while not done.wait(CALL_POLL_S):
                if self.death is not None:
                    raise DeathSeen([])
        except BaseException:  # the death above, or Ctrl-C in the wait
            flag.set()
            raise
        if "error" in box:
            raise box["error"]
        return box["value"]

    def stopped(self, min_s: float = STOPPED_S) -> RankStopped | None:
        """A worker stopped (state T) for at least `min_s` without a break, as of the latest look."""
        now = time.monotonic_ns()
        with self._lock:
            for rank, (pid, st, since, since_mono) in sorted(self._stopped_since.items()):
                if now - since_mono >= min_s * 1e9:
                    return RankStopped(rank, pid, st, since, self.concurrency)
        return None

    def dead_for(self, min_s: float = DEATH_ABORT_S) -> bool:
        """A worker was seen dead at least `min_s` ago. Its engine cannot finish the requests in flight, and
        vLLM 0.32's API server, shutting down, keeps their streams open until the client closes them (uvicorn
        waits for open connections; the streams wait for an engine that is gone): the round is ended then."""
        with self._lock:
            return self._death_mono is not None and time.monotonic() - self._death_mono >= min_s

    def _note_states(self, states: dict[int, tuple[int, str | None]], now: int) -> None:
        with self._lock:
            for rank, (pid, st) in states.items():
                if st in _STOPPED_STATES:
                    self._stopped_since.setdefault(rank, (pid, st, now, time.monotonic_ns()))
                else:
                    self._stopped_since.pop(rank, None)

    def _look_states(self) -> None:
        """The process state of every worker watched here (/proc: no request to the server)."""
        from tpcomm.procid import state

        self._note_states({r: (pid, state(pid)) for r, pid in self.local.items()}, time.time_ns())

    # ---- the API server: its own shutdown, or a whole-server stop, is no rank's death -------------
    def _ask_shutdown(self) -> None:
        """Whether the API server began shutting down before the first death (a fresh connection: the watch's
        own may be busy in its thread)."""
        try:
            api = HookClient(self.info.url, self.info.api_key, timeout_s=3, verify=self.info.verify).workers_doc()
        except records.HookError:
            return
        self._note_shutdown((api.get("api_server") or {}).get("shutdown_ns"))

    def _note_shutdown(self, ns: object) -> None:
        if isinstance(ns, int) and not isinstance(ns, bool) and ns > 0:
            self._shutdown_ns = ns
            d = self.death
            if d is not None:
                d.shutdown_before_ms = (d.t_ns - ns) / 1e6

    def _open_api(self, api: dict) -> None:
        ident, pid = api.get("identity"), api.get("pid")
        if not hasattr(os, "pidfd_open") or not ident or not isinstance(pid, int) or identity(pid) != ident:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        if identity(pid) != ident:
            os.close(fd)
            return
        self.api = (fd, pid)
        note = api.get("shutdown_file")
        self._api_note = note if isinstance(note, str) and note else None

    def _read_note(self) -> None:
        """The API server's shutdown from its note file (on this machine, this uid's: vLLM may close HTTP with
        the workers, before the route could tell it)."""
        if self._shutdown_ns is None and self.api is not None and self._api_note:
            from tpcomm.hook.publish import read_shutdown

            self._note_shutdown(read_shutdown(self._api_note, self.api[1]))

    def _whole_server(self) -> None:
        """Mark the death a whole-server stop when the API server ended with (or before) the first rank."""
        if self.api is not None and self._api_dead_ns is None:
            poller = select.poll()
            poller.register(self.api[0], select.POLLIN)
            if poller.poll(0):
                self._api_dead_ns = time.time_ns()
        d = self.death
        if d is None or self._api_dead_ns is None:
            return
        d.api_server_after_ms = (self._api_dead_ns - d.t_ns) / 1e6
        # The API server ending with the first rank or before it: killed together. (Every rank need not be seen
        # dead yet: a large worker's exit completes last, after its pidfd look.)
        d.whole_server = d.api_server_after_ms <= WHOLE_S * 1e3

    # ---- workers on this machine: pidfds ------------------------------------
    def _open_pidfds(self, ws: list[dict]) -> None:
        if not hasattr(os, "pidfd_open"):
            return
        for w in ws:
            ident, pid = w.get("identity"), int(w["pid"])
            if not ident or w.get("alive") is False or identity(pid) != ident:
                continue  # not this machine, another pid namespace, or gone already: the HTTP poll decides
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            if identity(pid) != ident:  # the pid was reused between the two looks
                os.close(fd)
                continue
            self._fds[fd] = (int(w["rank"]), pid)
            self.local[int(w["rank"])] = pid

    def _run_local(self) -> None:
        # on after the last rank's end while the API server's is still to come (whole_server needs its time)
        while (self._fds or (self.api is not None and self._api_dead_ns is None)) and not self._stop.is_set():
            self._poll_local(None)
            self._look_states()

    def _poll_local(self, timeout_ms: int | None) -> None:
        """Wait for a death (None: until one, stop(), or the next look at the states); record every rank whose
        pidfd is readable, at once, and the API server's end."""
        poller = select.poll()
        for fd in self._fds:
            poller.register(fd, select.POLLIN)
        if self.api is not None and self._api_dead_ns is None:
            poller.register(self.api[0], select.POLLIN)
        if self._wake is not None and timeout_ms is None:
            poller.register(self._wake[0], select.POLLIN)
        ready = {fd for fd, _ in poller.poll(int(self.poll_s * 1000) if timeout_ms is None else timeout_ms)}
        now = time.time_ns()
        if self.api is not None and self.api[0] in ready and self._api_dead_ns is None:
            self._api_dead_ns = now
        worker_fds = [fd for fd in sorted(ready) if fd in self._fds]
        dead = [self._fds.pop(fd) for fd in worker_fds]
        for fd in worker_fds:
            os.close(fd)
        if dead:
            self._record(dead, now, "pidfd")

    # ---- workers elsewhere: the hook's route --------------------------------
    def _run_http(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._look() is False:
                return

    def _look(self) -> bool | None:
        """False once the server stops answering (nothing more to learn from it)."""
        try:
            doc = self._hook.workers_doc()
        except HookTimeout:  # one slow answer on a loaded host: look again next period
            return None
        except records.HookError:
            return False
        if self._shutdown_ns is None:
            self._note_shutdown((doc.get("api_server") or {}).get("shutdown_ns"))
        ws = list(doc.get("workers") or [])
        # alive None: on another node, not known from here; ranks with a pidfd are judged by it alone
        now = time.time_ns()
        remote = [w for w in ws if int(w["rank"]) not in self.local]
        self._note_states({int(w["rank"]): (int(w["pid"]), w.get("state")) for w in remote if w.get("alive")}, now)
        dead = [(int(w["rank"]), int(w["pid"])) for w in remote if w.get("alive") is False]
        if dead:
            self._record(dead, now, "hook poll")
        return True

    def _record(self, dead: list[tuple[int, int]], now: int, seen_by: str) -> None:
        with self._lock:
            if self.death is None:
                rank, pid = min(dead)
                self.death = RankDeath(
                    rank, pid, now, self.concurrency, sorted(r for r, _ in dead if r != rank), [], seen_by
                )
                self._death_mono = time.monotonic()
                self._seen.set()
                # at once: after its engine stopped, an API server that shuts down exits within moments
                self._asking = threading.Thread(target=self._ask_shutdown, name="tpcomm-shutdown-ask", daemon=True)
                self._asking.start()
                return
            d = self.death
            d.others = sorted((set(d.others) | {r for r, _ in dead}) - {d.rank} - set(d.same_time))


class DeathSeen(load.ServerGone):
    """A watched worker was seen dead while the hook was asked (RankWatch.call): the answer was not waited for."""


class RankDied(load.ServerGone):
    """A TP worker died during a level: the run stops there, naming it."""

    def __init__(self, death: RankDeath, message: str):
        super().__init__([])
        self.death, self.reason = death, message
