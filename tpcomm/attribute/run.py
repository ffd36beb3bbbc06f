"""The whole `tpcomm attribute` job, usable from Python without click.

Order: check the server, warm up, then for each repeat and each concurrency
level: start the hook, run rounds until steady (or max_rounds), stop the hook,
pull its records, and write everything measured so far. Then align, split and
cross-check. A server that dies mid-run leaves the run directory with what was
measured and status.json marking the stage incomplete.

Run-directory files written here (extending rundir/layout.py's):
    load/requests.parquet, load/tokens.parquet, load/levels.json
    hook/collectives.parquet, hook/steps.parquet, hook/meta.json (+ concurrency, repeat columns)
    attribution/steps.parquet          one row per decode step (terms averaged over ranks)
    attribution/steps_by_rank.parquet  one row per (rank, step), all step kinds
    attribution/summary.json           per level split, ceilings, top sites, cross-check
    profile/summary.json               with --profile
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pandas as pd

from tpcomm.analysis import coverage
from tpcomm.analysis.delivery import client_boot_id
from tpcomm.analysis.hostload import HostLoadMeter, reference_figures, reference_runs
from tpcomm.analysis.serverclock import bound_from_start
from tpcomm.attribute import aiorun, load, records
from tpcomm.attribute.levels import level_figures, repeat_spread, steadiness
from tpcomm.attribute.ranks import RankDied, RankStopped, RankWatch
from tpcomm.attribute.server import ServerInfo, check_server, is_alive
from tpcomm.errors import InputError
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir

REQUEST_COLUMNS = [
    "concurrency",
    "repeat",
    "round",
    "in_stats",
    "request_id",
    "ok",
    "error",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "itl_ms_mean",
    "e2e_ms",
    "t_start_ns",
    "t_end_ns",
    "t_end_wall_ns",  # t_end_ns on the wall clock as it read then (differs where the clock was stepped)
    "clock_step_ms",  # the wall clock's step during the request (NaN: none above load.CLOCK_STEP_MS)
    "t_start_mono_ns",  # the monotonic clock at the send and at the last token (durations across requests)
    "t_end_mono_ns",
]


DEAD_IN_FLIGHT = "a TP worker died with requests still in flight"


def _abort_for(watch: RankWatch) -> Callable[[], str | None]:
    """What ends a round early: a worker stopped (state T) for STOPPED_S, or dead for DEATH_ABORT_S with requests
    still in flight (their engine is gone; vLLM 0.32's API server, shutting down on SIGTERM, keeps their streams
    open until the client closes them, which it would otherwise do only at --timeout, 300 s)."""

    def abort() -> str | None:
        if s := watch.stopped():
            return s.message()
        return DEAD_IN_FLIGHT if watch.dead_for() else None

    return abort


def clock_step_flag(req: pd.DataFrame) -> str | None:
    """What a wall-clock step during the level's requests did, or None: their times against the hook's stamps
    are off by the step from it on (the load's RequestClock keeps each request's own differences right)."""
    if "clock_step_ms" not in req.columns:
        return None
    stepped = req[pd.to_numeric(req["clock_step_ms"], errors="coerce").notna()]
    if stepped.empty:
        return None
    steps = ", ".join(
        f"{float(v):+.1f} ms in request {int(r)}" for r, v in zip(stepped["request_id"], stepped["clock_step_ms"])
    )
    return (
        f"the wall clock was stepped during the level ({steps}; NTP or an operator): each request's own times "
        "stay right, but the hook's records are placed against them on the clock as it read at each request's "
        "send; a request that spans a step is not paired by its times"
    )


@dataclass
class AttributeConfig:
    server_url: str
    out: str
    model: str | None = None
    api_key: str | None = None
    concurrency: list[int] = field(default_factory=lambda: [1, 4])
    repeat: int = 1
    spec: load.LoadSpec = field(default_factory=load.LoadSpec)
    profile: bool = False
    profile_dir: str | None = None
    model_config: str | None = None
    ca_cert: str | None = None  # TLS: the CA file that signed the server's certificate (--ca-cert)
    insecure: bool = False  # TLS: no certificate verification (--insecure)


HOOK_TIMEOUT_S = 30.0  # a status or stop call after a level: the workers answer between engine steps


def _on_server_machine(watch: RankWatch | None) -> bool:
    """The client runs on the server's machine: the watch verified a worker's or the API server's pid here."""
    return watch is not None and bool(watch.local or watch.api)


def _host_meter(watch: RankWatch | None) -> HostLoadMeter | None:
    """A started meter of the machine's load where the client runs on the server's machine; None elsewhere
    (not measured)."""
    if not _on_server_machine(watch):
        return None
    m = HostLoadMeter(watch.api[1] if watch.api else None, tuple(watch.local.values()))
    m.start()
    return m


def _watched(watch: RankWatch | None, fn, *args, **kwargs):
    """A hook call given up once `watch` sees a worker die (ranks.DeathSeen, a ServerGone); as it is without one.
    Only for calls that may still land after the run has moved on (Ctrl-C: the call goes on in its thread):
    status, stop and the records' fetch, never the recording's start, which would then arm the hook after the
    stop sent for it (a test's press in the start did so during the next test, 2026-12-07)."""
    if watch is None:
        kwargs.pop("give_up", None)
        return fn(*args, **kwargs)
    return watch.call(fn, *args, **kwargs)


