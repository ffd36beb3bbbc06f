"""Which all-reduce paths vLLM would enable on this topology, and why not.

The conditions are those of vLLM's own code (0.32), in the order
CudaCommunicator.all_reduce (cuda_communicator.py) tries them: NCCL symmetric memory
(should_nccl_symm_mem_allreduce, skipped for a tensor FlashInfer takes),
FlashInferPcieIpcAllReduce (flashinfer_pcie_ipc_all_reduce.py), FlashInferAllReduce
(flashinfer_all_reduce.py, on by default: VLLM_ALLREDUCE_USE_FLASHINFER=1),
CustomAllreduce.__init__ and should_custom_ar (custom_all_reduce.py),
SymmMemCommunicator (symm_mem.py), then pynccl; CpuCommunicator (cpu_communicator.py)
on CPU. Each path gets only what the ones before it declined.
The tables are read from the installed vLLM when it imports; else the 0.32 values
(vllm_tables.py). The FlashInfer all-reduce + RMSNorm fusion, a compile-time rewrite
that takes all-reduces before CudaCommunicator sees them, is judged in fusion.py.
"""

from __future__ import annotations

import os

from tpcomm import backends
from tpcomm.topo.fusion import allreduce_fusion, flashinfer_usable, sm_int
from tpcomm.topo.vllm_tables import TABLES, VLLM_VERSION

MiB = 1024 * 1024
_FALLBACK = {**TABLES, "source": f"vLLM {VLLM_VERSION} values recorded in tpcomm (vLLM not importable here)"}


def vllm_tables() -> dict:
    try:
        from vllm.distributed.device_communicators import all_reduce_utils as aru
        from vllm.distributed.device_communicators import custom_all_reduce as car
        from vllm.distributed.device_communicators import flashinfer_pcie_ipc_all_reduce as fpi
        from vllm.version import __version__ as v
    except Exception:  # noqa: BLE001 - a partial or CPU-only vLLM build
        return dict(_FALLBACK)
    import inspect

    max_size = inspect.signature(car.CustomAllreduce.__init__).parameters["max_size"].default
    fi_sizes, fi_source = fi_fusion_sizes()
    return {
        "source": f"read from installed vLLM {v}"
        + ("" if fi_source else f" (fusion sizes: tpcomm's {VLLM_VERSION} copy)"),
        "custom_ar_world_sizes": list(car.CustomAllreduce._SUPPORTED_WORLD_SIZES),
        "custom_ar_max_bytes": max_size,
        "custom_ar_max_sizes": {k: dict(val) for k, val in aru.CUSTOM_ALL_REDUCE_MAX_SIZES.items()},
        "symm_mem_max_sizes": {k: dict(val) for k, val in aru.SYMM_MEM_ALL_REDUCE_MAX_SIZES.items()},
        "nccl_symm_min_world": aru.NCCL_SYMM_MEM_ALL_REDUCE_CONFIG["min_world_size"],
        "flashinfer_pcie_world_sizes": list(fpi._SUPPORTED_WORLD_SIZES),
        "fi_fusion_max_size_mb": fi_sizes,
        "fi_fusion_world_sizes": list(TABLES["fi_fusion_world_sizes"]),
        "fi_mnnvl_max_size_mb": dict(aru.FI_MNNVL_ALLREDUCE_MAX_SIZE_MB),
    }


def fi_fusion_sizes() -> tuple[dict, str | None]:
    """FI_ALLREDUCE_FUSION_MAX_SIZE_MB of the installed vLLM, and where it came from (None: tpcomm's copy).

    The module that holds it imports only on CUDA builds (it needs CUDA custom ops), so its literal is
    read from the installed source file when the import fails."""
    import ast
    import importlib.util

    name = "vllm.compilation.passes.fusion.allreduce_rms_fusion"
    try:
        import importlib

        return dict(importlib.import_module(name).FI_ALLREDUCE_FUSION_MAX_SIZE_MB), "import"
    except Exception:  # noqa: BLE001 - CPU builds: read the literal instead
        pass
    try:
        spec = importlib.util.find_spec(name)
        tree = ast.parse(open(spec.origin, encoding="utf-8").read())
        for node in tree.body:
            target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
            if getattr(target, "id", None) == "FI_ALLREDUCE_FUSION_MAX_SIZE_MB" and node.value is not None:
                return ast.literal_eval(node.value), "source"
    except Exception:  # noqa: BLE001 - no vLLM source: the copy
        pass
    return dict(TABLES["fi_fusion_max_size_mb"]), None


