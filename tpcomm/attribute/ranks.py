"""Watch the server's TP workers during a level, so that a worker that dies is named.

vLLM 0.32's multiprocessing executor answers the death of one worker by
shutting the whole engine down (MultiprocExecutor.start_worker_monitor): the
other workers are terminated after a grace period and the API server exits
some seconds later. From the client all that shows is requests failing and
then a server that no longer answers. The hook's GET /tpcomm/v1/workers says
which worker pids are alive without reaching the engine, so it can be polled
during load; the first rank seen dead is the one that failed first, the others
followed it. Units: t_*_ns wall clock (time.time_ns), *_s seconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tpcomm.attribute import load, records
from tpcomm.attribute.server import ServerInfo
from tpcomm.hook.client import HookClient, HookUnavailable

POLL_S = 1.0  # vLLM takes several seconds to shut the server down after a worker dies


@dataclass
class RankDeath:
    rank: int
    pid: int
    t_ns: int  # when the watch first saw it dead (within POLL_S of the death)
    concurrency: int
    same_time: list[int]  # other ranks already dead at the same look (which went first is unknown)
    others: list[int]  # ranks seen dead at later looks (vLLM shuts the rest down after the first)

    def message(self, level_start_ns: int | None = None) -> str:
        when = time.strftime("%H:%M:%S", time.gmtime(self.t_ns / 1e9))
        into = f", {(self.t_ns - level_start_ns) / 1e9:.1f} s into the level" if level_start_ns else ""
        also = f" (rank(s) {_join(self.same_time)} found dead at the same moment)" if self.same_time else ""
        after = f"; vLLM then shut down rank(s) {_join(self.others)}" if self.others else ""
        return f"TP rank {self.rank} (pid {self.pid}) died during C={self.concurrency} at {when} UTC{into}{also}{after}"

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "t_ns": self.t_ns,
            "concurrency": self.concurrency,
            "same_time": self.same_time,
            "others": self.others,
        }


def _join(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


class RankWatch:
    """Polls /tpcomm/v1/workers in a thread from start() to stop(); `death` is the first rank seen dead.
    A server whose hook lacks the route (older tpcomm) is not watched; `note` says so."""

    def __init__(self, info: ServerInfo, concurrency: int, poll_s: float = POLL_S):
        self.info, self.concurrency, self.poll_s = info, concurrency, poll_s
        self.death: RankDeath | None = None
        self.note: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # One connection for every look, used by the watch thread only (and by stop() after joining it).
        self._hook = HookClient(info.url, api_key=info.api_key, timeout_s=5, keep_alive=True)

    def start(self) -> RankWatch:
        try:
            if not records.workers(self.info):
                self.note = "the hook listed no workers: TP ranks not watched"
                return self
        except records.HookError as e:
            # An older hook without the route answers 404: say that, not the plugin's enable hint.
            self.note = "TP ranks not watched: " + (
                "the server's tpcomm hook has no /tpcomm/v1/workers route (an older tpcomm)"
                if isinstance(e, HookUnavailable)
                else str(e)
            )
            return self
        self._thread = threading.Thread(target=self._run, name="tpcomm-rank-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> RankDeath | None:
        """Stop watching; one last look first, so a death just before the end is not missed."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            self._look()
        self._hook.close()
        return self.death

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._look() is False:
                return

    def _look(self) -> bool | None:
        """False once the server stops answering (nothing more to learn from it)."""
        try:
            ws = self._hook.workers()
        except records.HookError:
            return False
        dead = [w for w in ws if w.get("alive") is False]  # None: on another node, not known from here
        if not dead:
            return True
        now = time.time_ns()
        if self.death is None:
            first = min(dead, key=lambda w: w["rank"])
            same = sorted(int(w["rank"]) for w in dead if w is not first)
            self.death = RankDeath(int(first["rank"]), int(first["pid"]), now, self.concurrency, same, [])
        d = self.death
        d.others = sorted({int(w["rank"]) for w in dead} - {d.rank} - set(d.same_time))
        return True


class RankDied(load.ServerGone):
    """A TP worker died during a level: the run stops there, naming it."""

    def __init__(self, death: RankDeath, message: str):
        super().__init__([])
        self.death, self.reason = death, message
