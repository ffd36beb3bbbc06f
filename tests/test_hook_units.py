"""The hook's parts without a server: bounded buffer, columnar records, Prometheus
text, client frames, and vLLM's real plugin loader patching (or not) GroupCoordinator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tpcomm.attribute.hook_client import COLLECTIVE_DTYPES, STEP_DTYPES, records_to_frames, save_records
from tpcomm.hook.metrics import prometheus_text
from tpcomm.hook.recorder import Recorder
from tpcomm.hook.rpc import _pack


def merge_records(*args, **kwargs):
    """tpcomm.hook.routes.merge_records, imported when a test calls it: fastapi is optional, and a machine without
    it (the bare GPU machine of scripts/gpu-check.sh) must still collect this module."""
    from tpcomm.hook.routes import merge_records as real

    return real(*args, **kwargs)


def _filled(rank: int, n: int, cap: int = 16) -> Recorder:
    rec = Recorder(max_records=cap, max_steps=cap)
    g = rec.group_code("tp", "tp:0", rank, 2)
    for i in range(n):
        rec.add(
            g,
            rec.ops.code("all_reduce"),
            512,
            rec.dtypes.code("bfloat16"),
            rec.backends.code("shm"),
            i // 2,
            i % 2,
            1_000_000 + i * 1000,
            1_000_000 + i * 1000 + 40_000,
            rec.timings.code("host-sync"),
        )
    for s in range(n // 2):
        rec.add_step(s, 1_000_000 + s * 2000, 1_000_000 + s * 2000 + 90_000, 1, 1, 0)
    return rec


def test_buffer_is_bounded_counts_drops_and_never_grows():
    rec = _filled(0, 20, cap=16)
    before = rec.nbytes
    assert rec.n == 16 and rec.dropped == 4
    assert rec.add(0, 0, 1, 0, 0, 0, 0, 0, 0, 0) == -1 and rec.dropped == 5
    assert rec.nbytes == before  # preallocated: nothing grows when full
    assert rec.add_step(99, 0, 1, 1, 1, 0) in range(16) and rec.n_steps == 11
    rec.clear()
    assert rec.n == 0 and rec.dropped == 0


def test_default_bound_per_worker_is_stated():
    rec = Recorder()
    # 262,144 collective rows x 43 B + 65,536 step rows x 53 B + 131,072 step request rows x 20 B (recorder.py)
    assert rec.nbytes == 262_144 * 43 + 65_536 * 53 + 131_072 * 20
    assert rec.nbytes < 16.6 * 2**20


def test_columns_roundtrip_through_rpc_packing_routes_and_client(tmp_path):
    per_rank = []
    for rank in (0, 1):
        cols = _filled(rank, 6).columns(rank)
        per_rank.append(
            {
                "meta": {
                    "rank": rank,
                    "enabled": True,
                    "armed": False,
                    "records": 6,
                    "dropped": 0,
                    "record_capacity": 16,
                    "buffer_bytes": 1,
                    "timing": ["host-sync"],
                    "versions": {},
                },
                **{t: {k: _pack(v) for k, v in c.items()} for t, c in cols.items()},
            }
        )
    doc = merge_records(per_rank)
    json.dumps(doc)  # plain JSON types only
    assert doc["meta"]["ranks"] == [0, 1]
    assert doc["collectives"]["rank"] == [0] * 6 + [1] * 6
    assert doc["collectives"]["duration_us"][0] == pytest.approx(40.0)
    coll, steps, meta = records_to_frames(doc)
    # `path` is an optional contract column (records from before it existed still load): it rides along.
    # so are the steps' `untimed_collectives` (and, from CUDA workers, their GPU span: gpu_*)
    assert list(coll.columns) == list(COLLECTIVE_DTYPES) + ["path"]
    assert list(steps.columns) == list(STEP_DTYPES) + ["untimed_collectives"]
    assert coll["path"].eq("group_coordinator").all()
    assert set(coll["group_rank"]) == {0, 1} and set(coll["group"]) == {"tp"}
    assert (coll.groupby(["rank", "step"]).size() == 2).all()
    assert steps["kind"].eq("decode").all() and steps["duration_us"].eq(90.0).all()
    paths = save_records(doc, tmp_path / "run")
    import pandas as pd

    back = pd.read_parquet(paths["collectives"])
    assert len(back) == 12 and back["bytes"].eq(512).all() and back["path"].eq("group_coordinator").all()
    assert json.loads(paths["meta"].read_text())["ranks"] == [0, 1]


def test_prometheus_histograms_are_kept_on_the_worker_and_folded_incrementally():
    rec = _filled(0, 6)
    rec.dropped = 3
    rec.hist.fold(rec, last_step_open=False)
    assert rec.hist.folded == 6 and rec.hist.folded_steps == 3

    def text() -> str:
        return prometheus_text([{"rank": 0, "armed": True, "dropped": rec.dropped, "histograms": rec.hist.export(rec)}])

    lab = 'rank="0",group="tp",op="all_reduce",size="<=1KiB",backend="shm"'
    t = text()
    assert f"tpcomm_collective_duration_us_count{{{lab}}} 6" in t
    assert f'tpcomm_collective_duration_us_bucket{{{lab},le="25"}} 0' in t
    assert f'tpcomm_collective_duration_us_bucket{{{lab},le="50"}} 6' in t
    assert f"tpcomm_collective_duration_us_sum{{{lab}}} 240.000" in t
    assert 'tpcomm_step_duration_us_count{rank="0",kind="decode"} 3' in t
    assert 'tpcomm_dropped_records{rank="0"} 3' in t
    # New rows: only they are folded, and the counts stay cumulative (a Prometheus counter).
    g = rec.group_code("tp", "tp:0", 0, 2)
    rec.add(g, rec.ops.code("all_reduce"), 512, 0, rec.backends.code("shm"), 9, 0, 0, 7_000, 0)
    rec.add(g, rec.ops.code("all_gather"), 300_000, 0, rec.backends.code("shm"), 9, 1, 0, 600_000, 0)
    rec.hist.fold(rec, upto=7)  # row 7 (say, CUDA events not read yet) waits for the next scrape
    t = text()
    assert f"tpcomm_collective_duration_us_count{{{lab}}} 7" in t
    assert f'tpcomm_collective_duration_us_bucket{{{lab},le="10"}} 1' in t
    assert 'op="all_gather"' not in t
    rec.hist.fold(rec)
    assert (
        'tpcomm_collective_duration_us_count{rank="0",group="tp",op="all_gather",size="<=1MiB",backend="shm"} 1'
        in text()
    )
    rec.clear()
    assert "tpcomm_collective_duration_us_count" not in text()


def test_records_pages_cover_every_row_once():
    rec = _filled(0, 16, cap=16)
    pages = [rec.columns(0, page=p, page_rows=5) for p in range(5)]
    assert [len(p["collectives"]["step"]) for p in pages] == [5, 5, 5, 1, 0]
    assert [len(p["steps"]["step"]) for p in pages] == [5, 3, 0, 0, 0]
    whole = rec.columns(0)
    assert (
        np.concatenate([p["collectives"]["t_start_ns"] for p in pages]).tolist()
        == whole["collectives"]["t_start_ns"].tolist()
    )
    assert sum((p["collectives"]["op"] for p in pages), []) == whole["collectives"]["op"]


_LOAD = """
import json, os, sys
import vllm.plugins
from vllm.plugins import load_general_plugins
from vllm.distributed.parallel_state import GroupCoordinator as G
from vllm.v1.worker.worker_base import WorkerWrapperBase as W
for value in json.loads(sys.argv[1]):  # one vLLM import for them all: vLLM reads VLLM_PLUGINS at each load
    os.environ.pop("VLLM_PLUGINS", None)
    if value is not None:
        os.environ["VLLM_PLUGINS"] = value
    vllm.plugins.plugins_loaded = False
    load_general_plugins()
    print("LOADED " + json.dumps({
        "patched": sorted(n for n in dir(G) if hasattr(getattr(G, n, None), "_tpcomm_original")),
        "all_reduce_module": G.all_reduce.__code__.co_filename,
        "worker_methods": sorted(n for n in dir(W) if n.startswith("tpcomm_")),
    }))
