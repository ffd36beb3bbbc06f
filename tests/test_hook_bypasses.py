"""Layout-dependent bypasses of the hook's timed paths (issue 27 defect 5), judged with vLLM's own config
rules: sequence parallelism listed as "not timed" only when the layout turns it on (not whenever a model
file imported its module), dual-batch overlap and the EP all-to-all listed when on."""

from __future__ import annotations

import sys
import types

import pytest

from tpcomm.analysis.coverage import not_timed
from tpcomm.hook.bypasses import SP_MODULE, sequence_parallel_on
from tpcomm.hook.fused import uncovered_detail

SP_NAME = "vllm.models.common.ops.sequence_parallel"


def _config(**parallel):
    from vllm.config import ParallelConfig  # vLLM's own properties: use_ubatching, use_all2all, ...

    return types.SimpleNamespace(parallel_config=ParallelConfig(**parallel))


def _listed(cfg) -> list[str]:
    return not_timed({"per_rank": [{"allreduce_fusion": {"not_covered_detail": uncovered_detail(cfg)}}]})


@pytest.fixture
def sp_model(monkeypatch):
    """The SP ops module imported, and a served model whose `_use_sequence_parallel` is deepseek_v4's rule."""
    monkeypatch.setitem(sys.modules, SP_NAME, types.ModuleType(SP_NAME))
    model = types.ModuleType("vllm.models.tpcomm_test.model")

    def _use_sequence_parallel(cfg):  # vllm/models/deepseek_v4/nvidia/model.py, MEGA MoE backends left out
        pc = cfg.parallel_config
        return (
            pc.pipeline_parallel_size == 1
            and pc.enable_expert_parallel
            and pc.tensor_parallel_size > 1
            and pc.data_parallel_size > 1
        )

    model._use_sequence_parallel = _use_sequence_parallel
    monkeypatch.setitem(sys.modules, model.__name__, model)


def test_sequence_parallel_is_listed_only_when_the_layout_turns_it_on(sp_model):
    off = _config(tensor_parallel_size=2)
    assert sequence_parallel_on(off) is False
    assert not any(SP_MODULE in line for line in _listed(off))
    on = _config(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True)
    assert sequence_parallel_on(on) is True
    assert any(SP_MODULE in line for line in _listed(on))


def test_dual_batch_overlap_and_the_ep_all_to_all_are_listed_when_on():
    plain = _listed(_config(tensor_parallel_size=2))
    assert not any("dual-batch overlap" in x or "all-to-all" in x for x in plain)
    dbo = _listed(_config(tensor_parallel_size=2, enable_dbo=True))
    assert any("dual-batch overlap" in x for x in dbo)
    ep = _listed(_config(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True))
    assert any("EP all-to-all" in x and "allgather_reducescatter" in x for x in ep)


def test_qwen4_exp_s_own_rule_turns_sequence_parallel_on(monkeypatch):
    """qwen4_exp decides SP with `is_hc_sequence_parallel_enabled` (TP > 1 and enable_hc_sp or the MoE rule,
    vllm/models/qwen4_exp/nvidia/model.py): with enable_hc_sp its SP collectives run, so SP is on."""
    monkeypatch.setitem(sys.modules, SP_NAME, types.ModuleType(SP_NAME))
    model = types.ModuleType("vllm.models.tpcomm_test.qwen4_exp")

    def is_hc_sequence_parallel_enabled(cfg):
        pc = cfg.parallel_config
        return pc.tensor_parallel_size > 1 and (pc.enable_hc_sp or pc.use_sequence_parallel_moe)

    model.is_hc_sequence_parallel_enabled = is_hc_sequence_parallel_enabled
    monkeypatch.setitem(sys.modules, model.__name__, model)
    assert sequence_parallel_on(_config(tensor_parallel_size=2)) is False
    assert sequence_parallel_on(_config(tensor_parallel_size=2, enable_hc_sp=True)) is True
