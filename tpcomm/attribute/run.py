"""The whole `tpcomm attribute` job, usable from Python without click.

Order: check the server, warm up, then for each repeat and each concurrency
level: start the hook, run rounds until steady (or max_rounds), stop the hook,
pull its records, and write everything measured so far. Then align, split and
cross-check. A server that dies mid-run leaves the run directory with what was
measured and status.json marking the stage incomplete.

Run-directory files written here (extending rundir.py's layout):
    load/requests.parquet, load/tokens.parquet, load/levels.json
    hook/collectives.parquet, hook/steps.parquet, hook/meta.json (+ concurrency, repeat columns)
    attribution/steps.parquet          one row per decode step (terms averaged over ranks)
    attribution/steps_by_rank.parquet  one row per (rank, step), all step kinds
    attribution/summary.json           per level split, ceilings, top sites, cross-check
    profile/summary.json               with --profile
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pandas as pd

from tpcomm import contract as C
from tpcomm.attribute import load, records
from tpcomm.attribute.levels import level_figures, repeat_spread, steadiness
from tpcomm.attribute.ranks import RankDied, RankWatch
from tpcomm.attribute.server import ServerInfo, check_server, is_alive
from tpcomm.rundir import RunDir

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
]


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
        self.hook_meta: dict = {}
        self.notes: list[str] = []
        self._next_id = 0
        import secrets

        self._run_id = secrets.token_hex(4)

    @property
    def plugin_on(self) -> bool:
        return bool(self.info and self.info.plugin and self.info.plugin.get("enabled", True))

    def run(self, argv: list[str] | None = None) -> dict:
        """Returns the result document (also in the run directory). Raises InputError before writing anything."""
        from tpcomm import redact

        redact.register(self.cfg.api_key)  # never written to the run directory, a log or the report
        self.info = check_server(self.cfg.server_url, self.cfg.model, self.cfg.api_key)
        redact.register(self.info.api_key)  # also when it came from OPENAI_API_KEY
        spec = self.cfg.spec
        if self.info.max_model_len and spec.input_len + spec.output_len > self.info.max_model_len:
            from tpcomm.errors import InputError

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
        self.rd.record_command("attribute", argv)
        self.rd.mark("attribute", "running", server_url=self.info.url, model=self.info.model)
        if not self.plugin_on:
            self.notes.append(self.info.plugin_note + "; " + self.info.enable_hint())
        prompts = load.build_prompts(self.info, spec)
        self.prompt_note = prompts.note
        try:
            self.progress.note(f"warm-up: {spec.warmup} request(s)")
            warm = load.warmup(self.info, spec, prompts)
            if warm and not any(r["ok"] for r in warm):
                answered = warm[0]["error"].startswith("HTTP ")
                if answered:
                    # The server is there and says no (e.g. 501 from a non-vLLM server): a user's problem to fix,
                    # named with what it answered; nothing measured yet, so nothing is lost.
                    from tpcomm.errors import InputError

                    self.rd.mark("attribute", "failed", reason="every warm-up request was refused")
                    raise InputError(
                        "--server-url",
                        f"{self.info.url} answered every warm-up request with an error "
                        f"(POST /v1/{'chat/completions' if spec.api == 'chat' else 'completions'}: "
                        f"{warm[0]['error'][:200]})",
                        "a vLLM OpenAI-compatible server that completes streaming requests",
                    )
                raise (
                    load.ServerGone(warm)
                    if not is_alive(self.info.url)
                    else RuntimeError("every warm-up request failed: " + warm[0]["error"])
                )
            self.info.fingerprint = next((r.get("fingerprint") for r in warm if r.get("fingerprint")), None)
            if not self.plugin_on:
                self.notes[-1] = self.info.plugin_note + "; " + self.info.enable_hint(self.server_tp() or "N")
            for rep in range(self.cfg.repeat):
                for c in self.cfg.concurrency:
                    self._level(c, rep, prompts)
        except load.ServerGone as e:
            # A named cause (a TP worker that died, see ranks.py) or just a server that no longer answers.
            reason = getattr(e, "reason", None) or "server stopped answering"
            death = getattr(e, "death", None)
            self._write_load()
            if self.levels:
                try:  # attribute what was measured before the server went away
                    self._analyse()
                except Exception as e:
                    self.notes.append(f"attribution of the partial run failed: {type(e).__name__}: {e}")
            self.notes.append(
                f"{reason}: results up to that point are kept"
                if death
                else "the server stopped answering mid-run: results up to that point are kept"
            )
            self.rd.mark(
                "attribute",
                "incomplete",
                reason=reason,
                levels_done=len(self.levels),
                requests=len(self.requests),
                **({"dead_rank": death.to_dict()} if death else {}),
            )
            return self.result(complete=False, reason=reason)
        self._analyse()
        if self.cfg.profile:
            self._profile(prompts)
        self.rd.mark(
            "attribute", "complete", levels=len(self.levels), requests=len(self.requests), plugin=self.plugin_on
        )
        return self.result(complete=True)

    # ---- load ---------------------------------------------------------------
    def _level(self, c: int, rep: int, prompts: load.Prompts) -> None:
        # Our own recording session: a start or stop from another client during the level is detected below.
        session = f"attribute-{self._run_id}-c{c}-r{rep}"
        # Watch the TP workers while the level runs, from before its recording starts: a worker that dies
        # takes the server down with it, and only the order of the deaths tells which one failed.
        watch = RankWatch(self.info, c).start() if self.plugin_on else None
        try:
            start_error = self._hook(lambda info: records.start(info, session)) if self.plugin_on else None
        except load.ServerGone:
            death = watch.stop(requests_failed=True) if watch is not None else None
            if death:
                raise RankDied(death, death.message(while_="the level's hook recording was being started")) from None
            raise
        except BaseException:
            if watch is not None:
                watch.stop()
            raise
        if watch is not None and start_error is not None:
            watch.stop()
            watch = None
        if watch is not None and watch.note:
            self.notes.append(f"C={c}: {watch.note}")
        try:
            self._rounds(c, rep, prompts, session, start_error, watch)
        finally:  # Ctrl-C or a failure of our own: no watch thread or pidfd left behind (stop() runs once)
            if watch is not None:
                watch.stop()

    def _rounds(
        self, c: int, rep: int, prompts: load.Prompts, session: str, start_error: str | None, watch: RankWatch | None
    ) -> None:
        """The level's load rounds until one is steady, then its records; `watch` names a worker that dies.
        `start_error`: why the hook's recording could not be started (None: it was, or there is no plugin)."""
        spec = self.cfg.spec
        t_level = time.time_ns()  # the level's requests start now (a death is timed from here)
        for rnd in range(spec.max_rounds):
            self.progress.level_start(c, rep, rnd, spec.requests)
            offset = self._next_id
            try:
                rows = asyncio.run(
                    load.run_round(
                        self.info,
                        spec,
                        prompts,
                        c,
                        spec.requests,
                        on_done=self.progress.request_done,
                        is_alive=lambda: is_alive(self.info.url),
                        id_offset=offset,
                    )
                )
            except load.ServerGone as e:
                req, tok = self._add_rows(e.args[0] if e.args else [], (c, rep), rnd, True)
                death = watch.stop(requests_failed=True) if watch is not None else None
                why = death.message(t_level) if death else "server stopped answering"
                if len(req):
                    flag = (
                        f"incomplete: {why}" if death else "incomplete: the server stopped answering during this level"
                    )
                    lv = self._level_doc(c, rep, rnd, req, tok, None, why, [flag])
                    if death:
                        lv.update(hook_problem=why, rank_died=death.to_dict())
                    self.levels.append(lv)
                raise (RankDied(death, why) if death else load.ServerGone([])) from None
            req, tok = self._add_rows(rows, (c, rep), rnd, True)
            steady, note = steadiness(req, tok, c, spec.steady_pct)
            if steady is not False or rnd == spec.max_rounds - 1:
                break
            # Not steady: keep the round's rows out of the figures and run another.
            for r in self.requests[-len(rows) :]:
                r["in_stats"] = False
        # Wait for a worker's exit only when requests failed the way a dying engine fails them, not for a 4xx.
        failed = any(not r["ok"] and load.looks_like_disconnect(r["error"] or "") for r in rows)
        death = watch.stop(requests_failed=failed) if watch is not None else None
        flags = [f"C={c} not steady after {rnd + 1} round(s): {note}"] if steady is False else []
        lv = self._level_doc(c, rep, rnd, req, tok, steady, note, flags)
        self.levels.append(lv)
        if death:  # the requests ended (failed) before the server went away: the hook cannot be asked any more
            why = death.message(t_level)
            lv.update(hook_problem=why, rank_died=death.to_dict())
            lv["flags"].append(f"incomplete: {why}")
            raise RankDied(death, why)
        repeat_spread(self.levels, spec.spread_pct)
        self.windows.append(
            {
                "concurrency": c,
                "repeat": rep,
                "t_start_ns": int(req["t_start_ns"].min()),
                "t_end_ns": int(req["t_end_ns"].max()),
            }
        )
        if self.plugin_on and start_error is None:
            problem = None
            try:
                problem = records.session_problem(records.status(self.info), session, self._started_ns(c))
            except records.HookError as e:
                problem = f"the hook's status could not be read before stopping ({e})"
            self._hook(records.stop)
            if problem:
                lv["hook_problem"] = problem
                lv["flags"].append(f"C={c}: {problem}; this level's split is not computed")
                self.notes.append(f"C={c}: {problem}")
            fetch_error = self._pull_records(c, rep)
            if fetch_error:
                lv["records_problem"] = f"the hook's records could not be fetched ({fetch_error})"
        elif self.plugin_on:
            lv["records_problem"] = f"the hook's recording could not be started ({start_error})"
        self._write_load()
        self.progress.level_end(lv)

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
        }
        if (lv.get("itl_burst_pct") or 0) > 10:
            lv["flags"].append(
                f"C={c}: {lv['itl_burst_pct']:.0f}% of tokens arrived in bursts (gap < 20% of TPOT): "
                "the server's output loop was starved (busy host?); median ITL is unreliable, "
                "use TPOT / mean ITL"
            )
        if lv["failed"]:
            lv["flags"].append(f"{lv['failed']} of {lv['requests']} requests failed")
        return lv

    def _add_rows(self, rows: list[dict], level: tuple[int, int], rnd: int, in_stats: bool):
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
    def _hook(self, fn: Callable) -> str | None:
        """Call the hook; None when it answered, else its error (noted). ServerGone when the server is gone."""
        try:
            fn(self.info)
            return None
        except records.HookError as e:
            if not is_alive(self.info.url):
                raise load.ServerGone([]) from None
            self.notes.append(f"hook: {e}")
            return str(e)

    def _pull_records(self, c: int, rep: int) -> str | None:
        """Fetch the hook's records into the run directory; the error, if they could not be fetched."""
        try:
            coll, steps, meta = records.fetch(self.info)
        except records.HookError as e:
            self.notes.append(f"hook: {e}")
            return str(e)
        self.hook_meta = meta
        self.coll = records.merge(self.coll, coll, ["rank", "step", "call_idx", "t_start_ns"])
        self.steps = records.merge(self.steps, steps, ["rank", "step", "t_start_ns"])
        self.rd.write_table(C.HOOK_COLLECTIVES, self.coll)
        self.rd.write_table(C.HOOK_STEPS, self.steps)
        self.rd.write_json(C.HOOK_META, meta)

    # ---- analysis -----------------------------------------------------------
    def _analyse(self) -> None:
        from tpcomm.attribute.analysis import analyse_run_dir

        if self.info.plugin is not None:
            self.rd.write_json(C.HOOK_STATUS, self.info.plugin)
        self.summary = analyse_run_dir(
            self.rd,
            model_source=self.cfg.model_config,
            hook_status=self.info.plugin,
            notes=self.notes,
            conditions=self.conditions(),
        )

    def _profile(self, prompts: load.Prompts) -> None:
        from tpcomm.attribute.profile import profile_run

        doc = profile_run(self.info, self.cfg.spec, prompts, self.cfg.profile_dir, self.rd)
        self.rd.write_json(C.PROFILE_SUMMARY, doc)
        self.profile_doc = doc

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
        }

    def result(self, complete: bool, reason: str | None = None) -> dict:
        return {
            "complete": complete,
            "incomplete_reason": reason,
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
    from tpcomm.attribute.analysis import analyse_run_dir
    from tpcomm.errors import InputError

    rd = RunDir(run_dir, create=False)
    levels = rd.read_json(C.LOAD_LEVELS)
    if levels is None:
        raise InputError(
            f"--reanalyse {run_dir}", "has no load/levels.json", "a run directory written by tpcomm attribute"
        )
    status = rd.read_json(C.STATUS) or {}
    rd.record_command("attribute --reanalyse", argv)
    att = analyse_run_dir(rd, model_source=model_config, notes=[f"re-analysed from the run's records ({rd.path})"])
    state = (status.get("attribute") or {}).get("state", "complete")
    return {
        "complete": state == "complete",
        "incomplete_reason": (status.get("attribute") or {}).get("reason"),
        "run_dir": str(rd.path),
        "plugin": att.plugin,
        "levels": levels,
        "attribution": att.to_json(),
        "profile": None,
        "notes": att.notes,
        "config": {"reanalyse": str(rd.path), "model_config": model_config},
    }
