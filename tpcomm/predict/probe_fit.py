"""Collective latency from a `tpcomm probe` run directory (its fitted model)."""

from __future__ import annotations

from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.rundir import contract as C


def probe_latency(run_dir: str | Path, link: dict):
    """(fn(op, bytes, n) -> us, description) from RUN_DIR/probe/fit.json.

    Uses the isolated per-operation fit (what a decode step sees) of the
    backend vLLM would pick (the probe's preference order). Ops the probe did
    not measure fall back to the NCCL model on GPU links and are refused on CPU
    (no model to fall back to). A world size the probe did not run is refused."""
    from tpcomm.predict.latency import nccl_model_us
    from tpcomm.probe.fit import load_latency_model

    replayed = _replayed(run_dir)
    if replayed and not (Path(run_dir) / "probe" / "fit.json").exists():
        return _replay_only(run_dir, link, replayed)
    model = load_latency_model(run_dir)
    fits = model.doc["models"]
    sizes = sorted({m["world_size"] for m in fits})
    backends = sorted({m["backend"] for m in fits})
    cpu_probe = set(backends) <= {"gloo", "shm"}
    if cpu_probe != (link["type"] == "shm"):
        raise InputError(
            f"--probe {run_dir}",
            f"measured {', '.join(backends)}, which does not match the {link['type']} link of the hardware profile",
            "a probe run on the hardware being predicted (GPU backends for a GPU profile, gloo/shm for --gpu cpu)",
        )
    how = (
        "nccl-tests back-to-back average per call (imported with tpcomm probe import: pipelined, not an isolated call)"
        if _only_pipelined_nccl(fits)
        else "isolated p50 per call"
    )
    desc = f"probe fit from {run_dir} (backends {', '.join(backends)}; world size {', '.join(map(str, sizes))}; {how})"

    def fn(op: str, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        if n not in sizes:
            raise InputError(
                f"--probe {run_dir}",
                f"was measured with world size {', '.join(map(str, sizes))}; the layout needs {n}",
                f"a probe run with --gpus {n}, or drop --probe",
            )
        if any(m["op"] == op and m["world_size"] == n for m in fits):
            return float(model.latency_us(op, nbytes))
        if link["type"] == "shm":
            raise InputError(
                f"--probe {run_dir}", f"has no measurement of {op}", f"a probe run that includes {op} (--ops)"
            )
        return nccl_model_us(op, nbytes, n, link)[0]

    if not replayed:
        return fn, desc

    # The replay's in-step latency (collectives between layer-sized work) wins at the sizes it replayed.
    def in_context(op: str, nbytes: float, n: int) -> float:
        hit = replayed.get((op, int(nbytes), n))
        return hit["us"] if hit else fn(op, nbytes, n)

    return in_context, desc + "; " + _replay_desc(run_dir, replayed)


def _only_pipelined_nccl(fits: list[dict]) -> bool:
    ar = [m for m in fits if m["op"] == "all_reduce"]
    return bool(ar) and all(m["timing"] == "pipelined" and m["backend"] == "nccl" for m in ar)


def imported_nccl_tests_only(run_dir) -> bool:
    """True when the run's all-reduce latencies are an imported nccl-tests table only (no isolated probe rows)."""
    from tpcomm.probe.fit import load_latency_model

    if not (Path(run_dir) / "probe" / "fit.json").exists():
        return False
    return _only_pipelined_nccl(load_latency_model(run_dir).doc["models"])


def _replayed(run_dir) -> dict:
    from tpcomm.probe.replay_results import in_context_latencies
    from tpcomm.rundir.layout import RunDir

    doc = RunDir(run_dir, create=False).read_json(C.REPLAY)
    return in_context_latencies(doc) if doc else {}


def _replay_desc(run_dir, replayed: dict) -> str:
    sizes = ", ".join(
        f"{op} {b} B ({v['backend']}, {v['mode']}, world {n})" for (op, b, n), v in sorted(replayed.items())
    )
    return f"in-step p50 from the decode-step replay in {run_dir}/probe/replay.json for {sizes}"


def _replay_only(run_dir, link: dict, replayed: dict):
    """A run directory with a replay and no probe fit: the replayed sizes only."""
    backends = {v["backend"] for v in replayed.values()}
    if (backends <= {"gloo", "shm"}) != (link["type"] == "shm"):
        raise InputError(
            f"--probe {run_dir}",
            f"replayed on {', '.join(sorted(backends))}, which does not match the {link['type']} link of the hardware profile",
            "a replay run on the hardware being predicted",
        )

    def fn(op: str, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        hit = replayed.get((op, int(nbytes), n))
        if hit is None:
            have = ", ".join(f"{o} {b} B at world {w}" for o, b, w in sorted(replayed))
            raise InputError(
                f"--probe {run_dir}",
                f"has a replay ({have}) but no {op} of {int(nbytes)} B at world size {n} and no probe/fit.json",
                "a replay of the same model, TP and batch, or a `tpcomm probe` run in the same directory",
            )
        return hit["us"]

    return fn, _replay_desc(run_dir, replayed)