def custom_ar_max_bytes(t: dict, cc: str | None, tp: int, symm_mem: bool) -> int:
    """CustomAllreduce's size limit: its default (8 MiB), capped by CUSTOM_ALL_REDUCE_MAX_SIZES[sm][tp]
    when torch symmetric memory is enabled (CustomAllreduce.__init__, symm_mem_enabled), which vLLM
    decides by whether the symmetric-memory rendezvous got a multicast pointer (symm_mem.py)."""
    cap = t.get("custom_ar_max_sizes", {}).get(cc or "", {}).get(tp) if symm_mem else None
    return min(cap, t["custom_ar_max_bytes"]) if cap is not None else t["custom_ar_max_bytes"]


def _env_on(backend: str, name: str) -> bool:
    """A backend's switch (tpcomm/backends/<backend>.json "switches"), vLLM's default where unset."""
    default = dict(backends.registry()[backend].switches)[name]
    return os.environ.get(name, default) not in ("0", "", "false", "False")


def flashinfer_ar_max_bytes(t: dict, cc: str | None, tp: int, nodes: int = 1) -> int | None:
    """FlashInferAllReduce.max_workspace_size: the mnnvl backend's tuned size (exclusive, so minus one)
    where FI_MNNVL_ALLREDUCE_MAX_SIZE_MB has (sm, tp, nodes), else FI_ALLREDUCE_FUSION_MAX_SIZE_MB[sm][tp];
    None: no size for this SM and world size (vLLM disables it)."""
    if cc is None:
        return None
    sm = sm_int(cc)
    mb = t["fi_fusion_max_size_mb"].get(sm, {}).get(tp)
    if not mb:
        return None
    backend = os.environ.get("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "auto")
    tuned = t.get("fi_mnnvl_max_size_mb", {}).get((sm, tp, nodes)) if backend in ("auto", "mnnvl") else None
    return int(tuned * MiB) - 1 if tuned is not None else int(mb * MiB)


def flashinfer_ar(cc: str | None, tp: int, installed: bool, t: dict, batch_invariant: bool) -> tuple:
    """(eligible, why, lever, max_bytes) of vLLM's standalone FlashInfer all-reduce (FlashInferAllReduce)."""
    lever = None
    if not _env_on("flashinfer-ar", "VLLM_ALLREDUCE_USE_FLASHINFER"):
        return False, "switched off by VLLM_ALLREDUCE_USE_FLASHINFER=0", None, None
    if batch_invariant:
        return False, "VLLM_BATCH_INVARIANT is set: no fixed reduction order", None, None
    if tp == 1:
        return False, "one GPU: no all-reduce", None, None
    if not installed:
        return False, "flashinfer (flashinfer.comm.allreduce_fusion) not importable", "install flashinfer", None
    mx = flashinfer_ar_max_bytes(t, cc, tp)
    if mx is None:
        sizes = sorted(t["fi_fusion_max_size_mb"])
        return (
            False,
            f"no FlashInfer size for SM {cc} at world size {tp} (FI_ALLREDUCE_FUSION_MAX_SIZE_MB: {sizes})",
            lever,
            None,
        )
    backend = os.environ.get("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "auto")
    be = {
        "auto": "backend mnnvl if NVSwitch multicast works, else trtllm",
        "mnnvl": "backend mnnvl (VLLM_FLASHINFER_ALLREDUCE_BACKEND), needs NVSwitch multicast",
        "trtllm": "backend trtllm (VLLM_FLASHINFER_ALLREDUCE_BACKEND)",
    }.get(backend, f"backend {backend}")
    base = int(t["fi_fusion_max_size_mb"][sm_int(cc)][tp] * MiB)
    if backend == "auto" and mx != base:  # the mnnvl tuned size: holds only where multicast works
        be += f"; {mx / MiB:.4g} MiB is the mnnvl size, {base / MiB:.4g} MiB if it falls back to trtllm"
    return (
        True,
        f"on by default: 2-D contiguous fp16/bf16/fp32 tensors up to {mx / MiB:.4g} MiB ({be}; the mnnvl workspace "
        "uses about a third of that per call); NCCL symmetric memory and custom all-reduce get only what it declines",
        "VLLM_ALLREDUCE_USE_FLASHINFER=0 to compare",
        mx,
    )


def gpu_paths(
    gpu: dict,
    tp: int,
    t: dict,
    flashinfer: bool | None = None,
    server_batch_invariant: bool | None = None,
    fi_comm: bool | None = None,
) -> list[dict]:
    """Each all-reduce path vLLM tries, in its order, with eligible True/False and why. First the
    FlashInfer all-reduce + RMSNorm fusion (decided at compile time, before any dispatch);
    `flashinfer`: usable in the server's environment (None: vLLM's has_flashinfer() mirrored here);
    `fi_comm`: flashinfer importable there, all the standalone all-reduce needs (None: asked here);
    `server_batch_invariant`: the server's VLLM_BATCH_INVARIANT if known (None: this shell's)."""
    from tpcomm.topo.fusion import batch_invariant

    gpus = gpu["gpus"][:tp]
    idx = range(len(gpus))
    nvlink_all = all(gpu["nvlink_p2p"][i][j] for i in idx for j in idx)
    p2p_all = all(gpu["p2p_read"][i][j] for i in idx for j in idx)
    cc = gpus[0]["compute_capability"] if gpus else None
    out = []

    def add(name, ok, why, lever=None, **extra):
        out.append({"path": name, "eligible": ok, "why": why, "lever": lever, **extra})

    if len(gpus) < tp:
        add("all", False, f"TP={tp} but only {len(gpus)} GPU(s) visible on this node")
        return out
    import importlib.util

    # Two different questions: the fusion pass needs vLLM's has_flashinfer() (kernels it can load or JIT),
    # the standalone all-reduce that flashinfer.comm imports with allreduce_fusion (flashinfer_all_reduce
    # .fi_ar_available), judged here by the package being installed (importing it needs torch and CUDA).
    if flashinfer is None:
        flashinfer = flashinfer_usable()[0]
    installed = importlib.util.find_spec("flashinfer") is not None if fi_comm is None else fi_comm
    bi = batch_invariant(server_batch_invariant)[0]
    fu = allreduce_fusion(cc, tp, flashinfer, t, server_batch_invariant=server_batch_invariant)
    add(
        "flashinfer-fused-ar-rmsnorm",
        bool(fu["enabled"]),
        fu["why"],
        fu["lever"],
        max_bytes=fu["max_bytes"],
    )
    fi_ar = flashinfer_ar(cc, tp, installed, t, bi)
    if fi_ar[0] and not flashinfer:  # importable, but vLLM's has_flashinfer() says its kernels cannot load
        fi_ar = (
            fi_ar[0],
            fi_ar[1] + "; has_flashinfer() says no (no flashinfer-cubin, no nvcc+ninja for its JIT): if its "
            "workspace then fails to build, vLLM disables it with a log line (check the server log)",
            *fi_ar[2:],
        )
    # torch symmetric memory: judged first because it also caps custom all-reduce's size
    sizes = t["symm_mem_max_sizes"].get(cc or "", {})
    if not _env_on("torch-symm-mem", "VLLM_ALLREDUCE_USE_SYMM_MEM"):
        symm = (False, "switched off by VLLM_ALLREDUCE_USE_SYMM_MEM=0")
    elif not sizes:
        symm = (False, f"compute capability {cc} not in {sorted(t['symm_mem_max_sizes'])}")
    elif tp not in sizes:
        symm = (False, f"world size {tp} not in {sorted(sizes)} for SM {cc}")
    elif not nvlink_all:
        symm = (False, "needs NVSwitch multicast; these GPUs are not NVLink-connected")
    elif bi:
        symm = (False, "VLLM_BATCH_INVARIANT is set: vLLM disables it")
    else:
        symm = (True, f"eligible if NVSwitch multicast works (NVML cannot confirm), up to {sizes[tp] // MiB} MiB")
    declined = " (only tensors FlashInfer's all-reduce declines)" if fi_ar[0] else ""
    # NCCL symmetric memory (opt-in)
    if not _env_on("nccl-symm-mem", "VLLM_USE_NCCL_SYMM_MEM"):
        add("nccl-symm-mem", False, "opt-in, off", "VLLM_USE_NCCL_SYMM_MEM=1")
    else:
        ok = tp >= t["nccl_symm_min_world"]
        add("nccl-symm-mem", ok, f"on; world size {tp} {'>=' if ok else '<'} {t['nccl_symm_min_world']}{declined}")
    # FlashInfer PCIe IPC (opt-in)
    fi_ok = tp in t["flashinfer_pcie_world_sizes"]
    if not _env_on("flashinfer-pcie-ipc", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"):
        add(
            "flashinfer-pcie-ipc",
            False,
            "opt-in, off" + ("" if fi_ok else f"; world size {tp} not in {t['flashinfer_pcie_world_sizes']}"),
            "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1 (one node, bf16/fp16, FlashInfer with PcieIpcAllReduceWorkspace)"
            if fi_ok
            else None,
        )
    else:
        add(
            "flashinfer-pcie-ipc",
            fi_ok,
            "on; needs one node, bf16/fp16 and a FlashInfer build with PcieIpcAllReduceWorkspace"
            if fi_ok
            else f"world size {tp} not in {t['flashinfer_pcie_world_sizes']}",
        )
    # FlashInfer's standalone all-reduce (default on)
    add("flashinfer-ar", fi_ar[0], fi_ar[1], fi_ar[2], max_bytes=fi_ar[3])
    # vLLM custom all-reduce
    if tp == 1:
        add("custom-ar", False, "one GPU: no all-reduce")
    elif tp not in t["custom_ar_world_sizes"]:
        add("custom-ar", False, f"world size {tp} not in {t['custom_ar_world_sizes']}")
    elif tp > 8:
        add("custom-ar", False, f"world size {tp} > 8: should_custom_ar declines every tensor")
    elif tp > 2 and not nvlink_all:
        add(
            "custom-ar",
            False,
            "not supported on more than two PCIe-only GPUs (needs NVLink between every pair)",
            "TP=2, or the opt-in FlashInfer PCIe IPC all-reduce",
        )
    elif not p2p_all:
        add(
            "custom-ar",
            False,
            "GPU P2P not available between every pair (NVML P2P read status)",
            "enable P2P (IOMMU/ACS settings, driver); check NCCL_P2P_DISABLE",
        )
    else:
        mx = custom_ar_max_bytes(t, cc, tp, symm[0])
        full = t["custom_ar_max_bytes"]
        capped = (
            f" (vLLM's CUSTOM_ALL_REDUCE_MAX_SIZES cap, applied only if torch symmetric memory gets NVSwitch "
            f"multicast; else < {_human(full)})"
            if symm[0] and mx != full
            else ""
        )
        add(
            "custom-ar",
            True,
            f"eligible for messages < {_human(mx)}{capped} (multiple of 16 B){declined}",
            max_bytes=mx,
        )
    add("torch-symm-mem", *symm, max_bytes=sizes.get(tp) if symm[0] else None)
    add("pynccl", True, "always available: vLLM's NCCL binding, captured in CUDA graphs")
    return out


def _human(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // 1024} KiB"


def cpu_paths(tp: int, vllm_installed: bool) -> list[dict]:
    if not vllm_installed:
        return [
            {"path": "shm", "eligible": False, "why": "vLLM is not installed", "lever": None},
            {"path": "gloo", "eligible": True, "why": "torch.distributed gloo", "lever": None},
        ]
    return [
        {
            "path": "shm",
            "eligible": tp > 1,
            "why": (
                "vLLM-CPU's shared-memory all-reduce (torch.ops._C.shm_allreduce) for TP/PP groups whose ranks "
                "share one machine and VLLM_DIST_IDENT"
            )
            if tp > 1
            else "one rank: no all-reduce",
            "lever": "VLLM_CPU_OMP_THREADS_BIND: one core set per rank, on one NUMA node",
        },
        {
            "path": "gloo",
            "eligible": True,
            "why": "fallback when the shm communicator is off; ops shm lacks",
            "lever": None,
        },
    ]
