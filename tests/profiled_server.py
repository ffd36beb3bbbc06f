"""A vLLM-CPU TP 2 server of the tiny DeepSeek-V3-architecture model with vLLM's torch profiler on (its traces
in `srv.profile_dir`), with or without the tpcomm plugin: the pooled servers cannot take --profiler-config, so
the pool is stopped while it runs (two TP-2 servers would fight over the cores)."""

from __future__ import annotations

import json

from tpcomm.vllm_server import VllmServer


def profiled_server(request, tmp_path_factory, plugin: bool, **profiler):
    pool = getattr(request.getfixturevalue("vllm_server_factory"), "__self__", None)  # tests/conftest.py
    if pool is not None:
        pool.close()
    tiny = request.getfixturevalue("tiny_model_dir")
    prof = tmp_path_factory.mktemp("prof")
    log = tmp_path_factory.mktemp("logs") / "profiled_server.log"
    cfg = {"profiler": "torch", "torch_profiler_dir": str(prof), "torch_profiler_with_stack": False, **profiler}
    srv = VllmServer(
        model=str(tiny), tp=2, plugin=plugin, log_path=str(log), extra_args=["--profiler-config", json.dumps(cfg)]
    )
    srv.start()
    srv.profile_dir = prof
    return srv
