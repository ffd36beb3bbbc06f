"""vLLM's all-reduce tables, copied from vLLM 0.32.0 for machines where vLLM is absent or cannot import
the module that holds them (rules.vllm_tables() prefers the installed vLLM). Bytes; keys as vLLM keys them.

Sources (vLLM 0.32.0):
- custom_ar_*: vllm/distributed/device_communicators/custom_all_reduce.py (CustomAllreduce.__init__
  max_size default, _SUPPORTED_WORLD_SIZES) and all_reduce_utils.py CUSTOM_ALL_REDUCE_MAX_SIZES
  (the cap that applies when torch symmetric memory is enabled: min(table, default)).
- symm_mem_max_sizes: all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES.
- nccl_symm_min_world: all_reduce_utils.py NCCL_SYMM_MEM_ALL_REDUCE_CONFIG["min_world_size"].
- flashinfer_pcie_world_sizes: flashinfer_pcie_ipc_all_reduce.py _SUPPORTED_WORLD_SIZES.
- fi_fusion_max_size_mb: vllm/compilation/passes/fusion/allreduce_rms_fusion.py
  FI_ALLREDUCE_FUSION_MAX_SIZE_MB (keyed by capability as an int, 90 = SM 9.0; MB = MiB there),
  fi_fusion_world_sizes: vllm/config/compilation.py PassConfig.flashinfer_max_size. The same table
  sizes vLLM's standalone FlashInfer all-reduce (FlashInferAllReduce, via
  PassConfig.default_fi_allreduce_fusion_max_size_mb).
- fi_mnnvl_max_size_mb: all_reduce_utils.py FI_MNNVL_ALLREDUCE_MAX_SIZE_MB, keyed (SM as int, world
  size, node count): the tuned size of the standalone all-reduce with the mnnvl backend (exclusive).
"""

from __future__ import annotations

VLLM_VERSION = "0.32.0"
MiB = 1024 * 1024

TABLES = {
    "source": f"vLLM {VLLM_VERSION} values copied into tpcomm (tpcomm/topo/vllm_tables.py)",
    "custom_ar_world_sizes": [2, 4, 6, 8, 16],
    "custom_ar_max_bytes": 8 * MiB,
    "custom_ar_max_sizes": {
        "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
        "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
        "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
        "10.7": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
    },
    "symm_mem_max_sizes": {
        "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
        "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
        "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
        "10.7": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
    },
    "nccl_symm_min_world": 4,
    "flashinfer_pcie_world_sizes": [2, 4, 8],
    "fi_fusion_max_size_mb": {
        90: {2: 64, 4: 2, 8: 0.5},
        100: {2: 64, 4: 32, 8: 1, 16: 64},
        103: {2: 64, 4: 64, 8: 4, 16: 64},
        107: {2: 64, 4: 64, 8: 2},
    },
    "fi_fusion_world_sizes": [2, 4, 8, 16],
    "fi_mnnvl_max_size_mb": {(103, 4, 1): 80, (103, 8, 1): 64, (103, 8, 2): 64, (103, 16, 4): 8},
}