class WorkerStalled(load.ServerGone):
    """A TP worker stopped answering (stopped, hung): the run stops there, naming it (`stopped`: which)."""

    def __init__(self, reason: str, stopped: RankStopped | None = None):
        super().__init__([])
        self.reason, self.stopped = reason, stopped


class Progress:
    """Hooks for a UI; the CLI fills them with rich progress bars."""

    def level_start(self, concurrency: int, repeat: int, round_: int, total: int) -> None: ...
    def request_done(self, row: dict) -> None: ...
    def level_end(self, level: dict) -> None: ...
    def note(self, text: str) -> None: ...


class Attribute:
    def __init__(self, cfg: AttributeConfig, progress: Progress | None = None):
        self.cfg = cfg
        self.progress = progress or Progress()
        self.info: ServerInfo | None = None
        self.rd: RunDir | None = None
        self.requests: list[dict] = []
        self.tokens: list[pd.DataFrame] = []
        self.levels: list[dict] = []
        self.windows: list[dict] = []
        self.coll: pd.DataFrame | None = None
        self.steps: pd.DataFrame | None = None
        self.step_reqs: pd.DataFrame | None = None  # which of our requests each step served (recorder.py)
        self.hook_meta: dict = {}
        self.notes: list[str] = []
        self._next_id = 0
        self._current: tuple[int, int] | None = None  # (concurrency, repeat) of the level running now
        self._clock_bound: dict | None = None  # the running level's server clock bound (analysis/serverclock.py)
        self._armed: str | None = None  # the session this run armed and has not stopped yet (Ctrl-C stops it)
        # Where the run is outside the warm-up and the levels (Ctrl-C's reason names it): "the start of the run",
        # "the analysis" (kept when a Ctrl-C stops it), "the profiled round", "the end of the run".
        self._phase: str | None = None
        self._analysed = -1  # how many levels the summary on disk covers (-1: none yet)
        self._recorded: set[tuple[int, int]] = set()  # the levels whose hook recording was started
        self._pulled: set[tuple[int, int]] = set()  # the levels whose records are all in the run directory
        self._closing = False  # a Ctrl-C's clean-up is running (a second one is the CLI's)
        import secrets

        self._run_id = secrets.token_hex(4)

    @property
    def plugin_on(self) -> bool:
        return bool(self.info and self.info.plugin and self.info.plugin.get("enabled", True))

    def run(self, argv: list[str] | None = None) -> dict:
        """Returns the result document (also in the run directory). Raises InputError before writing anything.
        Ctrl-C: the hook this run armed is disarmed, the finished levels are attributed, status.json says
        "incomplete" (interrupted), and the result has `interrupted` set (the CLI exits 130)."""
        from tpcomm import redact
        from tpcomm.attribute.server import tls_verify

        redact.register(self.cfg.api_key)  # never written to the run directory, a log or the report
        if self.cfg.api_key:
            redact.register(self.cfg.api_key.strip())  # as it goes in the header (check_server strips it)
        verify = tls_verify(self.cfg.ca_cert, self.cfg.insecure)
        self.info = check_server(self.cfg.server_url, self.cfg.model, self.cfg.api_key, verify=verify)
        redact.register(self.info.api_key)  # also when it came from OPENAI_API_KEY
        spec = self.cfg.spec
        if self.info.max_model_len and spec.input_len + spec.output_len > self.info.max_model_len:
            raise InputError(
                "--input-len/--output-len",
                f"{spec.input_len}+{spec.output_len} tokens exceed the "
                f"server's max_model_len {self.info.max_model_len}",
                "a shorter request",
            )
        if self.cfg.model_config:  # checked before anything is measured: a bad config is the user's to fix
            from tpcomm.models import load_model

            load_model(self.cfg.model_config)
        self.rd = RunDir(self.cfg.out)
        # From here on: a Ctrl-C at any point (the first marks, a level, the analysis, the profiled round, a
        # failure's clean-up) ends in _interrupted, which marks the run; only a second one, during that, leaves
        # the mark to the CLI's message.
        self._phase = "the start of the run"
        try:
            self.rd.record_command("attribute", argv)
            self.rd.mark("attribute", "running", server_url=self.info.url, model=self.info.model)
            return self._measure(spec)
        except KeyboardInterrupt:
            if self._closing:
                raise
            return self._interrupted()
        except Exception as e:
            # A defect in tpcomm (an InputError is the user's and marked where it is raised): the traceback
            # goes on to the user, but our recording is stopped and status.json says failed, not running.
            if not isinstance(e, InputError):
                self._abandon(f"tpcomm failed ({type(e).__name__}: {e})")
            raise

    def _measure(self, spec: load.LoadSpec) -> dict:
        if isinstance(self.info.plugin_error, records.HookTimeout):
            # The hook's routes are there, its workers do not answer: nothing can be measured (every request
            # would wait for them too).
            why = self._not_answering("GET /tpcomm/v1/status", self.info.plugin_error, None).reason
            self.notes.append(why)
            self.rd.mark("attribute", "failed", reason=why)
            return self.result(complete=False, reason=why)
        if not self.plugin_on:
            self.notes.append(self.info.plugin_note + "; " + self.info.enable_hint())
        try:
            prompts = load.build_prompts(self.info, spec)
            self._phase = None  # from here: the warm-up, then each level names itself
            self.prompt_note = prompts.note
            self.progress.note(f"warm-up: {spec.warmup} request(s)")
            warm = load.warmup(self.info, spec, prompts)
            if warm and not any(r["ok"] for r in warm):
                if warm[0]["error"].startswith(("HTTP ", load.MALFORMED)):
                    # The server is there and says no (e.g. 501 from a non-vLLM server): a user's problem to fix,
                    # named with what it answered; nothing measured yet, so nothing is lost.
                    self.rd.mark("attribute", "failed", reason="every warm-up request was refused")
                    raise InputError(
                        "--server-url",
                        f"{self.info.url} answered every warm-up request with an error "
                        f"(POST /v1/{'chat/completions' if spec.api == 'chat' else 'completions'}: "
                        f"{warm[0]['error'][:200]})",
                        "a vLLM OpenAI-compatible server that completes streaming requests",
                    )
                if not is_alive(self.info.url, verify=self.info.verify):
                    raise load.ServerGone(warm)
                # Alive, yet no warm-up request completed (e.g. streams cut mid-way): nothing to measure on.
                why = f"every warm-up request failed ({warm[0]['error'][:200]})"
                self.notes.append(why)
                self.rd.mark("attribute", "failed", reason=why)
                return self.result(complete=False, reason=why)
            self.info.fingerprint = next((r.get("fingerprint") for r in warm if r.get("fingerprint")), None)
            if not self.plugin_on:
                self.notes[-1] = self.info.plugin_note + "; " + self.info.enable_hint(self.server_tp() or "N")
            for rep in range(self.cfg.repeat):
                for c in self.cfg.concurrency:
                    try:
                        self._level(c, rep, prompts)
                    except KeyboardInterrupt:
                        self._keep_interrupted(c, rep)
                        raise
            self._phase = "the end of the run"
            self._analyse()
            if self.cfg.profile:  # a server gone during the profiled round is handled as during a level
                self._phase = "the profiled round"
                self._profile(prompts)
                self._phase = "the end of the run"
        except load.ServerGone as e:
            # A named cause (a TP worker that died or stopped, see ranks.py) or just a server that no longer
            # answers.
            reason = getattr(e, "reason", None) or "server stopped answering"
            death = getattr(e, "death", None)
            if self._armed and isinstance(e, WorkerStalled):
                # Our recording is still armed. The stop waits in the engine until the worker runs again, and
                # names our session: it can never end another client's recording later.
                try:
                    records.stop(self.info, self._armed, timeout_s=2)
                except records.HookError:
                    self.notes.append("the hook's recording stops when the stopped worker runs again")
                self._armed = None
            self._write_load()
            if self.levels and self._analysed != len(self.levels):
                try:  # attribute what was measured before the server went away
                    self._analyse()
                except Exception as err:  # noqa: BLE001 - what was measured stays on disk either way
                    self.notes.append(f"attribution of the partial run failed: {type(err).__name__}: {err}")
            self.notes.append(
                f"{reason}: results up to that point are kept"
                if reason != "server stopped answering"
                else "the server stopped answering mid-run: results up to that point are kept"
            )
            self.rd.mark(
                "attribute",
                "incomplete",
                reason=reason,
                levels_done=len(self.levels),
                requests=len(self.requests),
                **({"dead_rank": death.to_dict()} if death else {}),
                **({"stopped_rank": e.stopped.to_dict()} if getattr(e, "stopped", None) else {}),
            )
            return self.result(complete=False, reason=reason)
        except InputError as e:  # e.g. the disk filled up (safefs.WriteFailed): disarm ours, mark if we can
            self._abandon(str(e), mark=getattr(e, "what", None) != "--server-url")  # the warm-up's marked it
            raise
        if bad := self.summary.incomplete():
            # judge/complete.py, once, on every level: failed requests, another client, other traffic.
            reason = "; ".join(bad)
            self.rd.mark("attribute", "incomplete", reason=reason, levels=len(self.levels), requests=len(self.requests))
            return self.result(complete=False, reason=reason)
        self.rd.mark(
            "attribute", "complete", levels=len(self.levels), requests=len(self.requests), plugin=self.plugin_on
        )
        return self.result(complete=True)

    def _abandon(self, why: str, mark: bool = True) -> None:
        """A one-line error ends the run mid-way: our recording stops now (not when its lease runs out), and
        status.json says failed where the file system still takes it (else the re-run note or "running" stays,
        and no process holds the lock: readers see the run did not end)."""
        if self._armed:
            try:
                records.stop(self.info, self._armed, timeout_s=5)
                self._armed = None
            except records.HookError:
                pass
        if not mark:
            return
        try:
            self.rd.mark("attribute", "failed", reason=why[:300])
        except (InputError, OSError):
            pass

    def _interrupted(self) -> dict:
        """Ctrl-C: disarm the hook this run armed, keep and attribute what finished, mark the run."""
        self._closing = True
        where = self._phase or (f"C={self._current[0]} repeat {self._current[1]}" if self._current else "the warm-up")
        reason = f"interrupted (Ctrl-C) during {where}"
        try:
            if self._armed:
                try:  # only our own recording (a late stop never ends another client's)
                    records.stop(self.info, self._armed, timeout_s=5)
                    self._armed = None
                except records.HookError as e:
                    self.notes.append(f"the hook's recording could not be stopped after Ctrl-C ({e})")
            self._write_load()
            if self._phase == "the analysis":  # the user stopped it: not run again now
                self.notes.append(
                    f"the attribution was not finished: `tpcomm attribute --reanalyse {self.rd.path}` redoes it "
                    "from the records kept"
                )
            elif any(not lv.get("interrupted") for lv in self.levels) and self._analysed != len(self.levels):
                try:
                    self._analyse()
                except Exception as e:  # noqa: BLE001 - what was measured stays on disk either way
                    self.notes.append(f"attribution of the finished levels failed: {type(e).__name__}: {e}")
        except KeyboardInterrupt:  # a second Ctrl-C: mark the run and go
            reason += " (twice: the finished levels may be unattributed)"
        self.notes.append(f"{reason}: the finished levels are kept")
        self.rd.mark(
            "attribute", "incomplete", reason=reason, levels_done=len(self.levels), requests=len(self.requests)
        )
        return self.result(complete=False, reason=reason, interrupted=True)

    # ---- load ---------------------------------------------------------------
    def _level(self, c: int, rep: int, prompts: load.Prompts) -> None:
        # Our own recording session: a start or stop from another client during the level is detected below.
        session = f"attribute-{self._run_id}-c{c}-r{rep}"
        self._current = (c, rep)
        # Watch the TP workers while the level runs, from before its recording starts: a worker that dies
        # takes the server down with it, and only the order of the deaths tells which one failed.
        watch = RankWatch(self.info, c).start() if self.plugin_on else None
        # One round's worst case (every wave of requests to its timeout) and a minute: a recording this run
        # leaves armed (killed mid-level) ends by itself then; each round's status call renews it.
        spec = self.cfg.spec
        lease_s = int(min(7 * 86400, -(-spec.requests // c) * spec.timeout_s + 60))
        # Counted as ours before the answer: a start that times out may still take effect when the stopped
        # worker runs again; the stop that run() then sends names this session and is queued behind it.
        self._armed = session if self.plugin_on else None
        # the host's speed before the level, outside the window of the ranks' CPU wait (analysis/hostload.py)
        ref_before = reference_runs() if _on_server_machine(watch) else None
        # The start's answer and the client's wall clock either side of it bound the server's clock against
        # ours (analysis/serverclock.py): the level's window is read on ours and cut from steps stamped on theirs.
        started: dict = {}

        def start(info):
            t0 = time.time_ns()
            doc = records.start(info, session, lease_s)
            started.update(bound=bound_from_start(doc, t0, time.time_ns(), session))

        self._clock_bound = None
        try:
            start_error = self._hook(start, watch) if self.plugin_on else None
        except load.ServerGone as e:
            death = watch.stop(requests_failed=True) if watch is not None else None
            if death and not getattr(e, "reason", None):
                why = death.message(while_="the level's hook recording was being started")
                self._keep_gone(*self._add_rows([], (c, rep), 0, True), c, rep, 0, death, why)
                raise RankDied(death, why) from None
            raise
        except BaseException:
            if watch is not None:
                watch.stop()
            raise
        self._clock_bound = started.get("bound")
        if start_error is not None:  # answered with an error: nothing was armed
            self._armed = None
        elif self.plugin_on:
            self._recorded.add((c, rep))
        if watch is not None and start_error is not None:
            watch.stop()
            watch = None
        if watch is not None and watch.note:
            self.notes.append(f"C={c}: {watch.note}")
        try:
            self._rounds(c, rep, prompts, session, start_error, watch, ref_before)
        finally:  # Ctrl-C or a failure of our own: no watch thread or pidfd left behind (stop() runs once)
            if watch is not None:
                watch.stop()

    def _rounds(
        self,
        c: int,
        rep: int,
        prompts: load.Prompts,
        session: str,
        start_error: str | None,
        watch: RankWatch | None,
        ref_before: list[float] | None = None,
    ) -> None:
        """The level's load rounds until one is steady, then its records; `watch` names a worker that dies or
        stops. `start_error`: why the hook's recording could not be started (None: it was, or no plugin).
        `ref_before`: the reference work's runs before the level (None: not on the server's machine)."""
        spec = self.cfg.spec
        t_level = time.time_ns()  # the level's requests start now (a death is timed from here)
        abort = _abort_for(watch) if watch is not None else None
        cpu_base: dict | str | None = None  # the workers' CPU wait at the start of the round (see _level_records)
        for rnd in range(spec.max_rounds):
            if rnd and self.plugin_on and start_error is None:
                try:
                    cpu_base = self._cpu_wait_now(watch)
                except load.ServerGone:  # ranks.DeathSeen: a worker died between the rounds, seen at once
                    self._gone([], c, rep, rnd, watch, t_level)
            self.progress.level_start(c, rep, rnd, spec.requests)
            meter = _host_meter(watch)
            offset = self._next_id
            sink: list[dict] = []
            try:
                rows = aiorun.run(
                    lambda: load.run_round(
                        self.info,
                        spec,
                        prompts,
                        c,
                        spec.requests,
                        on_done=self.progress.request_done,
                        is_alive=lambda: is_alive(self.info.url, verify=self.info.verify),
                        id_offset=offset,
                        sink=sink,
                        abort=abort,
                        request_token=self._run_id if self.plugin_on else None,
                    )
                )
                req, tok = self._add_rows(rows, (c, rep), rnd, True)
            except load.Aborted as e:  # a TP worker stopped answering (ranks.py): nothing more to ask it
                if e.reason == DEAD_IN_FLIGHT:  # or died, and its requests' streams were left open: a death
                    self._gone(e.args[0], c, rep, rnd, watch, t_level)
                req, tok = self._add_rows(e.args[0], (c, rep), rnd, True)
                lv = self._level_doc(c, rep, rnd, req, tok, None, e.reason, [f"incomplete: {e.reason}"])
                stopped = watch.stopped(0)
                lv.update(worker_problem=e.reason, **({"stopped_rank": stopped.to_dict()} if stopped else {}))
                self.levels.append(lv)
                raise WorkerStalled(e.reason, stopped) from None
            except KeyboardInterrupt:  # in the round, or as its rows were being kept: the rows not kept yet
                self._add_rows([r for r in sink if "in_stats" not in r], (c, rep), rnd, True)
                req, tok = self._frames(sink)
                why = "interrupted (Ctrl-C) during this level"
                lv = self._level_doc(c, rep, rnd, req, tok, None, why, [f"incomplete: {why}"])
                lv["interrupted"] = why
                self.levels.append(lv)
                raise
            except load.ServerGone as e:
                self._gone(e.args[0] if e.args else [], c, rep, rnd, watch, t_level)
            steady, note = steadiness(req, tok, c, spec.steady_pct)
            if steady is not False or rnd == spec.max_rounds - 1:
                break
            # Not steady: keep the round's rows out of the figures and run another.
            with aiorun.ctrl_c_held():
                for r in self.requests[-len(rows) :]:
                    r["in_stats"] = False
        # Wait for a worker's exit only when requests failed the way a dying engine fails them, not for a 4xx.
        # Otherwise the watch goes on through the level's records: a worker that dies while they are asked for
        # is named too, not left as a server that stopped answering.
        failed = any(not r["ok"] and load.looks_like_disconnect(r["error"] or "") for r in rows)
        # A death already seen: stop (its last looks complete the record: the ranks vLLM shut down after it, or
        # a whole-server stop) before it is told.
        seen = watch is not None and (failed or watch.death is not None)
        death = watch.stop(requests_failed=failed) if seen else None
        flags = [f"C={c} not steady after {rnd + 1} round(s): {note}"] if steady is False else []
        lv = self._level_doc(c, rep, rnd, req, tok, steady, note, flags)
        # the machine's load over the level's last round (the one its figures come from)
        lv["host_load"] = meter.stop(int(req["output_tokens"].sum())) if meter is not None and len(req) else None
        self.levels.append(lv)
        if death:  # the requests ended (failed) before the server went away: the hook cannot be asked any more
            why = death.message(t_level)
            lv.update(worker_problem=why, rank_died=death.to_dict())
            lv["flags"].append(f"incomplete: {why}")
            raise RankDied(death, why)
        repeat_spread(self.levels, spec.spread_pct)
        self.windows.append(
            {
                "concurrency": c,
                "repeat": rep,
                "t_start_ns": int(req["t_start_ns"].min()) if len(req) else t_level,
                "t_end_ns": int(req["t_end_wall_ns"].fillna(req["t_end_ns"]).max()) if len(req) else time.time_ns(),
            }
        )
        if self.plugin_on and start_error is None:
            try:
                self._level_records(c, rep, session, lv, watch, cpu_base)
            except load.ServerGone as e:  # a stopped or hung worker (WorkerStalled) is not waited for as a death
                self._died_after_requests(lv, watch, t_level, wait=not isinstance(e, WorkerStalled))
                raise
            asked = "records_problem" in lv or "hook_problem" in lv
            # Wait for a death to be seen only when the server is gone, not for another client's session.
            gone = asked and not is_alive(self.info.url, verify=self.info.verify)
            self._died_after_requests(lv, watch, t_level, failed=asked, wait=gone)
        elif self.plugin_on:
            lv["records_problem"] = f"the hook's recording could not be started ({start_error})"
        if ref_before is not None and lv.get("host_load") is not None:
            with aiorun.ctrl_c_held():  # ~30 ms; the level's doc is written whole
                lv["host_load"].update(reference_figures(ref_before, reference_runs()))
        self._write_load()
        self.progress.level_end(lv)

    def _gone(self, rows: list[dict], c: int, rep: int, rnd: int, watch: RankWatch | None, t_level: int) -> None:
        """The server went (or a worker died) during the level's requests: keep what was measured, name the
        death (or the server that stopped answering), and raise."""
        req, tok = self._add_rows(rows, (c, rep), rnd, True)  # kept first: the watch's stop may wait for a death
        death = watch.stop(requests_failed=True) if watch is not None else None
        why = death.message(t_level) if death else "server stopped answering"
        self._keep_gone(req, tok, c, rep, rnd, death, why)
        raise (RankDied(death, why) if death else load.ServerGone([])) from None

    def _keep_gone(self, req: pd.DataFrame, tok: pd.DataFrame, c: int, rep: int, rnd: int, death, why: str) -> None:
        """The level stays in load/levels.json, marked, with the requests it finished (`req`, `tok`: as
        _add_rows kept them; none where the death came before they were sent: the level was started all the
        same, and its summary names the death; it was left out once, and a run that said "died during C=2" had
        no C=2 in its summary, 2026-12-06)."""
        flag = f"incomplete: {why}" if death else "incomplete: the server stopped answering during this level"
        lv = self._level_doc(c, rep, rnd, req, tok, None, why, [flag])
        if death:
            lv.update(worker_problem=why, rank_died=death.to_dict())
        self.levels.append(lv)

    def _level_records(
        self, c: int, rep: int, session: str, lv: dict, watch: RankWatch | None, cpu_base: dict | str | None
    ) -> None:
        """After the level's requests: check that the recording is still ours, stop it, fetch its records.
        `cpu_base`: the workers' CPU wait at the start of the level's last round (None: the recording's start,
        "unknown": it could not be read), so the level's CPU wait covers the round its figures come from."""
        problem = None
        # each call given up once the watch sees a worker die (ServerGone: the caller names the death)
        try:
            st = _watched(watch, records.status, self.info, timeout_s=HOOK_TIMEOUT_S)
            coverage.merge_sites_off(self.info.plugin, st)  # sites the hook switched off during the level
            problem = records.session_problem(st, session, self._started_ns(c))
            lv["cpu_wait"] = None if cpu_base == "unknown" else records.cpu_wait(st, since=cpu_base)
        except records.HookTimeout as e:
            self._stalled(lv, "GET /tpcomm/v1/status", e, watch)
        except records.HookError as e:
            problem = f"the hook's status could not be read before stopping ({e})"
        self._hook(lambda info: _watched(watch, records.stop, info, session, timeout_s=HOOK_TIMEOUT_S), watch, lv)
        self._armed = None
        if problem:
            lv["hook_problem"] = problem
            lv["flags"].append(f"C={c}: {problem}; this level's split is not computed")
            self.notes.append(f"C={c}: {problem}")
        else:
            fetch_error = self._pull_records(c, rep, session, lv, watch)
            if fetch_error:
                lv["records_problem"] = f"the hook's records could not be fetched ({fetch_error})"

    def _cpu_wait_now(self, watch: RankWatch | None = None) -> dict | str:
        """The workers' CPU wait since the recording's start, as of now; "unknown" where it cannot be read.
        Watched: a worker's death gives the call up (ranks.DeathSeen) instead of waiting out its timeout."""
        try:
            st = _watched(watch, records.status, self.info, timeout_s=HOOK_TIMEOUT_S)
            return records.cpu_wait(st) or "unknown"
        except records.HookError:
            return "unknown"

    def _died_after_requests(
        self, lv: dict, watch: RankWatch | None, t_level: int, failed: bool = True, wait: bool = True
    ) -> None:
        """A worker that died after the level's requests, while its records were asked for: RankDied naming it
        (the level marked incomplete when its records were not all had). `failed`: asking the hook failed;
        `wait`: then wait for a death to be seen (ranks.GRACE_S)."""
        death = watch.stop(requests_failed=failed and wait) if watch is not None else None
        if death is None:
            return
        why = death.message(t_level, while_="after the level's requests, while its records were asked for")
        if failed:  # else the level's records are all here: it stays measured
            lv.update(worker_problem=why, rank_died=death.to_dict())
            lv["flags"].append(f"incomplete: {why}")
            self._write_load()
        raise RankDied(death, why) from None

    def _started_ns(self, c: int) -> int:
        rows = [r["t_start_ns"] for r in self.requests if r.get("concurrency") == c]
        return int(min(rows)) if rows else 0

    def _level_doc(self, c, rep, rnd, req, tok, steady, note, flags) -> dict:
        lv = {
            "concurrency": c,
            "repeat": rep,
            "round": rnd,
            **level_figures(req, tok),
            "steady": steady,
            "steady_note": note,
            "repeat_spread_pct": None,
            "flags": list(flags),
            "conditions": self.conditions(),
            # the server's clock against ours over this level's recording start (None: not measured)
            "server_clock": self._clock_bound if self._current == (c, rep) else None,
        }
        if (lv.get("itl_burst_pct") or 0) > 10:
            lv["flags"].append(
                f"C={c}: {lv['itl_burst_pct']:.0f}% of tokens arrived in bursts (gap < 20% of TPOT): "
                "the server's output loop was starved (busy host?); median ITL is unreliable, "
                "use TPOT / mean ITL"
            )
        if lv["failed"]:
            lv["flags"].append(f"{lv['failed']} of {lv['requests']} requests failed")
        if flag := clock_step_flag(req):
            lv["flags"].append(f"C={c}: {flag}")
        return lv

    def _keep_interrupted(self, c: int, rep: int) -> None:
        """Ctrl-C during the level (c, rep), wherever it landed (its recording's start, its requests, their
        bookkeeping, its records): the level stays in load/levels.json, marked interrupted, with the requests
        that finished. A level whose records were all fetched before the press stays as it is."""
        lv = next((x for x in reversed(self.levels) if (x["concurrency"], x["repeat"]) == (c, rep)), None)
        if lv is None:  # pressed before the level's document was made: made now from the rows kept
            rows = [r for r in self.requests if (r["concurrency"], r["repeat"]) == (c, rep)]
            last = max((r["round"] for r in rows), default=-1)
            kept = [r for r in rows if r["round"] == last and r["in_stats"]]
            # the last round's rows, unless that round was set aside as not steady: then the next, unfinished one
            rnd = last if kept else last + 1
            req, tok = self._frames(kept)
            why = "interrupted (Ctrl-C) during this level"
            lv = self._level_doc(c, rep, rnd, req, tok, None, why, [f"incomplete: {why}"])
            lv["interrupted"] = why
            self.levels.append(lv)
        elif (
            (c, rep) in self._recorded
            and (c, rep) not in self._pulled
            and not any(lv.get(k) for k in ("interrupted", "hook_problem", "records_problem", "worker_problem"))
        ):
            why = "interrupted (Ctrl-C) before this level's records were fetched"
            lv["interrupted"] = why
            lv["flags"].append(f"incomplete: {why}")

    def _add_rows(self, rows: list[dict], level: tuple[int, int], rnd: int, in_stats: bool):
        # Ctrl-C held while the rows are kept: a press between the requests and their tokens would part them
        with aiorun.ctrl_c_held():
            return self._keep_rows(rows, level, rnd, in_stats)

    def _frames(self, rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The requests and tokens frames of rows already kept (_keep_rows)."""
        req = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
        tok = pd.concat(self.tokens, ignore_index=True) if self.tokens else _empty_tokens()
        return req, tok[tok["request_id"].isin(req["request_id"])]

    def _keep_rows(self, rows: list[dict], level: tuple[int, int], rnd: int, in_stats: bool):
        c, rep = level
        toks = []
        for r in rows:
            r.update(concurrency=c, repeat=rep, round=rnd, in_stats=in_stats)
            t = r.pop("token_ns", [])
            n = r.pop("token_counts", None) or [-1] * len(t)
            toks.append(
                pd.DataFrame(
                    {
                        "request_id": r["request_id"],
                        "concurrency": c,
                        "repeat": rep,
                        "token_idx": range(len(t)),
                        "t_ns": t,
                        "n_tokens": n,
                    }
                )
            )
            self._next_id = max(self._next_id, r["request_id"] + 1)
        self.requests.extend(rows)
        tok = pd.concat(toks, ignore_index=True) if toks else _empty_tokens()
        self.tokens.append(tok)
        return pd.DataFrame(rows, columns=REQUEST_COLUMNS), tok

    def _write_load(self) -> None:
        req = pd.DataFrame(self.requests, columns=REQUEST_COLUMNS)
        self.rd.write_table(C.LOAD_REQUESTS, req)
        self.rd.write_table(
            C.LOAD_TOKENS, pd.concat(self.tokens, ignore_index=True) if self.tokens else _empty_tokens()
        )
        self.rd.write_json(C.LOAD_LEVELS, self.levels)

    # ---- hook ---------------------------------------------------------------
    def _hook(self, fn: Callable, watch: RankWatch | None = None, lv: dict | None = None) -> str | None:
        """Call the hook; None when it answered, else its error (noted). ServerGone when the server is gone;
        WorkerStalled (the level `lv` marked) when its workers do not answer."""
        try:
            fn(self.info)
            return None
        except records.HookTimeout as e:
            self._stalled(lv, "the hook", e, watch)
        except records.HookError as e:
            if not is_alive(self.info.url, verify=self.info.verify):
                raise load.ServerGone([]) from None
            self.notes.append(f"hook: {e}")
            return str(e)

    def _not_answering(self, what: str, e: Exception, watch: RankWatch | None) -> WorkerStalled:
        """Why the workers did not answer `what`, from their process states (GET /tpcomm/v1/workers answers
        without them): a stopped rank by name, else the timeout."""
        stopped = watch.stopped(0) if watch is not None else None
        if stopped is None:
            from tpcomm.attribute.hook_client import HookClient

            try:
                ws = HookClient(self.info.url, self.info.api_key, timeout_s=5, verify=self.info.verify).workers()
            except records.HookError:
                ws = []
            st = next((w for w in ws if w.get("state") in ("T", "t")), None)
            if st is not None:
                c = self._current[0] if self._current else None
                stopped = RankStopped(int(st["rank"]), int(st["pid"]), st["state"], time.time_ns(), c)
        if stopped is not None:
            return WorkerStalled(f"{stopped.message()}; {what} got no answer ({e.problem})", stopped)
        return WorkerStalled(f"the TP workers did not answer {what} ({e.problem}): a worker hung?", None)

    def _stalled(self, lv: dict | None, what: str, e: Exception, watch: RankWatch | None) -> None:
        err = self._not_answering(what, e, watch)
        if lv is not None:
            lv.update(worker_problem=err.reason, **({"stopped_rank": err.stopped.to_dict()} if err.stopped else {}))
            lv["flags"].append(f"incomplete: {err.reason}")
            self._write_load()
        raise err

    def _pull_records(self, c: int, rep: int, session: str, lv: dict, watch: RankWatch | None) -> str | None:
        """Fetch this level's records (only while they are still our session's) into the run directory; the
        error, if they could not be fetched."""
        try:
            coll, steps, sreq, meta = _watched(watch, records.fetch_level, self.info, session, give_up="given_up")
        except records.HookTimeout as e:
            self._stalled(lv, "GET /tpcomm/v1/records", e, watch)
        except records.RecordingTaken as e:
            why = f"another client restarted the hook's recording while this level's records were pulled ({e.problem})"
            lv["hook_problem"] = why
            lv["flags"].append(f"C={c}: {why}; this level's split is not computed")
            self.notes.append(f"C={c}: {why}")
            return None
        except records.HookError as e:
            self.notes.append(f"hook: {e}")
            return str(e)
        # Ctrl-C held while the records are kept: the three tables on disk never hold different levels
        with aiorun.ctrl_c_held():
            self.hook_meta = meta
            self.coll = records.merge(self.coll, coll, ["rank", "step", "call_idx", "t_start_ns"])
            self.steps = records.merge(self.steps, steps, ["rank", "step", "t_start_ns"])
            self.step_reqs = records.merge(self.step_reqs, sreq, ["rank", "step", "request"])
            self.rd.write_table(C.HOOK_COLLECTIVES, self.coll)
            self.rd.write_table(C.HOOK_STEPS, self.steps)
            self.rd.write_table(C.HOOK_STEP_REQUESTS, self.step_reqs)
            self.rd.write_json(C.HOOK_META, meta)
            self._pulled.add((c, rep))
        return None

    # ---- analysis -----------------------------------------------------------
    def _analyse(self) -> None:
        from tpcomm.analysis.attribution import analyse_run_dir

        before, self._phase = self._phase, "the analysis"
        try:
            if self.info.plugin is not None:
                self.rd.write_json(C.HOOK_STATUS, self.info.plugin)
            self.summary = analyse_run_dir(
                self.rd,
                model_source=self.cfg.model_config,
                hook_status=self.info.plugin,
                notes=self.notes,
                conditions=self.conditions(),
            )
            self._analysed = len(self.levels)
        except KeyboardInterrupt:
            raise  # the phase stays "the analysis": _interrupted names it and does not run it again
        except BaseException:
            self._phase = before
            raise
        self._phase = before

    def _profile(self, prompts: load.Prompts) -> None:
        import httpx

        from tpcomm.attribute.profile import profile_run

        sink: list[dict] = []
        session = f"attribute-{self._run_id}-profile"
        # Ours while the round runs: a Ctrl-C's or an error's clean-up stops it too (profile_run stops it first).
        self._armed = session if self.plugin_on else None
        try:
            doc = profile_run(self.info, self.cfg.spec, prompts, self.cfg.profile_dir, self.rd, session, sink=sink)
        except (httpx.HTTPError, records.HookError) as e:
            if not is_alive(self.info.url, verify=self.info.verify):
                raise load.ServerGone([]) from None  # as during a level: the levels measured stand
            doc = {"captured": False, "note": f"the profiled round failed ({type(e).__name__}: {e}); the levels stand"}
        self._armed = None
        self.rd.write_json(C.PROFILE_SUMMARY, doc)
        self.profile_doc = doc
        if not self.plugin_on and sink and doc.get("instruments", {}).get("trace"):
            # No plugin: the profiled round is a level of its own, and its traces its records (profile_levels.py)
            from tpcomm.analysis.profile_levels import next_repeat

            rep = next_repeat(self.levels)
            self._clock_bound = None  # no recording start to time: the traces' window as the client read it
            req, tok = self._add_rows(sink, (1, rep), 0, True)
            lv = self._level_doc(1, rep, 0, req, tok, None, "the profiled round (torch profiler on)", [])
            lv["profiled"] = True
            self.levels.append(lv)
            self._write_load()
            self._analyse()

    # ---- output -------------------------------------------------------------
    def server_tp(self) -> int | None:
        import re

        m = re.search(r"-tp(\d+)", self.info.fingerprint or "") if self.info else None
        return int(m.group(1)) if m else None

    def conditions(self) -> dict:
        from tpcomm.versions import stack_versions

        s = self.cfg.spec
        st = (self.info.plugin or {}) if self.info else {}
        return {
            "server_url": self.info.url,
            "model": self.info.model,
            "model_root": self.info.root,
            "api": s.api,
            "input_len": s.input_len,
            "output_len": s.output_len,
            "prompt": getattr(self, "prompt_note", ""),
            "requests_per_round": s.requests,
            "tp": self.server_tp() or (len(st["ranks"]) if st.get("ranks") else None),
            "server_fingerprint": self.info.fingerprint,
            "server_versions": st.get("versions"),
            "client_versions": stack_versions(),
            "plugin": self.plugin_on,
            # the client's machine: the delivery delays (analysis/delivery.py) are on one clock only there
            "client_boot_id": client_boot_id(),
        }

    def result(self, complete: bool, reason: str | None = None, interrupted: bool = False) -> dict:
        return {
            "complete": complete,
            "incomplete_reason": reason,
            "interrupted": interrupted,
            "run_dir": str(self.rd.path),
            "plugin": self.plugin_on,
            "levels": self.levels,
            "attribution": self.summary.to_json() if getattr(self, "summary", None) is not None else None,
            "profile": getattr(self, "profile_doc", None),
            "notes": self.notes,
            "config": {**asdict(self.cfg), "api_key": "***" if self.cfg.api_key else None},
        }


def _empty_tokens() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": pd.Series(dtype="int64"),
            "concurrency": pd.Series(dtype="int64"),
            "repeat": pd.Series(dtype="int64"),
            "token_idx": pd.Series(dtype="int64"),
            "t_ns": pd.Series(dtype="int64"),
            "n_tokens": pd.Series(dtype="int64"),
        }
    )


def reanalyse_run_dir(run_dir: str, model_config: str | None = None, argv: list[str] | None = None) -> dict:
    """`tpcomm attribute --reanalyse RUN_DIR`: the analysis again from the run's own records (load/*, hook/*),
    with this tpcomm; the result document as `Attribute.run` returns it. Nothing is measured."""
    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.errors import InputError

    rd = RunDir(run_dir, create=False)
    levels = rd.read_json(C.LOAD_LEVELS)
    if levels is None:
        raise InputError(
            f"--reanalyse {run_dir}", "has no load/levels.json", "a run directory written by tpcomm attribute"
        )
    status = rd.read(C.STATUS)
    stage = status.stages.get("attribute") if status else None
    rd.record_command("attribute --reanalyse", argv)
    att = analyse_run_dir(rd, model_source=model_config, notes=[f"re-analysed from the run's records ({rd.path})"])
    state = stage.state if stage else "complete"
    bad = att.incomplete()  # judged again with this tpcomm (judge/complete.py)
    return {
        "complete": state == "complete" and not bad,
        "incomplete_reason": (stage.reason if stage else None) or ("; ".join(bad) if bad else None),
        "interrupted": False,
        "run_dir": str(rd.path),
        "plugin": att.plugin,
        "levels": levels,
        "attribution": att.to_json(),
        "profile": None,
        "notes": att.notes,
        "config": {"reanalyse": str(rd.path), "model_config": model_config},
    }
