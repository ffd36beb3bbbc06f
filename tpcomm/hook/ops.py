"""Opaque torch custom ops that carry a timed collective through torch.compile.

On platforms where vLLM calls its collectives directly (the CPU build:
`use_custom_op_collectives()` is False), dynamo traces GroupCoordinator's
methods into the model graph. Timing code there would either be traced away or
break the graph, so under compilation the patched methods emit these ops
instead; at run time each op looks its group up by `unique_name` ("tp:0", the
same string in every process and in vLLM's on-disk compile cache) and calls the
patched, timed method eagerly.

The ops are out of place like vLLM's own (`vllm::all_reduce`): the CPU
communicator reduces in place, so the input is copied first (512 B per token for
the tiny model; the copy is outside the timed region).
"""

from __future__ import annotations

import torch

from tpcomm.hook.core import HOOK


def _group(name: str):
    from vllm.distributed.parallel_state import _groups

    ref = _groups.get(name)
    group = ref() if ref is not None else None
    if group is None:
        raise ValueError(f"tpcomm: process group {name!r} is not registered in this process")
    HOOK.compiled_op_calls += 1  # evidence that compiled graphs carry tpcomm ops (see status)
    return group


@torch.library.custom_op("tpcomm::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _group(group_name)._all_reduce_out_place(x.clone())


@all_reduce.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("tpcomm::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    return _group(group_name)._all_gather_out_place(x, dim).contiguous()


@all_gather.register_fake
def _(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = shape[dim] * world_size
    return x.new_empty(shape)


@torch.library.custom_op("tpcomm::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    return _group(group_name)._reduce_scatter_out_place(x, dim).contiguous()


@reduce_scatter.register_fake
def _(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = shape[dim] // world_size
    return x.new_empty(shape)
