"""Which GPU a rank drives, and the refusal of ranks that would share one.

Launchers differ in what a rank sees: `tpcomm probe` and torchrun start every
rank of a node with all the node's GPUs visible (rank -> device LOCAL_RANK);
srun with --gpus-per-task=1 (or a per-rank CUDA_VISIBLE_DEVICES) gives each
rank exactly one visible GPU, always device 0. Two ranks on one GPU are refused
before any NCCL communicator exists: NCCL would die with its duplicate-GPU error,
and vLLM never runs that way. GPUs are compared by UUID across all ranks (all
nodes), since indices are per process.

The pure functions (`device_index`, `shared_gpus`, `shared_gpu_message`) need no
torch; `cuda_device` is the rank-side check (one gather on the control group).
"""

from __future__ import annotations

import os
import socket


class NoDevice(ValueError):
    """This rank has no GPU of its own to drive; the message says why."""


def device_index(local_rank: int, visible: int) -> int:
    """The device index a rank drives, from its local rank and how many GPUs it sees."""
    if visible < 1:
        raise NoDevice("no CUDA device visible to this rank")
    if local_rank < visible:
        return local_rank
    if visible == 1:  # one GPU per rank (srun --gpus-per-task=1): each rank's own GPU is its device 0
        return 0
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise NoDevice(
        f"local rank {local_rank} but only {visible} CUDA devices are visible to it"
        + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else "")
        + f": start at most {visible} ranks per node, or give each rank one GPU of its own"
    )


def shared_gpus(uuids: list[str | None]) -> dict[str, list[int]]:
    """{uuid: ranks} for every GPU that more than one rank would drive (None = no GPU)."""
    by: dict[str, list[int]] = {}
    for rank, u in enumerate(uuids):
        if u is not None:
            by.setdefault(u, []).append(rank)
    return {u: ranks for u, ranks in by.items() if len(ranks) > 1}


def shared_gpu_message(uuids: list[str | None], hosts: list[str] | None = None) -> str | None:
    """One line naming the ranks that share a GPU, or None when every rank has its own."""
    dup = shared_gpus(uuids)
    if not dup:
        return None
    parts = []
    for u, ranks in dup.items():
        where = f" on {hosts[ranks[0]]}" if hosts else ""
        parts.append(f"ranks {','.join(map(str, ranks))} share GPU {u}{where}")
    return "; ".join(parts) + " (NCCL needs one GPU per rank: start at most one rank per GPU)"


_CHOSEN: dict[str, object] = {}


def cuda_device(local_rank: int, ctrl):
    """This rank's CUDA device, after every rank has said which GPU it would drive.

    Collective over `ctrl` (every rank calls it, with or without a GPU, so none waits
    forever); the outcome is kept for the process, so later backends agree. Raises
    NoDevice on every rank when any rank has no device or two ranks share one."""
    if "outcome" not in _CHOSEN:
        _CHOSEN["outcome"] = _choose(local_rank, ctrl)
    out = _CHOSEN["outcome"]
    if isinstance(out, NoDevice):
        raise out
    return out


def _choose(local_rank: int, ctrl):
    import torch
    import torch.distributed as dist

    uuid = err = None
    idx = -1
    try:
        if not torch.cuda.is_available():
            raise NoDevice("no CUDA device (torch.cuda.is_available() is False)")
        idx = device_index(local_rank, torch.cuda.device_count())
        props = torch.cuda.get_device_properties(idx)
        uuid = str(getattr(props, "uuid", "") or f"pci:{props.pci_domain_id}:{props.pci_bus_id}:{props.pci_device_id}")
    except NoDevice as e:
        err = str(e)
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, (socket.gethostname(), uuid, err), group=ctrl)
    errs = [(r, e) for r, (_, _, e) in enumerate(got) if e]
    if errs:
        r, e = errs[0]
        return NoDevice(e if r == dist.get_rank() or len({x for _, x in errs}) == 1 else f"rank {r}: {e}")
    msg = shared_gpu_message([u for _, u, _ in got], [h for h, _, _ in got])
    if msg:
        return NoDevice(msg)
    return torch.device("cuda", idx)
