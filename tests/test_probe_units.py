"""Probe pieces that need no ranks: sizes, nccl-tests import, the latency fit, the table, CLI input errors."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from probes.spec import build_items, parse_bytes, parse_sizes
from tpcomm.cli import cli
from tpcomm.errors import InputError
from tpcomm.probe.fit import LatencyModel, fit_document, fit_segments, load_latency_model
from tpcomm.probe.nccl_import import import_file, parse_text
from tpcomm.probe.results import format_table

# Real nccl-tests 2.x output layout (8x H100 node), trimmed to a few sizes.
NCCL_TEXT = """\
# nccl-tests version 2.17.6 nccl-headers=22803 nccl-library=22803
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   6899 on ztan-mig-235z device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   6900 on ztan-mig-235z device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   6901 on ztan-mig-235z device  2 [0000:0b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   6902 on ztan-mig-235z device  3 [0000:0c:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.34    0.00    0.00      0    10.20    0.00    0.00      0
        4096          1024     float     sum      -1    11.02    0.37    0.56      0    10.91    0.38    0.56      0
       16384          4096     float     sum      -1    11.80    1.39    2.08      0    11.75    1.39    2.09      0
     1048576        262144     float     sum      -1    25.10   41.78   62.66      0    24.90   42.11   63.17      0
    16777216       4194304     float     sum      -1   110.50  151.83  227.74      0   110.10  152.38  228.57      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 58.6
"""


def test_sizes_parse_ranges_and_units():
    assert parse_bytes("14336") == 14336 and parse_bytes("16K") == 16384 and parse_bytes("1MiB") == 1 << 20
    assert parse_sizes("1K:8K:x2") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:3K:+1K,14336") == [1024, 2048, 3072, 14336]
    for bad in ("abc", "8K:1K", "1K:8K:x1", "1K:2K:3K:4K", ""):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_items_put_all_reduce_first_and_small_sizes_first():
    items = build_items(
        ["gloo"], ["eager"], {"all_gather": [(4, "bfloat16")], "all_reduce": [(8, "bfloat16"), (2, "bfloat16")]}
    )
    assert [(i["op"], i["bytes"]) for i in items] == [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4)]


def test_nccl_tests_text_import(tmp_path):
    rows = parse_text(NCCL_TEXT)
    assert len(rows) == 5 and {r["op"] for r in rows} == {"all_reduce"}
    assert rows[0]["world_size"] == 4 and rows[0]["mode"] == "eager" and rows[0]["timing"] == "pipelined"
    r = rows[3]
    assert r["bytes"] == 1048576 and r["p50_us"] == 25.10 and r["busbw_GBps"] == 62.66 and r["wrong"] == 0
    # the busbw nccl-tests printed follows its own formula: algbw * 2(n-1)/n
    assert math.isclose(r["busbw_GBps"], r["algbw_GBps"] * 2 * 3 / 4, rel_tol=0.01)
    assert "H100" in r["hardware"]


def test_nccl_tests_json_import_and_all_gather_bytes(tmp_path):
    doc = {
        "version": 2,
        "args": ["./build/all_gather_perf", "-b", "8"],
        "config": {
            "ngpus": 1,
            "nthreads": 1,
            "graph": 1,
            "devices": [{"rank": i, "device_info": "NVIDIA RTX PRO 6000"} for i in range(8)],
        },
        "results": [
            {
                "size": 8192,
                "count": 256,
                "type": "float",
                "redop": "none",
                "root": "-1",
                "out_of_place": {"time": 20.0, "alg_bw": 0.41, "bus_bw": 0.36, "nwrong": 0},
                "in_place": {"time": 19.0, "alg_bw": 0.43, "bus_bw": 0.38, "nwrong": 0},
            }
        ],
    }
    p = tmp_path / "ag.json"
    p.write_text(json.dumps(doc))
    (r,) = import_file(p)
    assert r["op"] == "all_gather" and r["mode"] == "graph" and r["world_size"] == 8
    assert r["nccl_size_bytes"] == 8192 and r["bytes"] == 1024  # per-rank input, the plan's convention


def test_import_rejects_output_without_results(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text(
        "# Collective test starting: all_reduce_perf\n#  Rank  0 Group  0 Pid 1 on h device  0 [0000:01:00] GPU\n"
    )
    with pytest.raises(InputError, match="no result lines"):
        import_file(p)


def test_fit_finds_protocol_change():
    # two regimes: 10 us + 20 GB/s below 64 KiB, 30 us + 100 GB/s above
    pts = [(b, 10 + b / 20e3) for b in (1024, 4096, 16384, 65536)] + [
        (b, 30 + b / 100e3) for b in (262144, 1 << 20, 4 << 20, 16 << 20)
    ]
    segs = fit_segments(pts)
    assert len(segs) == 2
    assert math.isclose(segs[0]["alpha_us"], 10, rel_tol=0.05) and math.isclose(segs[0]["beta_GBps"], 20, rel_tol=0.05)
    assert math.isclose(segs[1]["beta_GBps"], 100, rel_tol=0.05)
    assert all(s["max_rel_err"] < 0.01 for s in segs)


def test_fit_single_point_is_constant_and_flat_data_has_no_bandwidth_term():
    (s,) = fit_segments([(14336, 25.0)])
    assert s["alpha_us"] == 25.0 and s["beta_GBps"] is None
    (s,) = fit_segments([(1024, 21.0), (2048, 20.0), (4096, 19.0)])  # noisy, falling: no bandwidth term
    assert s["beta_GBps"] is None and 19 <= s["alpha_us"] <= 21


def _row(backend, op, nbytes, p50, timing="isolated", mode="eager", wrong=0):
    return {
        "backend": backend,
        "op": op,
        "mode": mode,
        "timing": timing,
        "bytes": nbytes,
        "world_size": 2,
        "p50_us": p50,
        "p99_us": p50 * 2,
        "algbw_GBps": 1.0,
        "busbw_GBps": 1.0,
        "wrong": wrong,
        "count": nbytes // 2,
        "dtype": "bfloat16",
        "nccl_size_bytes": nbytes,
        "timer": "perf_counter",
    }


def test_latency_model_api(tmp_path):
    rows = [_row("gloo", "all_reduce", b, 300 + b / 1e3) for b in (1024, 14336, 1 << 20)]
    rows += [_row("shm", "all_reduce", b, 5 + b / 5e3) for b in (1024, 14336, 1 << 20)]
    rows += [_row("shm", "all_reduce", 14336, 999, wrong=3)]  # a wrong result never feeds the model
    rows += [_row("shm", "all_gather", 129280, 40, timing="pipelined")]
    from tpcomm.rundir.layout import RunDir

    RunDir(tmp_path).write_json("probe/fit.json", fit_document(rows, {"world_size": 2}))
    m = load_latency_model(tmp_path)
    assert m.backends("all_reduce") == ["shm", "gloo"]  # vLLM-CPU prefers shm
    shm = m.latency_us("all_reduce", 14336)
    assert math.isclose(shm, m.latency_us("all_reduce", 14336, backend="shm"))
    assert 5 < shm < 20 and m.latency_us("all_reduce", 14336, backend="gloo") > 250
    assert m.latency_us("all_gather", 129280) == pytest.approx(40)  # pipelined-only op falls back
    assert m.has("all_gather") and not m.has("send_recv")
    with pytest.raises(LookupError, match="send_recv"):
        m.latency_us("send_recv", 100)
    with pytest.raises(InputError):
        load_latency_model(tmp_path / "nothing")


def test_latency_model_prefers_graph_and_skips_custom_ar_above_its_max():
    rows = [_row("custom-ar", "all_reduce", b, 8, mode="graph") for b in (1024, 4096, 16384)]
    rows += [_row("pynccl", "all_reduce", b, 20, mode=m) for b in (1024, 4096, 16384) for m in ("eager", "graph")]
    rows = [r | {"p50_us": 30.0} if r["backend"] == "pynccl" and r["mode"] == "eager" else r for r in rows]
    m = LatencyModel(fit_document(rows, {}))
    assert m.latency_us("all_reduce", 4096) == pytest.approx(8)
    assert m.latency_us("all_reduce", 64 << 20) == pytest.approx(20)  # beyond custom-ar's 8 MiB: PyNccl, graph
    assert m.latency_us("all_reduce", 4096, backend="pynccl", mode="eager") == pytest.approx(30)


def test_table_has_nccl_tests_columns_and_names_skips():
    rows = [_row("gloo", "all_reduce", 14336, 300.0), _row("gloo", "all_reduce", 14336, 280.0, timing="pipelined")]
    skipped = [
        {"backend": "shm", "op": "all_reduce", "mode": "eager", "bytes": 14336, "reason": "vLLM is not importable"}
    ]
    t = format_table(rows, skipped, {"world_size": 2, "hardware": "cpu"})
    assert "size(B)" in t and "#wrong" in t and "algbw" in t and "busbw" in t and "pipelined" in t
    assert "vLLM is not importable" in t and "Out of bounds values : 0 OK" in t


def test_cli_bad_input_exits_2(tmp_path):
    r = CliRunner().invoke(cli, ["probe", "--sizes", "1K:abc", "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "--sizes" in r.output
    r = CliRunner().invoke(cli, ["probe", "--backend", "infiniband", "--sizes", "1K", "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "infiniband" in r.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # rejected before any run directory


def test_cli_import_writes_run_dir(tmp_path):
    f = tmp_path / "all_reduce_perf.txt"
    f.write_text(NCCL_TEXT)
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["probe", "import", str(f), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    entries = json.loads(r.output)
    assert len(entries) == 5 and {
        "backend",
        "op",
        "mode",
        "bytes",
        "world_size",
        "p50_us",
        "p99_us",
        "busbw_GBps",
        "wrong",
    } <= set(entries[0])
    m = load_latency_model(out)
    assert 10 < m.latency_us("all_reduce", 4096) < 13
    import pandas as pd

    assert len(pd.read_parquet(out / "probe" / "results.parquet")) == 5


def test_plan_sizes_for_the_probe():
    from tpcomm.probe.runner import ProbeConfig, build_spec

    spec, info = build_spec(ProbeConfig(gpus=2), world=2, cuda=False)
    # default: deepseek-v3 at TP 2, batch 1; all-reduce of one token's hidden state first, on both CPU backends
    first = spec["items"][0]
    assert (first["backend"], first["op"], first["bytes"], first["dtype"]) == (
        "gloo",
        "all_reduce",
        7168 * 2,
        "bfloat16",
    )
    assert info["plan"]["model"] == "deepseek-v3" and info["backends"] == ["gloo", "shm"] and info["modes"] == ["eager"]
    spec, _ = build_spec(ProbeConfig(gpus=2, sizes="1K:4K:x2", backends=["gloo"]), world=2, cuda=True)
    assert sorted({(i["bytes"], i["mode"]) for i in spec["items"]}) == [
        (b, m) for b in (1024, 2048, 4096) for m in ("eager", "graph")
    ]


def test_group_size_mismatch_is_an_input_error(tmp_path):
    r = CliRunner().invoke(cli, ["probe", "--gpus", "2", "--tp", "8", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "group" in r.output and not (tmp_path / "x").exists()


# ---- ranks the machine can run (issue 12 item 10, issue 13 item 5) ----------------------------------------------


def test_device_index_by_visible_count():
    from probes.devices import NoDevice, device_index

    assert [device_index(r, 4) for r in range(4)] == [0, 1, 2, 3]  # tpcomm's launcher, torchrun: all GPUs visible
    assert device_index(5, 1) == 0  # srun --gpus-per-task=1: each rank's own GPU is its device 0
    with pytest.raises(NoDevice, match="local rank 2 but only 2 CUDA devices"):
        device_index(2, 2)
    with pytest.raises(NoDevice, match="no CUDA device"):
        device_index(0, 0)


def test_shared_gpus_are_named_by_rank():
    from probes.devices import shared_gpu_message, shared_gpus

    assert shared_gpus(["GPU-a", "GPU-b", None, None]) == {}  # ranks without a GPU share nothing
    assert shared_gpu_message(["GPU-a", "GPU-b"]) is None
    assert shared_gpus(["GPU-a", "GPU-b", "GPU-a", "GPU-a"]) == {"GPU-a": [0, 2, 3]}
    msg = shared_gpu_message(["GPU-a", "GPU-a", "GPU-b", "GPU-b"], ["n1", "n1", "n1", "n1"])
    assert msg.startswith("ranks 0,1 share GPU GPU-a on n1; ranks 2,3 share GPU GPU-b on n1")
    assert "one GPU per rank" in msg


def test_local_rank_from_torchrun_then_srun_then_the_global_rank():
    from probes.devices import local_rank_and_world

    # srun without LOCAL_RANK: SLURM_LOCALID, not the global RANK (rank 5 is local rank 1 of its node)
    srun = {"RANK": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)"}
    assert local_rank_and_world(srun, 5, 8) == (1, 4)
    assert local_rank_and_world({**srun, "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, 5, 8) == (3, 4)
    assert local_rank_and_world({}, 2, 3) == (2, 3)  # one node, nothing said: the global rank


def test_custom_ar_needs_every_rank_to_see_its_nodes_gpus():
    from probes.devices import peers_not_visible

    assert peers_not_visible(["n1", "n1"], [2, 2]) is None  # tpcomm's launcher, torchrun
    assert peers_not_visible(["n1", "n2"], [1, 1]) is None  # one rank per node
    msg = peers_not_visible(["n1", "n1", "n2", "n2"], [4, 4, 1, 1])  # srun --gpus-per-task=1 on n2
    assert msg.startswith("rank 2 sees 1 GPU(s) for 2 ranks on n2") and "local rank" in msg


def test_slack_overruns_are_stated_and_warned_above_ten_percent():
    from tpcomm.probe.results import format_table, slack_notes

    base = {"op": "all_reduce", "mode": "eager", "bytes": 1024, "nccl_size_bytes": 1024, "count": 512}
    base |= {"dtype": "bfloat16", "p50_us": 9.0, "p99_us": 12.0, "algbw_GBps": 0.1, "busbw_GBps": 0.1, "wrong": 0}
    base |= {"timer": "cuda_event", "world_size": 2, "samples": 100, "slack_us": 300.0}
    rows = [
        {**base, "backend": "nccl", "timing": "isolated", "slack_overruns": 3},
        {**base, "backend": "pynccl", "timing": "isolated", "slack_overruns": 11},
        {**base, "backend": "nccl", "timing": "pipelined", "slack_overruns": None},
    ]
    notes = slack_notes(rows)
    assert "300 us sleep kernel" in notes[0] and "in 14 of 200 isolated samples" in notes[0]
    assert len(notes) == 2 and "WARNING: slack overrun in 11/100 samples (11%) of pynccl all_reduce" in notes[1]
    assert notes[1] in format_table(rows, [], {})
    cpu = [{**r, "slack_us": None, "slack_overruns": None, "timer": "perf_counter"} for r in rows]
    assert slack_notes(cpu) == [] and "slack" not in format_table(cpu, [], {})


def test_preempted_samples_are_warned_above_ten_percent():
    """CPU rows: samples in which the scheduler took some rank's core (a busy host) are counted per row, and a
    row where more than 10% of them were is named in the table and under --json."""
    from tpcomm.probe.results import format_table, preempt_notes

    base = {"op": "all_reduce", "mode": "eager", "bytes": 1024, "nccl_size_bytes": 1024, "count": 512, "wrong": 0}
    base |= {"dtype": "float32", "p50_us": 90.0, "p99_us": 120.0, "algbw_GBps": 0.1, "busbw_GBps": 0.1}
    base |= {"timer": "perf_counter", "world_size": 2, "samples": 30, "slack_us": None, "slack_overruns": None}
    rows = [
        {**base, "backend": "shm", "timing": "isolated", "preempted_samples": 18, "skew_p50_us": 6645.0},
        {**base, "backend": "gloo", "timing": "isolated", "preempted_samples": 3, "skew_p50_us": 40.0},
        {**base, "backend": "shm", "timing": "pipelined", "preempted_samples": None},
    ]
    notes = preempt_notes(rows)
    assert len(notes) == 1 and "a rank was preempted in 18/30 samples (60%) of shm all_reduce 1024 B eager" in notes[0]
    assert notes[0] in format_table(rows, [], {})
    gpu = [{**r, "preempted_samples": None} for r in rows]
    assert preempt_notes(gpu) == [] and "preempted" not in format_table(gpu, [], {})


def test_host_waits_count_every_explicit_wait_and_restore():
    import torch

    from probes.replay_kernels import HostWaits

    before = (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize)
    with HostWaits() as w:
        for call in (torch.cuda.synchronize, lambda: torch.cuda.Event.synchronize(None)):
            try:  # no CUDA here: the wait itself raises, after it was counted
                call()
            except Exception:  # noqa: BLE001
                pass
    assert w.count == 2
    assert (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize) == before


def test_local_rank_limits():
    from tpcomm.probe.limits import check_local_ranks

    check_local_ranks(2, ["nccl", "pynccl"], gpus=2, cpus=1)  # GPU ranks need GPUs, not cores
    check_local_ranks(8, ["gloo"], gpus=0, cpus=2, oversubscribe=True)
    with pytest.raises(InputError, match=r"--gpus 2: starts 2 ranks but 1 CUDA GPU is visible.*--gpus at most 1"):
        check_local_ranks(2, ["nccl", "pynccl", "custom-ar"], gpus=1, cpus=16)
    with pytest.raises(InputError, match="--gpus at most 2, or --oversubscribe"):
        check_local_ranks(3, ["gloo", "shm"], gpus=0, cpus=2)
    # GPU backends asked for on a machine without CUDA run as CPU processes (and report themselves ineligible)
    with pytest.raises(InputError, match="CPU ranks on 2 CPU cores"):
        check_local_ranks(3, ["nccl"], gpus=0, cpus=2)
    # both kinds: each limit applies; --oversubscribe never lifts the GPU one
    with pytest.raises(InputError, match="1 CUDA GPU"):
        check_local_ranks(2, ["gloo", "nccl"], gpus=1, cpus=8, oversubscribe=True)


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tpcomm.cli", *args], capture_output=True, text=True, timeout=120)


def test_more_ranks_than_cores_is_refused_first(tmp_path):
    from tpcomm.probe.limits import usable_cpus
    from tpcomm.probe.runner import _cuda

    if _cuda():
        pytest.skip("the CPU-core limit applies to CPU ranks (GPU refusal: test_probe_gpu.py)")
    n = usable_cpus() + 1
    for extra in ([], ["--replay"], ["--replay", "--tp", "3", "--model", "deepseek-v3"]):
        out = tmp_path / f"r{len(extra)}"
        p = _cli("probe", *extra, "--gpus", str(n), "--out", str(out))
        # one line naming --gpus, the limit and the flag; not the plan's complaint about TP or heads
        assert p.returncode == 2, p.stderr
        line = p.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert f"--gpus {n}" in line and f"at most {usable_cpus()}" in line and "--oversubscribe" in line
        assert "--tp" not in line and "heads" not in line
        assert not out.exists()
    p = _cli("probe", "--gpus", "999", "--out", str(tmp_path / "big"))
    assert p.returncode == 2 and "999 CPU ranks" in p.stderr and "--oversubscribe" in p.stderr
    # with --oversubscribe the machine's limit is lifted and the next check speaks: the plan at TP 999
    p = _cli("probe", "--gpus", "999", "--oversubscribe", "--out", str(tmp_path / "big2"))
    assert p.returncode == 2 and "--oversubscribe" not in p.stderr and "--tp 999" in p.stderr
