"""Start and stop a real vLLM server (the CPU build here, any build in fact).

Used by `tpcomm demo` and by the test suite. The server runs in its own
process group so that stopping it also stops its engine-core and worker
processes, on success, failure and Ctrl-C alike.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpcomm.procgroup import OWN_GROUP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_bind_for(tp: int) -> str:
    """One core (or a slice of cores) per rank, as vLLM-CPU's OMP binding wants: "0|1" for TP 2 on 2 cores.
    Only CPUs this process may run on (a cpuset container may allow fewer than the host has)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    per = max(1, len(cpus) // tp)
    parts = []
    for r in range(tp):
        chunk = [cpus[(r * per + i) % len(cpus)] for i in range(per)]
        parts.append(",".join(map(str, chunk)))
    return "|".join(parts)


@dataclass
class VllmServer:
    """A vLLM OpenAI-compatible server started as a subprocess."""

    model: str
    tp: int = 2
    plugin: bool = True
    api_key: str | None = None
    port: int = 0
    max_model_len: int = 512
    kv_cache_gib: int = 1
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None
    proc: subprocess.Popen | None = None
    # Multi-node (vLLM's multiprocessing executor): this process is node `node_rank` of `nnodes`, reaching
    # node 0 at master_addr:master_port; nodes other than 0 run headless (workers only, no HTTP).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    @property
    def headless(self) -> bool:
        return self.nnodes > 1 and self.node_rank > 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # Multi-node needs `vllm serve` (--headless exists there only): tpcomm.vllm_cli runs it for vllm-cpu too.
        if self.nnodes > 1:
            entry = ["tpcomm.vllm_cli", "serve", self.model]
        else:
            entry = ["vllm.entrypoints.openai.api_server", "--model", self.model]
        cmd = [
            sys.executable,
            "-m",
            *entry,
            "--tensor-parallel-size",
            str(self.tp),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(self.max_model_len),
            "--served-model-name",
            "tiny" if Path(self.model, ".tpcomm-tiny-model").exists() else self.model,
        ]
        if self.nnodes > 1:
            cmd += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
            cmd += ["--master-addr", self.master_addr, "--master-port", str(self.master_port)]
            cmd += ["--headless"] if self.headless else []
        # The key goes by environment (VLLM_API_KEY, see environment()): on the command line it would show
        # in `ps` and in vLLM's "non-default args" log line, and logs get shared.
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind_for(self.tp))
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        if self.plugin:
            # tpcomm's own switch (hook/switch.py): VLLM_PLUGINS stays unset, so every other plugin loads too.
            env.pop("VLLM_PLUGINS", None)
            env["TPCOMM_HOOK"] = "1"
        else:
            # An allowlist naming no plugin: vLLM loads neither tpcomm entry point.
            env["VLLM_PLUGINS"] = ""
            env.pop("TPCOMM_HOOK", None)
        env.update(self.extra_env)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        else:
            env.pop("VLLM_API_KEY", None)
        return env

    def start(self, timeout_s: float = 600) -> VllmServer:
        if not self.port:
            self.port = free_port()
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("a multi-node server needs the master_port its nodes share")
        # O_NOFOLLOW: the demo's log lies in a run directory, which may be shared (see rundir/safefs.py)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        log = os.fdopen(os.open(self.log_path, flags, 0o666), "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **OWN_GROUP,  # a group of its own in this session (procgroup.py: a session of its own starves us)
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # the child holds its own descriptor
        if self.headless:  # no HTTP: node 0's readiness says the whole server is up
            return self
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        import httpx

        from tpcomm.netread import tls

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with code {self.proc.returncode} during start-up"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            try:
                if httpx.get(self.url + "/health", timeout=2, verify=tls()).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(
            f"vLLM server not ready after {timeout_s:.0f} s" + (f"; see {self.log_path}" if self.log_path else "")
        )

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left."""
        p, self.proc = self.proc, None
        if p is None:
            return
        # The group is the leader's pid (OWN_GROUP): known even where the leader itself is gone (a test
        # killed the API server and reaped it), when os.getpgid would fail and leave its engine core and workers.
        pgid = p.pid
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; workers may linger a moment.
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