"""


def _load_plugins(*values: str | None) -> list[dict]:
    """vLLM's plugin loader run with each VLLM_PLUGINS value in turn (None: unset) in one fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    r = subprocess.run(
        [sys.executable, "-c", _LOAD, json.dumps(values)], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads(line[len("LOADED ") :]) for line in r.stdout.splitlines() if line.startswith("LOADED ")]
    assert len(got) == len(values), r.stdout[-2000:]
    return got


def test_vllm_plugin_loader_patches_only_when_enabled():
    # None: VLLM_PLUGINS unset, vLLM loads every plugin (tpcomm's register() among them, which then marks itself
    # installed for the life of the process without patching: TPCOMM_HOOK is unset). The three in one process,
    # each checked to have patched nothing; "tpcomm" in a fresh one, where its register() runs for the first time.
    offs = _load_plugins("", None, "some_other_plugin")
    for value, off in zip(("", None, "some_other_plugin"), offs, strict=True):
        assert off["patched"] == [] and off["worker_methods"] == [], value
        assert off["all_reduce_module"].endswith("vllm/distributed/parallel_state.py")
    (on,) = _load_plugins("tpcomm")
    assert {
        "_all_reduce_out_place",
        "_all_gather_out_place",
        "all_reduce",
        "gather",
        "broadcast",
        "send",
        "recv",
        "isend_tensor_dict",
        "irecv_tensor_dict",
    } <= set(on["patched"])
    assert on["worker_methods"] == ["tpcomm_metrics", "tpcomm_records", "tpcomm_start", "tpcomm_status", "tpcomm_stop"]
    assert on["all_reduce_module"].endswith("tpcomm/hook/failsafe.py")  # the fail-safe wrapper of every patch


