"""`tpcomm probe` with real ranks: the default run, every op, a dead rank, a hung
collective, Ctrl-C, and two torchrun "nodes" over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import vllm_cpu_shm

from tpcomm.probe.fit import load_latency_model
from tpcomm.probe.launcher import free_port

pytestmark = pytest.mark.dist
BIN = Path(sys.executable).parent
TPCOMM = [sys.executable, "-m", "tpcomm.cli"]


def _probe(args, env=None, timeout=240):
    t0 = time.monotonic()
    p = subprocess.run(
        TPCOMM + ["probe", *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    return p, time.monotonic() - t0


def _rank_pids(run: Path) -> list[int]:
    pids = []
    for f in (run / "probe" / "ranks").glob("rank*.json"):
        pids.append(json.loads(f.read_text())["pid"])
    return pids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def _cuda_gpus() -> int:
    """CUDA GPUs here, asked the way `tpcomm probe` asks (its default backends follow the device present)."""
    from tpcomm.probe.limits import visible_gpus
    from tpcomm.probe.runner import _cuda

    return visible_gpus(_cuda())


def test_default_probe_on_two_ranks(tmp_path):
    """Default backends: gloo + shm without CUDA; nccl, pynccl, custom-ar on CUDA (refused on fewer than 2 GPUs)."""
    run = tmp_path / "run"
    gpus = _cuda_gpus()
    p, wall = _probe(["--gpus", "2", "--out", str(run), "--json"])
    if gpus == 1:
        assert p.returncode == 2 and "1 CUDA GPU is visible" in p.stderr and not run.exists(), p.stderr[-2000:]
        return
    assert p.returncode == 0, p.stderr[-3000:]
    if gpus >= 2:
        entries = json.loads(p.stdout)
        assert {e["backend"] for e in entries if e["op"] == "all_reduce"} >= {"nccl", "pynccl"}
        assert all(e["wrong"] == 0 and e["world_size"] == 2 and e["timer"] == "cuda_event" for e in entries)
        assert {e["mode"] for e in entries} == {"eager", "graph"}
        return
    entries = json.loads(p.stdout)
    keys = {"backend", "op", "mode", "bytes", "world_size", "p50_us", "p99_us", "busbw_GBps", "wrong"}
    assert entries and all(keys <= set(e) for e in entries)
    # deepseek-v3 at TP=2, batch 1: the per-token all-reduce is 7168 * 2 B; the logits all-gather is vocab/2 * 2 B
    ar = [e for e in entries if e["op"] == "all_reduce" and e["bytes"] == 14336]
    want = {"gloo", "shm"} if vllm_cpu_shm() else {"gloo"}  # shm needs AVX-512 here (conftest.tp_backend)
    assert {e["backend"] for e in ar} == want and {e["timing"] for e in ar} == {"isolated", "pipelined"}
    assert all(e["wrong"] == 0 and e["world_size"] == 2 and e["p50_us"] > 0 for e in entries)
    assert any(e["op"] == "all_gather" for e in entries)
    df = pd.read_parquet(run / "probe" / "results.parquet")
    assert len(df) == len(entries) and (df["p50_us"] <= df["p99_us"]).all() and (df["min_us"] <= df["p50_us"]).all()
    model = load_latency_model(run)
    assert model.backends("all_reduce")[0] == ("shm" if vllm_cpu_shm() else "gloo")
    assert model.latency_us("all_reduce", 14336) > 0
    topo = json.loads((run / "topo.json").read_text())
    assert topo["cpu"]["logical_cpus"] >= 1
    assert json.loads((run / "status.json").read_text())["probe"]["state"] == "complete"
    print(f"default probe wall time: {wall:.1f} s")


def test_isolated_skew_reads_back_a_known_late_start(tmp_path, shm_kernels):
    """Rank 1 starts every isolated op 20 ms after the line-up: the other rank waits that long inside it, so the
    slowest rank's time holds the 20 ms and the measured skew is 20 ms; without the delay the skew is small.
    (20 ms, not less: on a shared 2-core machine a rank may lose a scheduler slice of a few ms at the end of it.)"""
    late_us = 20000.0
    run = tmp_path / "run"
    args = ["--gpus", "2", "--backend", "gloo,shm", "--sizes", "1K", "--iters", "30", "--mode", "eager", "--json"]
    p, _ = _probe([*args, "--out", str(run)], env={"TPCOMM_PROBE_FAULT": f"late:1:*:*:{late_us:g}"})
    assert p.returncode == 0, p.stderr[-3000:]
    iso = {e["backend"]: e for e in json.loads(p.stdout) if e["timing"] == "isolated"}
    assert iso["shm"]["lineup"] == "tiny shm all_reduce" and iso["gloo"]["lineup"] == "tiny gloo all_reduce"
    for e in iso.values():
        # The scheduler can only add to the late start: beside a busy process on the 2 cores (2026-12-06) rank 1
        # lost a slice after its 20 ms and shm's skew p50 read 35.7 ms. Above 1.5x only where the probe itself
        # says most samples had a rank preempted, and warns of that row.
        assert 0.9 * late_us < e["skew_p50_us"], e
        if e["skew_p50_us"] >= 1.5 * late_us:
            assert 2 * e["preempted_samples"] > e["samples"], e
            assert f"{e['backend']} all_reduce" in p.stderr and "a rank was preempted in" in p.stderr, p.stderr[-2000:]
        assert e["p50_us"] >= late_us
    p, _ = _probe([*args, "--out", str(tmp_path / "plain")])
    assert p.returncode == 0, p.stderr[-3000:]
    shm = next(e for e in json.loads(p.stdout) if e["timing"] == "isolated" and e["backend"] == "shm")
    assert "skew" in (tmp_path / "plain" / "probe" / "results.json").read_text()
    print(f"no delay: shm skew p50 {shm['skew_p50_us']:.0f} us, {shm['preempted_samples']}/{shm['samples']} preempted")
    if shm["skew_p50_us"] >= 0.1 * late_us:
        # A busy host (a third process on the 2 cores: 6.6 ms p50 on 2026-12-02): the skew is the scheduler's, and
        # the probe must say so. Most samples had a rank preempted, and the warning names the row.
        assert 2 * shm["preempted_samples"] > shm["samples"], shm
        assert "a rank was preempted in" in p.stderr and "shm all_reduce" in p.stderr, p.stderr[-2000:]
    else:
        assert shm["skew_p50_us"] >= 0


def test_every_op_on_gloo_and_shm_with_skips_explained(tmp_path, shm_kernels):
    run = tmp_path / "run"
    ident = f"tpcomm-test-{os.getpid()}-{time.monotonic_ns()}"
    p, _ = _probe(
        [
            "--gpus",
            "2",
            "--backend",
            "gloo,shm",
            "--ops",
            "all_reduce,all_gather,gather,reduce_scatter,all_to_all,send_recv",
            "--sizes",
            "1K,14336",
            "--iters",
            "20",
            "--warmup",
            "3",
            "--out",
            str(run),
        ],
        env={"VLLM_DIST_IDENT": ident},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # vLLM's shm names are gone (each rank left by os._exit, which skips the destructor that unlinks them: a
    # later run on the same port died at "create shm in SHMManager failed. errno: 17" on CI, 2026-12-07)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(ident)], os.listdir("/dev/shm")
    doc = json.loads((run / "probe" / "results.json").read_text())
    done = {(r["backend"], r["op"]) for r in doc["results"]}
    assert {("gloo", op) for op in ("all_reduce", "all_gather", "gather", "all_to_all", "send_recv")} <= done
    assert {("shm", "all_reduce"), ("shm", "all_gather"), ("shm", "gather")} <= done
    assert all(r["wrong"] == 0 for r in doc["results"])
    skipped = {(s["backend"], s["op"]): s["reason"] for s in doc["skipped"]}
    assert ("gloo", "reduce_scatter") in skipped and ("shm", "send_recv") in skipped
    assert all(reason for reason in skipped.values())
    assert "# all_reduce  backend shm" in p.stdout and "not measured" in p.stdout


def test_shm_gather_survives_a_destination_descheduled_between_ops(tmp_path, shm_kernels):
    """vLLM's shm gather lets a non-destination rank run on without waiting. A destination descheduled while it
    spins in the lineup before a gather used to let its peer commit two ops ahead, and both ranks spun forever
    (a CI failure: "rank 0 never entered collective #622"). The race is forced again and again while the ranks
    time gathers: rank 1 is stopped so rank 0 runs ahead into the next lineup, rank 0 is stopped there, and
    rank 1 runs on alone. The run finishes, every sample checked."""
    run = tmp_path / "run"
    cmd = ["probe", "--gpus", "2", "--backend", "shm", "--ops", "gather", "--sizes", "1K", "--iters", "3000"]
    p = subprocess.Popen(
        TPCOMM + [*cmd, "--warmup", "3", "--timeout", "15", "--out", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ranks, cycles, rng = run / "probe" / "ranks", 0, random.Random(7)

    def timing_pid(r: int) -> int | None:
        try:
            st = json.loads((ranks / f"rank{r}.json").read_text())
        except (OSError, ValueError):
            return None
        return st["pid"] if st.get("phase") == "isolated" else None

    while p.poll() is None:
        r0, r1 = timing_pid(0), timing_pid(1)
        if r0 is None or r1 is None:
            time.sleep(0.01)
            continue
        try:
            os.kill(r1, signal.SIGSTOP)  # rank 0 runs ahead into the next lineup and spins there ...
            time.sleep(0.001)
            os.kill(r0, signal.SIGSTOP)  # ... and is descheduled inside it,
            os.kill(r1, signal.SIGCONT)  # while rank 1 finishes that lineup and its gather, and goes on
            time.sleep(rng.uniform(0.002, 0.004))
        except ProcessLookupError:
            break
        finally:
            for pid in (r0, r1):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        cycles += 1
        time.sleep(rng.uniform(0.0005, 0.002))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, f"after {cycles} forced races: {err[-2000:]}"
    # A run too short to force the race proves nothing.
    assert cycles >= 100, f"the race was forced only {cycles} times"
    print(f"the race forced {cycles} times")
    (row,) = json.loads((run / "probe" / "results.json").read_text())["results"]
    assert (row["backend"], row["op"], row["wrong"]) == ("shm", "gather", 0)


def test_a_backend_this_machine_cannot_run_is_an_error_not_an_empty_success(tmp_path):
    """--backend nccl on a machine without CUDA measures nothing: exit 2 naming --backend and why, the
    table still lists each size as not measured, and status.json marks the probe failed."""
    if _cuda_gpus():
        pytest.skip("a CUDA machine: nccl is not refused here")
    run = tmp_path / "run"
    p, _ = _probe(["--gpus", "2", "--backend", "nccl", "--sizes", "1K", "--out", str(run)])
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --backend nccl: nothing was measured on this machine ("), last
    assert "not measured:" in p.stdout
    stage = json.loads((run / "status.json").read_text())["probe"]
    assert stage["state"] == "failed" and stage["measurements"] == 0 and stage["error"].startswith("nothing measured")
    # The error is chosen from what the ranks saw (no GPU on any rank), kept with each skip, not from its wording.
    skips = json.loads((run / "probe/results.json").read_text())["skipped"]
    assert skips and all(s["visible_gpus_by_rank"] == [0, 0] for s in skips), skips


def test_a_mode_no_backend_runs_is_an_error_naming_no_backend(tmp_path):
    """A backend that runs here (with or without a GPU), asked for a mode it has not: exit 2, and the error
    names no backend as the culprit."""
    run = tmp_path / "run"
    p, _ = _probe(["--gpus", "2", "--backend", "gloo", "--mode", "graph", "--sizes", "1K", "--out", str(run)])
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and last.startswith("Error: probe: every measurement was skipped"), p.stderr[-2000:]
    skips = json.loads((run / "probe/results.json").read_text())["skipped"]
    assert skips and all("no CUDA graph mode" in s["reason"] and "visible_gpus_by_rank" not in s for s in skips)


def test_dead_rank_stops_all_and_keeps_finished_sizes(tmp_path):
    run = tmp_path / "run"
    p, _ = _probe(
        [
            "--gpus",
            "2",
            "--backend",
            "gloo",
            "--sizes",
            "1K,2K,4K",
            "--iters",
            "10",
            "--timeout",
            "20",
            "--out",
            str(run),
        ],
        env={"TPCOMM_PROBE_FAULT": "die:1:all_reduce:4096"},
    )
    assert p.returncode == 1
    assert "rank 1 died" in p.stderr and "all_reduce of 4096 B" in p.stderr, p.stderr[-2000:]
    df = pd.read_parquet(run / "probe" / "results.parquet")
    assert sorted(df["bytes"].unique()) == [1024, 2048]
    assert json.loads((run / "status.json").read_text())["probe"]["state"] == "failed"
    assert load_latency_model(run).latency_us("all_reduce", 1024) > 0
    assert not any(_alive(pid) for pid in _rank_pids(run))


def test_hung_collective_times_out_naming_rank_op_size(tmp_path):
    run = tmp_path / "run"
    p, wall = _probe(
        ["--gpus", "2", "--backend", "gloo", "--sizes", "1K,4K", "--iters", "10", "--timeout", "5", "--out", str(run)],
        env={"TPCOMM_PROBE_FAULT": "hang:1:all_reduce:4096"},
    )
    assert p.returncode == 1
    assert "timed out" in p.stderr and "rank 1 never entered" in p.stderr and "all_reduce of 4096 B" in p.stderr, (
        p.stderr[-2000:]
    )
    df = pd.read_parquet(run / "probe" / "results.parquet")
    assert list(df["bytes"].unique()) == [1024]
    assert not any(_alive(pid) for pid in _rank_pids(run))


def test_ctrl_c_leaves_no_orphans(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        TPCOMM + ["probe", "--gpus", "2", "--backend", "gloo", "--sizes", "1K", "--timeout", "600", "--out", str(run)],
        env={**os.environ, "TPCOMM_PROBE_FAULT": "hang:1:*:*"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            pids = _rank_pids(run) if (run / "probe" / "ranks").exists() else []
            if len(pids) == 2 and all(
                json.loads(f.read_text())["phase"] == "check" for f in (run / "probe" / "ranks").glob("rank*.json")
            ):
                break
            time.sleep(0.2)
        else:
            pytest.fail("ranks never reached the hung collective")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    deadline = time.monotonic() + 10  # the ranks' exit is reaped asynchronously: poll, don't guess
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    assert json.loads((run / "status.json").read_text())["probe"]["state"] == "incomplete"


def test_two_torchrun_nodes_over_loopback(tmp_path):
    run = tmp_path / "run"
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [
            str(BIN / "torchrun"),
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "tpcomm.cli",
            "probe",
            "--backend",
            "gloo",
            "--sizes",
            "1K,64K",
            "--iters",
            "10",
            "--timeout",
            "60",
            "--out",
            str(run),
        ]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        )
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    doc = json.loads((run / "probe" / "results.json").read_text())
    assert doc["conditions"]["launch"] == "joined"
    rows = doc["results"]
    assert {r["bytes"] for r in rows} == {1024, 65536}
    assert all(r["world_size"] == 2 and r["nodes"] == 2 and r["wrong"] == 0 for r in rows)
    # The path between the nodes is named with what chooses it.
    assert doc["conditions"]["inter_node"]["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert "# between nodes: gloo over TCP sockets" in outs[0][0] + outs[1][0]


def test_rank_script_runs_by_hand_under_torchrun(tmp_path):
    # the rank side alone, as on a cluster node: imports only torch for gloo
    script = Path(__file__).resolve().parents[1] / "probes" / "collectives.py"
    p = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(script),
            "--backend",
            "gloo",
            "--ops",
            "all_reduce,all_gather",
            "--sizes",
            "1K",
            "--iters",
            "5",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert recs[0]["kind"] == "start" and recs[-1]["kind"] == "done"
    res = [r for r in recs if r["kind"] == "result"]
    assert {(r["op"], r["timing"]) for r in res} == {
        (o, t) for o in ("all_reduce", "all_gather") for t in ("isolated", "pipelined")
    }
    assert all(r["wrong"] == 0 and r["world_size"] == 2 for r in res)


def test_isolated_time_excludes_the_late_start_at_world_size_one(tmp_path):
    """One rank, started 5 ms late after every line-up (TPCOMM_PROBE_FAULT=late): with nobody to wait for, the
    delay lies before the timed interval, so the isolated p50 stays far below it (it would hold the 5 ms if the
    delay or the line-up were timed)."""
    late_us = 5000.0
    args = ["--gpus", "1", "--backend", "gloo", "--sizes", "1K", "--iters", "20", "--mode", "eager", "--json"]
    p, _ = _probe([*args, "--out", str(tmp_path / "run")], env={"TPCOMM_PROBE_FAULT": f"late:0:*:*:{late_us:g}"})
    assert p.returncode == 0, p.stderr[-3000:]
    (iso,) = [e for e in json.loads(p.stdout) if e["timing"] == "isolated"]
    assert iso["p50_us"] < 0.2 * late_us, iso
    assert iso["slack_overruns"] is None and iso["slack_us"] is None  # no slack on the CPU: nothing to overrun


_CHOOSE_RANK = r"""
import datetime, os, sys, types
import torch, torch.distributed as dist
from probes.devices import NoDevice, cuda_device, rank_layout
rank = int(os.environ["RANK"])
# rank 0 has a GPU of its own; rank 1's CUDA fails at init (a driver mismatch, an exclusive-process GPU)
torch.cuda.is_available = lambda: True
if rank == 0:
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(uuid="GPU-a")
else:
    def broken():
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")
    torch.cuda.device_count = broken
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
try:
    cuda_device(rank, dist.group.WORLD)
    print("NO ERROR")
except NoDevice as e:
    print("NoDevice:", e)
print("layout:", rank_layout(), flush=True)
dist.barrier()  # as the probe ends (probes/collectives.py): leaving with gloo's threads up can abort the process
dist.destroy_process_group()
from probes.collectives import leave
leave(0)  # the probe's own way out: no interpreter teardown racing gloo's threads
"""


def test_a_rank_whose_cuda_fails_still_joins_the_device_gather(tmp_path):
    """Any error while a rank picks its GPU, not only NoDevice, reaches the gather: every rank ends with the
    failing rank's reason within seconds (before: the error escaped on that rank and the other waited out the
    process-group timeout). The gather also records each rank's visible GPU count."""
    port = str(free_port())
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHOOSE_RANK],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    (o0, _), (o1, _) = outs
    assert "NoDevice: rank 1: CUDA failed on this rank (RuntimeError: CUDA driver version is insufficient" in o0
    assert "NoDevice: CUDA failed on this rank (RuntimeError: CUDA driver version" in o1
    assert "'visible_gpus': 1" in o0 and "'visible_gpus': 0" in o0
