"""Start N local ranks of probes/collectives.py and supervise them.

Every rank runs in one process group of its own, so a dead rank, a hung
collective or Ctrl-C ends all of them (SIGTERM, then SIGKILL) and nothing is
left behind. A measurement that makes no progress on any rank for `timeout`
seconds is a hang: the error names the measurement and the rank that never
entered it (ranks count the collectives they enter in a shared file).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from tpcomm.rundir import safefs

# Starting a rank imports torch (and vLLM for the shm backend): seconds on an idle
# machine, much longer on a loaded one. Setup gets this much slack beyond --timeout.
SETUP_GRACE_S = 240.0


class ProbeFailed(RuntimeError):
    """A rank died or hung; `rank`, `item` (backend/op/bytes/mode) say where."""

    def __init__(self, message: str, rank: int | None = None, item: dict | None = None):
        super().__init__(message)
        self.rank, self.item = rank, item
        self.run_dir: str | None = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _describe(item: dict | None) -> str:
    if not item:
        return "backend setup"
    if item.get("timing"):  # a decode-step replay (probes/replay.py)
        return f"{item['op']} (backend {item['backend']}, {item['mode']})"
    return f"{item['op']} of {item['bytes']} B (backend {item['backend']}, {item['mode']})"


class Launch:
    """N ranks on this machine; `supervise()` streams rank 0's records to `on_record`."""

    def __init__(
        self,
        spec: dict,
        nprocs: int,
        workdir: Path,
        timeout: float,
        threads_per_rank: int | None = None,
        module: str = "probes.collectives",
        spec_name: str = "spec.json",
    ):
        self.spec, self.n, self.workdir, self.timeout = spec, nprocs, Path(workdir), timeout
        self.module = module
        self.status_dir = self.workdir / "ranks"
        self.log_dir = self.workdir / "logs"
        self.workdir.mkdir(parents=True, exist_ok=True)
        for d in (self.status_dir, self.log_dir):
            # folders opened without following a link (safefs); what an earlier run left there goes
            os.close(safefs.open_dir(self.workdir, [d.name]))
            for f in d.iterdir():
                f.unlink()
        self.jsonl = Path(spec["out_jsonl"])
        self.jsonl.unlink(missing_ok=True)
        spec = {**spec, "status_dir": str(self.status_dir)}
        self.spec_path = self.workdir / spec_name
        safefs.write_atomic(self.workdir, spec_name, json.dumps(spec, indent=1).encode())
        self.threads = threads_per_rank or max(1, (os.cpu_count() or 1) // nprocs)
        self.procs: list[subprocess.Popen] = []
        self.pgid: int | None = None

    def start(self) -> None:
        port = free_port()
        ident = secrets.token_hex(4)
        root = str(Path(__file__).resolve().parents[2])
        for r in range(self.n):
            env = {
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": str(self.n),
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(self.n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                # the shm backend's segment names: one run's own, never an earlier run's on a reused port
                "VLLM_DIST_IDENT": f"{os.environ.get('VLLM_DIST_IDENT') or 'tpcomm-probe'}-{port}-{ident}",
                "TPCOMM_PROBE_SUPERVISED": "1",
                "OMP_NUM_THREADS": str(self.threads),
                "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
            }
            log = safefs.open_new(self.log_dir, f"rank{r}.log")  # never through a link planted there
            kw = {"process_group": 0 if self.pgid is None else self.pgid}
            p = subprocess.Popen(
                [sys.executable, "-m", self.module, "--spec", str(self.spec_path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **kw,
            )
            log.close()
            if self.pgid is None:
                self.pgid = p.pid
            self.procs.append(p)

    def stop(self) -> None:
        """End every rank: SIGTERM to the group, SIGKILL after 3 s."""
        if self.pgid is None:
            return
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(0.05)
            if all(p.poll() is not None for p in self.procs):
                break
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    # ---- what the ranks are doing -------------------------------------
    def _status(self, r: int) -> dict:
        try:
            return json.loads((self.status_dir / f"rank{r}.json").read_text())
        except (OSError, ValueError):
            return {"phase": "starting", "item": None}

    def _entered(self, r: int) -> int:
        try:
            return struct.unpack("q", (self.status_dir / f"rank{r}.count").read_bytes()[:8])[0]
        except (OSError, struct.error):
            return -1

    def _log_tail(self, r: int, lines: int = 6) -> str:
        try:
            text = (self.log_dir / f"rank{r}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        keep = [ln for ln in text if "Warning" not in ln and "warn(" not in ln][-lines:]
        return "\n".join("    " + ln for ln in keep)

    def _is_victim(self, r: int) -> bool:
        tail = self._log_tail(r, 40).lower()
        return any(k in tail for k in ("connection closed", "reset by peer", "broken pipe", "connection refused"))

    def _hang_error(self, idle: float) -> ProbeFailed:
        st = {r: self._status(r) for r in range(self.n)}
        entered = {r: self._entered(r) for r in range(self.n)}
        item = next((s["item"] for s in st.values() if s.get("item")), None)
        lo = min(entered.values())
        behind = [r for r, e in entered.items() if e == lo]
        where = _describe(item)
        if len(behind) < self.n:
            msg = (
                f"timed out: no progress for {idle:.0f} s in {where}; rank {','.join(map(str, behind))} never entered "
                f"collective #{lo + 1} (phase {st[behind[0]].get('phase')}), the other ranks wait inside it"
            )
        else:
            msg = f"timed out: no progress for {idle:.0f} s in {where}; every rank is inside collective #{lo} (phase {st[0].get('phase')})"
        return ProbeFailed(msg, behind[0], item)

    def _death_error(self, r: int, code: int) -> ProbeFailed:
        item = self._status(r).get("item")
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        tail = self._log_tail(r)
        return ProbeFailed(
            f"rank {r} died ({how}) during {_describe(item)}" + (f"; its last output:\n{tail}" if tail else ""), r, item
        )

    # ---- supervision ----------------------------------------------------
    def _drain(self, on_record) -> bool:
        """Hand every complete new line of rank 0's results to on_record; True if any."""
        if not self.jsonl.exists():
            return False
        with open(self.jsonl, "rb") as f:
            f.seek(self._pos)
            chunk = f.read()
        self._pos += len(chunk)
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for ln in lines:
            if ln.strip():
                on_record(json.loads(ln))
        return bool(lines)

    def supervise(self, on_record) -> None:
        """Stream records until every rank exits 0; raise ProbeFailed otherwise.
        Ranks are always stopped on the way out (including KeyboardInterrupt),
        and records written before a failure are still handed over."""
        self._pos, self._buf = 0, b""
        last_seen: tuple = ()
        last_change = time.monotonic()
        try:
            while True:
                if self._drain(on_record):
                    last_change = time.monotonic()
                codes = [p.poll() for p in self.procs]
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    # Survivors may still be writing what they finished; gloo ends them
                    # soon after a peer leaves. Give them a moment before the kill.
                    deadline = time.monotonic() + 3.0
                    while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                        self._drain(on_record)
                        time.sleep(0.05)
                    # The first rank to fail is the cause; its peers fail because it left
                    # (gloo reports a closed connection), so they are named only if alone.
                    r, c = min(bad, key=lambda rc: (self._is_victim(rc[0]), rc[0]))
                    raise self._death_error(r, c)
                if all(c == 0 for c in codes):
                    self._drain(on_record)
                    return
                seen = tuple((self._entered(r), self._status(r).get("phase")) for r in range(self.n))
                if seen != last_seen:
                    last_seen, last_change = seen, time.monotonic()
                idle = time.monotonic() - last_change
                setup = any(s[1] in ("starting", "init", "setup") for s in seen)
                if idle > self.timeout + (SETUP_GRACE_S if setup else 0.0):
                    raise self._hang_error(idle)
                time.sleep(0.1)
        finally:
            self.stop()
            # a line rank 0 wrote between the last read and the failure
            self._drain(on_record)


def run_local(
    spec: dict,
    nprocs: int,
    workdir: Path,
    timeout: float,
    on_record,
    module: str = "probes.collectives",
    spec_name: str = "spec.json",
) -> None:
    """Start, supervise and always stop N local ranks (SIGINT/SIGTERM included)."""
    launch = Launch(spec, nprocs, workdir, timeout, module=module, spec_name=spec_name)
    old = signal.getsignal(signal.SIGTERM)

    def _term(signum, frame):
        raise KeyboardInterrupt

    if threading_main():
        signal.signal(signal.SIGTERM, _term)
    try:
        launch.start()
        launch.supervise(on_record)
    finally:
        launch.stop()
        if threading_main():
            signal.signal(signal.SIGTERM, old)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