def test_recorder_columns_are_numpy_and_sized():
    cols = _filled(1, 4).columns(1)
    assert isinstance(cols["collectives"]["bytes"], np.ndarray)
    assert cols["collectives"]["group_rank"].tolist() == [1] * 4
    assert cols["steps"]["step"].tolist() == [0, 1]


def test_only_the_outermost_collective_is_recorded():
    """dispatch/combine and the dict collectives call timed collectives inside: one transfer, one row."""
    import torch

    from tpcomm.hook.core import Hook

    class Group:
        unique_name, rank_in_group, world_size = "ep:0", 0, 2
        device = torch.device("cpu")
        _tpcomm_backends = {"broadcast": "gloo", "all_reduce": "gloo"}

    h, g = Hook(), Group()
    x = torch.zeros(64, dtype=torch.bfloat16)
    inner = lambda t: h.timed(g, "all_reduce", t, lambda u: u, t)  # noqa: E731
    outer = lambda d: (inner(d["a"]), inner(d["b"]))  # noqa: E731
    h.start()
    h.step_begin(
        type("S", (), {"num_scheduled_tokens": {"r": 1}, "total_num_scheduled_tokens": 1, "scheduled_new_reqs": []})()
    )
    h.timed(g, "broadcast", {"a": x, "b": x}, outer, {"a": x, "b": x})
    h.timed(g, "all_reduce", x, lambda u: u, x)
    cols = h.rec.columns(0)["collectives"]
    assert cols["op"] == ["broadcast", "all_reduce"]
    assert cols["bytes"].tolist() == [256, 128]  # the dict's two tensors, then the lone one
    assert h.depth == 0
    # A collective that raises leaves the hook ready for the next call.
    with pytest.raises(ValueError):
        h.timed(g, "all_reduce", x, lambda u: (_ for _ in ()).throw(ValueError("boom")), x)
    assert h.depth == 0 and h.disabled_reason is None


def test_worker_publishes_its_metrics_to_a_file_a_scrape_reads(tmp_path, monkeypatch):
    """publish.py: a thread folds new records and writes a snapshot; the route reads it (no engine round trip)."""
    import time

    from tpcomm.hook import publish
    from tpcomm.hook.core import Hook

    monkeypatch.setenv("TPCOMM_METRICS_PUBLISH_S", "0.05")
    monkeypatch.setenv("TPCOMM_METRICS_DIR", str(tmp_path))
    # A dead worker that had this pid left its snapshot (killed workers never run atexit): never read as ours.
    stale = {"rank": 1, "pid": os.getpid(), "histograms": {"collectives": [{"count": 99}]}}
    (tmp_path / f"tpcomm-{os.geteuid()}").mkdir(mode=0o700)
    publish.metrics_path().write_text(json.dumps(stale))
    h = Hook()
    h.rec = _filled(0, 6)
    h.armed = True
    publish.start(h, rank=3)
    files = [{"pid": os.getpid(), "metrics_file": h.metrics_file}]

    def wait_for(pred):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = publish.read_published(files)
            if got and pred(got[0]):
                return got[0]
            time.sleep(0.02)
        raise AssertionError(f"no snapshot matching within 10 s: {publish.read_published(files)}")

    snap = wait_for(lambda d: d["histograms"]["collectives"])
    assert snap["rank"] == 3 and snap["histograms"]["collectives"][0]["count"] == 6
    text = prometheus_text([snap], "published")
    assert 'tpcomm_metrics_age_seconds{rank="3",source="published"}' in text
    h.rec.clear()  # a new start: the next snapshot starts from zero
    wait_for(lambda d: not d["histograms"]["collectives"])
    # A snapshot whose process is gone (a worker that died) is not served: the route falls back to the RPC.
    assert publish.read_published([{"pid": 2**22 + 7, "metrics_file": h.metrics_file}]) is None
