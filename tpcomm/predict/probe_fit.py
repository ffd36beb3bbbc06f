"""Collective latency from a `tpcomm probe` run directory (its fitted model)."""

from __future__ import annotations

from pathlib import Path

from tpcomm.errors import InputError


def probe_latency(run_dir: str | Path, link: dict):
    """(fn(op, bytes, n) -> us, description) from RUN_DIR/probe/fit.json.

    Uses the isolated per-operation fit (what a decode step sees) of the
    backend vLLM would pick (the probe's preference order). Ops the probe did
    not measure fall back to the NCCL model on GPU links and are refused on CPU
    (no model to fall back to). A world size the probe did not run is refused."""
    from tpcomm.predict.latency import nccl_model_us
    from tpcomm.probe.fit import load_latency_model

    model = load_latency_model(run_dir)
    fits = model.doc["models"]
    sizes = sorted({m["world_size"] for m in fits})
    backends = sorted({m["backend"] for m in fits})
    cpu_probe = set(backends) <= {"gloo", "shm"}
    if cpu_probe != (link["type"] == "shm"):
        raise InputError(f"--probe {run_dir}", f"measured {', '.join(backends)}, which does not match the {link['type']} link of the hardware profile",
                         "a probe run on the hardware being predicted (GPU backends for a GPU profile, gloo/shm for --gpu cpu)")
    desc = f"probe fit from {run_dir} (backends {', '.join(backends)}; world size {', '.join(map(str, sizes))}; isolated p50 per call)"

    def fn(op: str, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        if n not in sizes:
            raise InputError(f"--probe {run_dir}", f"was measured with world size {', '.join(map(str, sizes))}; the layout needs {n}",
                             f"a probe run with --gpus {n}, or drop --probe")
        if any(m["op"] == op and m["world_size"] == n for m in fits):
            return float(model.latency_us(op, nbytes))
        if link["type"] == "shm":
            raise InputError(f"--probe {run_dir}", f"has no measurement of {op}", f"a probe run that includes {op} (--ops)")
        return nccl_model_us(op, nbytes, n, link)[0]

    return fn, desc
