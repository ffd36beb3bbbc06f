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
followed it. Units: t_*_ns wall clock (time.time_ns), *_s seconds.
"""

from __future__ import annotations

import os
import select
import threading
import time
from dataclasses import asdict, dataclass

from tpcomm.attribute import load, records
from tpcomm.attribute.server import ServerInfo
from tpcomm.hook.client import HookClient, HookUnavailable
from tpcomm.procid import identity

POLL_S = 1.0  # HTTP polls of workers not watched through a pidfd (each poll is one request to the API server)
GRACE_S = 5.0  # after requests failed: how long stop() waits for a watched worker to be seen dead


@dataclass
class RankDeath:
    rank: int
    pid: int
    t_ns: int  # when the watch first saw it dead (at once through a pidfd; within POLL_S over HTTP)
    concurrency: int
    same_time: list[int]  # other ranks already dead at the same look (which went first is unknown)
    others: list[int]  # ranks seen dead at later looks (vLLM shuts the rest down after the first)
    seen_by: str = "pidfd"  # "pidfd" (on this machine, at once) or "hook poll" (GET /tpcomm/v1/workers)

    def message(self, level_start_ns: int | None = None, while_: str | None = None) -> str:
        """`while_`: what the run was doing when the death was seen, if not running the level's requests."""
        when = time.strftime("%H:%M:%S", time.gmtime(self.t_ns / 1e9))
        into = f", while {while_}" if while_ else ""
        if level_start_ns:  # the watch starts before the level's recording and requests: a death may precede them
            s = (self.t_ns - level_start_ns) / 1e9
            into = f", {s:.1f} s into the level" if s >= 0 else ", before the level's first request"
        also = f" (rank(s) {_join(self.same_time)} found dead at the same moment)" if self.same_time else ""
        after = f"; vLLM then shut down rank(s) {_join(self.others)}" if self.others else ""
        return f"TP rank {self.rank} (pid {self.pid}) died during C={self.concurrency} at {when} UTC{into}{also}{after}"

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
    polled through GET /tpcomm/v1/workers every `poll_s`. A server whose hook lacks the route (older tpcomm)
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
        # One connection for every look: start(), then the HTTP watch thread only (and stop() after joining it).
        self._hook = HookClient(info.url, api_key=info.api_key, timeout_s=5, keep_alive=True)

    def start(self) -> RankWatch:
        try:
            ws = self._hook.workers()
        except records.HookError as e:
            # An older hook without the route answers 404: say that, not the plugin's enable hint.
            self.note = "TP ranks not watched: " + (
                "the server's tpcomm hook has no /tpcomm/v1/workers route (an older tpcomm)"
                if isinstance(e, HookUnavailable)
                else str(e)
            )
            return self
        if not ws:
            self.note = "the hook listed no workers: TP ranks not watched"
            return self
        self._open_pidfds(ws)
        # A worker already dead at the first look (it died between the level's start and this look, or the
        # pid now names another process) is a death all the same: named now, not a poll later.
        gone = [(int(w["rank"]), int(w["pid"])) for w in ws if w.get("alive") is False]
        if gone:
            self._record(gone, time.time_ns(), "hook poll")
        if self._fds:
            self._wake = os.pipe()
            self._threads.append(threading.Thread(target=self._run_local, name="tpcomm-rank-pidfd", daemon=True))
        if len(self.local) < len(ws):
            self._threads.append(threading.Thread(target=self._run_http, name="tpcomm-rank-watch", daemon=True))
        for t in self._threads:
            t.start()
        return self

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
            if any(t.name == "tpcomm-rank-watch" for t in self._threads):
                self._look()
            self._threads = []
            for fd in list(self._fds) + list(self._wake or ()):
                os.close(fd)
            self._fds, self._wake = {}, None
            self._hook.close()
        return self.death

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
        while self._fds and not self._stop.is_set():
            self._poll_local(None)

    def _poll_local(self, timeout_ms: int | None) -> None:
        """Wait for a death (None: until one or stop()); record every rank whose pidfd is readable, at once."""
        poller = select.poll()
        for fd in self._fds:
            poller.register(fd, select.POLLIN)
        if self._wake is not None and timeout_ms is None:
            poller.register(self._wake[0], select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout_ms)}
        now = time.time_ns()
        dead = [self._fds.pop(fd) for fd in sorted(ready) if fd in self._fds]
        for fd in sorted(ready):
            if self._wake is None or fd != self._wake[0]:
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
            ws = self._hook.workers()
        except records.HookError:
            return False
        # alive None: on another node, not known from here; ranks with a pidfd are judged by it alone
        dead = [(int(w["rank"]), int(w["pid"])) for w in ws if w.get("alive") is False and w["rank"] not in self.local]
        if dead:
            self._record(dead, time.time_ns(), "hook poll")
        return True

    def _record(self, dead: list[tuple[int, int]], now: int, seen_by: str) -> None:
        with self._lock:
            if self.death is None:
                rank, pid = min(dead)
                self.death = RankDeath(
                    rank, pid, now, self.concurrency, sorted(r for r, _ in dead if r != rank), [], seen_by
                )
                self._seen.set()
                return
            d = self.death
            d.others = sorted((set(d.others) | {r for r, _ in dead}) - {d.rank} - set(d.same_time))


class RankDied(load.ServerGone):
    """A TP worker died during a level: the run stops there, naming it."""

    def __init__(self, death: RankDeath, message: str):
        super().__init__([])
        self.death, self.reason = death, message
