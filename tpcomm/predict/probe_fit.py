"""Collective latency from a `tpcomm probe` run directory (its fitted model)."""

from __future__ import annotations

from pathlib import Path

from tpcomm.errors import InputError


def probe_latency(run_dir: str | Path, link: dict):
    """(fn(op, bytes, n) -> us, description) from RUN_DIR/probe/fit.json.

    Ops the probe did not measure fall back to the NCCL model on GPU links and
    are refused on CPU (no model to fall back to)."""
    from tpcomm.predict.latency import nccl_model_us

    try:
        from tpcomm.probe.fit import load_latency_model
    except ImportError as e:  # probe package missing from this build
        raise InputError(f"--probe {run_dir}", f"cannot be read: the probe module is not available ({e})", "a tpcomm build with `tpcomm probe`") from None
    model = load_latency_model(run_dir)
    measured_n = getattr(model, "world_size", None)
    desc = f"probe fit from {run_dir}" + (f" ({model.describe()})" if hasattr(model, "describe") else "")

    def fn(op: str, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        if measured_n and n != measured_n:
            raise InputError(f"--probe {run_dir}", f"was measured with {measured_n} ranks, the layout needs {n}",
                             f"a probe run with --gpus {n}, or drop --probe")
        t = model.latency_us(op, nbytes)
        if t is not None:
            return float(t)
        if link["type"] == "shm":
            raise InputError(f"--probe {run_dir}", f"has no measurement of {op}", f"a probe run that includes {op} (--ops)")
        return nccl_model_us(op, nbytes, n, link)[0]

    return fn, desc
