"""Which GPU a rank drives, and the refusal of ranks that would share one.

Launchers differ in what a rank sees: `tpcomm probe` and torchrun start every
rank of a node with all the node's GPUs visible (rank -> device LOCAL_RANK);
srun with --gpus-per-task=1 (or a per-rank CUDA_VISIBLE_DEVICES) gives each
rank exactly one visible GPU, always device 0. Two ranks on one GPU are refused
before any NCCL communicator exists: NCCL would die with its duplicate-GPU error,
and vLLM never runs that way. GPUs are compared by UUID across all ranks (all
nodes), since indices are per process.

The pure functions (`local_rank_and_world`, `device_index`, `shared_gpus`,
`shared_gpu_message`, `peers_not_visible`) need no torch; `cuda_device` is the
rank-side check (one gather on the control group), after which `rank_layout`
holds every rank's host and visible GPU count.
"""

from __future__ import annotations

import os
import socket


class NoDevice(ValueError):
    """This rank has no GPU of its own to drive; the message says why."""


def one_line(e: BaseException) -> str:
    """'Type: first line of the message' (at most 200 characters of it), for a reason given on one line."""
    msg = str(e)
    return f"{type(e).__name__}: {msg.splitlines()[0][:200] if msg else ''}"


def first_reason(errs: list[tuple[int, str]], world: int, me: int) -> str:
    """The first failing rank's reason, from every rank's (rank, reason) of those that failed: prefixed with
    'rank r: ' unless it is this rank's own, or every rank failed for the same reason."""
    r, e = errs[0]
    return e if r == me or (len(errs) == world and len({x for _, x in errs}) == 1) else f"rank {r}: {e}"


def local_rank_and_world(env, rank: int, world: int) -> tuple[int, int]:
    """(local rank, ranks on this node) from the launcher's variables: torchrun's LOCAL_RANK /
    LOCAL_WORLD_SIZE, else srun's SLURM_LOCALID / SLURM_NTASKS_PER_NODE ("4" or "4(x2)"), else the
    global rank and world (one node)."""
    local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID"))
    per_node = env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    return (int(local) if local not in (None, "") else rank), (int(per_node) if per_node.isdigit() else world)


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


def peers_not_visible(hosts: list[str], visible: list[int]) -> str | None:
    """Why vLLM's custom all-reduce cannot be built on this layout, or None. Its P2P checks index the
    visible devices by peer local rank (vLLM's own workers see every GPU of their node), so a rank that
    sees fewer GPUs than its node has ranks (srun --gpus-per-task=1) makes it raise."""
    per_host: dict[str, int] = {}
    for h in hosts:
        per_host[h] = per_host.get(h, 0) + 1
    short = [r for r, (h, v) in enumerate(zip(hosts, visible)) if v < per_host[h]]
    if not short:
        return None
    r = short[0]
    return (
        f"rank {r} sees {visible[r]} GPU(s) for {per_host[hosts[r]]} ranks on {hosts[r]}: vLLM's custom all-reduce "
        "indexes peers' devices by local rank (its workers see every GPU of the node); give every rank all the "
        "node's GPUs (CUDA_VISIBLE_DEVICES unset or the same on each rank)"
    )


_CHOSEN: dict[str, object] = {}


def rank_layout() -> list[dict] | None:
    """[{"host", "visible_gpus"}] per rank, once `cuda_device` has run in this process (else None)."""
    return _CHOSEN.get("layout")  # type: ignore[return-value]


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
    idx, visible = -1, 0
    try:
        if not torch.cuda.is_available():
            raise NoDevice("no CUDA device (torch.cuda.is_available() is False)")
        visible = torch.cuda.device_count()
        idx = device_index(local_rank, visible)
        props = torch.cuda.get_device_properties(idx)
        uuid = str(getattr(props, "uuid", "") or f"pci:{props.pci_domain_id}:{props.pci_bus_id}:{props.pci_device_id}")
    except NoDevice as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - a CUDA init error, an exclusive-process GPU, a driver mismatch:
        # this rank must still join the gather below, or every other rank waits there until the timeout
        err = f"CUDA failed on this rank ({one_line(e)})"
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, (socket.gethostname(), uuid, err, visible), group=ctrl)
    _CHOSEN["layout"] = [{"host": h, "visible_gpus": v} for h, _, _, v in got]
    errs = [(r, e) for r, (_, _, e, _) in enumerate(got) if e]
    if errs:
        return NoDevice(first_reason(errs, len(got), dist.get_rank()))
    msg = shared_gpu_message([u for _, u, _, _ in got], [h for h, _, _, _ in got])
    if msg:
        return NoDevice(msg)
    return torch.device("cuda", idx)
