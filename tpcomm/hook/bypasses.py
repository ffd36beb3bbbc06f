"""Collectives that bypass the hook's timed paths under a vLLM layout, decided from the worker's own config.

fused.UNCOVERED lists kernels by module; whether such a path runs depends on the layout, not on whether
its module was imported (a model file imports the sequence-parallel ops whether or not SP is on). Here each
layout-dependent bypass is judged with vLLM 0.32's own rule (vllm/config/parallel.py and the model files):

- sequence parallelism: the served model's own rule where it has one, `_use_sequence_parallel(vllm_config)`
  (deepseek_v4, deepseek_v41: PP 1, EP on, TP > 1, and DP > 1 or a MEGA MoE backend) or
  `is_hc_sequence_parallel_enabled(vllm_config)` (qwen4_exp: TP > 1 and enable_hc_sp or
  use_sequence_parallel_moe), else ParallelConfig.use_sequence_parallel_moe;
- dual-batch overlap (`--enable-dbo`, ParallelConfig.use_ubatching): each micro-batch runs on its own thread
  and the two share the hook's process-global step and call state, so their collectives are not timed apart;
- EP all-to-all (ParallelConfig.use_all2all with enable_expert_parallel): dispatch/combine run inside the MoE
  prepare/finalize kernels of the all2all backend, not through GroupCoordinator.
"""

from __future__ import annotations

import sys
from typing import Any

SP_MODULE = "vllm/models/common/ops/sequence_parallel.py"
# The model files' own SP rules in vLLM 0.32 (deepseek_v4 and deepseek_v41; qwen4_exp/nvidia/model.py)
SP_RULES = ("_use_sequence_parallel", "is_hc_sequence_parallel_enabled")


def sequence_parallel_on(vllm_config: Any) -> bool | None:
    """SP as the served model decides it (its `_use_sequence_parallel`), else vLLM's MoE rule; None when unknown."""
    if vllm_config is None:
        return None
    deciders = [
        getattr(m, rule, None)
        for name, m in list(sys.modules.items())
        if name.startswith("vllm.models.") and m is not None
        for rule in SP_RULES
    ]
    deciders = [d for d in deciders if callable(d)]
    try:
        if deciders:
            return any(bool(d(vllm_config)) for d in deciders)
        return bool(vllm_config.parallel_config.use_sequence_parallel_moe)
    except Exception:  # noqa: BLE001 - a config this vLLM does not have: unknown
        return None


def layout_bypasses(vllm_config: Any) -> list[dict]:
    """DBO and EP all-to-all entries in fused.uncovered_detail's shape, `initialised` = on in this layout."""
    pc = getattr(vllm_config, "parallel_config", None)
    if pc is None:
        return []

    def on(attr: str) -> bool | None:
        try:
            return bool(getattr(pc, attr))
        except Exception:  # noqa: BLE001
            return None

    a2a = on("use_all2all")
    ep = on("enable_expert_parallel")
    return [
        {
            "models": "any, with --enable-dbo or micro-batching (ubatch_size > 1)",
            "module": "vllm/v1/worker/gpu_ubatch_wrapper.py",
            "what": "dual-batch overlap: micro-batch threads share the hook's per-process step state, their "
            "collectives are not timed apart",
            "loaded_in_worker": True,
            "initialised": on("use_ubatching"),
        },
        {
            "models": f"MoE with expert parallelism (all2all_backend {getattr(pc, 'all2all_backend', '?')})",
            "module": "vllm/model_executor/layers/fused_moe (prepare/finalize)",
            "what": "EP all-to-all dispatch/combine inside the MoE prepare/finalize kernels, not GroupCoordinator",
            "loaded_in_worker": True,
            "initialised": None if a2a is None or ep is None else a2a and ep,
        },
    ]
