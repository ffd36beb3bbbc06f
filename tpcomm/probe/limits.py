"""How many local ranks this machine can run, checked before any rank starts.

A GPU backend needs one GPU per rank (NCCL refuses two ranks on one device, and a
rank beyond the visible count dies with "invalid device ordinal"). A CPU rank
needs a core of its own, or its timings measure the OS scheduler: ranks beyond
the cores are refused unless the user asks for it (`--oversubscribe`).

Only a local launch is checked here: under torchrun/srun each rank may see its
own slice of the node (one GPU, a few cores), and the rank side maps and checks
devices itself (probes/devices.py).
"""

from __future__ import annotations

import os

from tpcomm.errors import InputError

CPU_SIDE = ("gloo", "shm")


def usable_cpus() -> int:
    """Cores this process may run on (affinity and cpusets included)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def visible_gpus(cuda: bool) -> int:
    if not cuda:
        return 0
    import torch

    return torch.cuda.device_count()


def check_local_ranks(
    ranks: int, backends: list[str], gpus: int, cpus: int, oversubscribe: bool = False, flag: str = "--gpus"
) -> None:
    """Raise InputError (one line, exit 2) when `ranks` local ranks cannot each have what their backends need.
    `gpus` = visible CUDA GPUs (0 without CUDA: GPU backends then run nowhere and are reported ineligible)."""
    gpu_side = [b for b in backends if b not in CPU_SIDE]
    cpu_side = [b for b in backends if b in CPU_SIDE]
    if gpu_side and gpus and ranks > gpus:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise InputError(
            f"{flag} {ranks}",
            f"starts {ranks} ranks but {gpus} CUDA GPU{'s are' if gpus != 1 else ' is'} visible here"
            + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else "")
            + f"; {','.join(gpu_side)} need one GPU per rank",
            f"{flag} at most {gpus}" + (", or --backend gloo,shm for CPU ranks" if not cpu_side else ""),
        )
    if (cpu_side or not gpus) and ranks > cpus and not oversubscribe:
        raise InputError(
            f"{flag} {ranks}",
            f"starts {ranks} CPU ranks on {cpus} CPU core{'s' if cpus != 1 else ''}: ranks would share cores "
            "and time the scheduler, not the collective",
            f"{flag} at most {cpus}, or --oversubscribe to run more ranks than cores anyway",
        )
