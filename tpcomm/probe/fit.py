"""Latency model fitted to probe results: per (backend, op, mode),
time_us = alpha_us + bytes / (beta_GBps * 1e3), piecewise over byte ranges where
the protocol changes (NCCL LL -> LL128 -> Simple, one-shot -> two-shot, or the
shm all-reduce's own buffer switch). Segments are fitted on the isolated p50,
least squares on relative error, breakpoints at measured sizes.

Units: alpha in us, beta in GB/s (1e9 B/s), bytes per rank input.

The predictor's API:
    m = load_latency_model(run_dir)          # reads RUN_DIR/probe/fit.json
    m.latency_us("all_reduce", 14336)        # the backend vLLM would use (see PREFERENCE)
    m.latency_us("all_reduce", 14336, backend="pynccl", mode="graph")
    m.has("all_gather"), m.backends("all_reduce"), m.conditions
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from tpcomm.errors import InputError
from tpcomm.rundir import contract as C

# The order vLLM 0.32 tries all-reduce backends (CudaCommunicator.all_reduce; on CPU
# CpuCommunicator uses shm when it can): a measured earlier entry wins.
PREFERENCE = ("custom-ar", "pynccl", "nccl", "shm", "gloo")
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024  # CustomAllreduce(max_size=8192 * 1024) default
_NEW_SEGMENT_GAIN = 0.5  # a segment must halve the squared relative error to be kept


def _fit_line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha_us, slope_us_per_byte) minimising relative squared error, both >= 0."""
    if len(pts) == 1:
        return pts[0][1], 0.0
    # weights 1/y^2: relative error
    sw = sx = sy = sxx = sxy = 0.0
    for x, y in pts:
        w = 1.0 / max(y, 1e-9) ** 2
        sw += w
        sx += w * x
        sy += w * y
        sxx += w * x * x
        sxy += w * x * y
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det if det > 0 else 0.0
    if slope <= 0:
        return sy / sw, 0.0
    alpha = (sy - slope * sx) / sw
    if alpha < 0:  # pure bandwidth term through the origin
        alpha = 0.0
        slope = sum(y / max(y, 1e-9) ** 2 * x for x, y in pts) / sum(x * x / max(y, 1e-9) ** 2 for x, y in pts)
    return alpha, slope


def _err(pts, alpha, slope) -> float:
    return sum(((alpha + slope * x) / y - 1) ** 2 for x, y in pts if y > 0)


def fit_segments(points: list[tuple[int, float]], max_segments: int = 3) -> list[dict]:
    """Piecewise alpha-beta fit. Each segment needs >= 3 points (2 for a lone one)."""
    pts = sorted((float(x), float(y)) for x, y in points)
    best = [(pts, *_fit_line(pts))]
    best_err = _err(pts, best[0][1], best[0][2])
    for k in range(2, max_segments + 1):
        cand = _best_split(pts, k)
        if cand is None:
            break
        segs, err = cand
        if err > best_err * _NEW_SEGMENT_GAIN:
            break
        best, best_err = segs, err
    out = []
    for i, (seg, alpha, slope) in enumerate(best):
        out.append(
            {
                "min_bytes": int(seg[0][0]) if i else 0,
                "max_bytes": int(seg[-1][0]) if i < len(best) - 1 else None,
                "alpha_us": alpha,
                "beta_GBps": (1.0 / slope / 1e3) if slope > 0 else None,
                "points": len(seg),
                "max_rel_err": max(abs((alpha + slope * x) / y - 1) for x, y in seg),
            }
        )
    return out


def _best_split(pts, k, min_pts=3):
    n = len(pts)
    if n < k * min_pts:
        return None
    best = None

    def rec(start, left, acc):
        nonlocal best
        if left == 1:
            seg = pts[start:]
            a, s = _fit_line(seg)
            segs = acc + [(seg, a, s)]
            err = sum(_err(sg, aa, ss) for sg, aa, ss in segs)
            if best is None or err < best[1]:
                best = (segs, err)
            return
        for end in range(start + min_pts, n - (left - 1) * min_pts + 1):
            seg = pts[start:end]
            a, s = _fit_line(seg)
            rec(end, left - 1, acc + [(seg, a, s)])

    rec(0, k, [])
    return best


def fit_results(rows: list[dict], timing: str = "isolated") -> list[dict]:
    """One model per (backend, op, mode, world_size) from result rows (p50 at each size)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        if r.get("timing") != timing or r.get("p50_us") is None or (r.get("wrong") or 0) > 0:
            continue
        groups.setdefault((r["backend"], r["op"], r["mode"], r["world_size"]), []).append((r["bytes"], r["p50_us"]))
    models = []
    for (backend, op, mode, world), pts in sorted(groups.items()):
        models.append(
            {
                "backend": backend,
                "op": op,
                "mode": mode,
                "world_size": world,
                "timing": timing,
                "sizes": sorted({p[0] for p in pts}),
                "segments": fit_segments(pts),
            }
        )
    return models


def fit_document(rows: list[dict], conditions: dict) -> dict:
    return {
        "version": 1,
        "formula": "time_us = alpha_us + bytes / (beta_GBps * 1e3); bytes = per-rank input",
        "preference": list(PREFERENCE),
        "custom_ar_max_bytes": CUSTOM_AR_MAX_BYTES,
        "conditions": conditions,
        "models": fit_results(rows, "isolated") + fit_results(rows, "pipelined"),
    }


@dataclass
class LatencyModel:
    """Fitted latencies of one run directory (see the module docstring)."""

    doc: dict

    @property
    def conditions(self) -> dict:
        return self.doc.get("conditions", {})

    def backends(self, op: str, timing: str = "isolated") -> list[str]:
        found = {m["backend"] for m in self.doc["models"] if m["op"] == op and m["timing"] == timing}
        return [b for b in PREFERENCE if b in found] + sorted(found - set(PREFERENCE))

    def has(self, op: str, backend: str | None = None) -> bool:
        return any(m["op"] == op and (backend is None or m["backend"] == backend) for m in self.doc["models"])

    def model(
        self,
        op: str,
        nbytes: float | None = None,
        backend: str | None = None,
        mode: str | None = None,
        timing: str | None = None,
    ) -> dict:
        """timing None: isolated (what a decode step sees) where measured, else pipelined (nccl-tests imports)."""
        cands = []
        for t in [timing] if timing else ["isolated", "pipelined"]:
            cands = [
                m
                for m in self.doc["models"]
                if m["op"] == op
                and m["timing"] == t
                and (backend is None or m["backend"] == backend)
                and (mode is None or m["mode"] == mode)
            ]
            if cands:
                break
        if (
            backend is None
            and nbytes is not None
            and nbytes >= self.doc.get("custom_ar_max_bytes", CUSTOM_AR_MAX_BYTES)
        ):
            cands = [m for m in cands if m["backend"] != "custom-ar"] or cands
        if not cands:
            have = sorted({(m["op"], m["backend"], m["mode"]) for m in self.doc["models"]})
            raise LookupError(
                f"no fitted latency for {op} (backend {backend or 'any'}, mode {mode or 'any'}, {timing or 'any timing'}); "
                f"fit.json has {have}"
            )
        rank = {b: i for i, b in enumerate(self.doc.get("preference", PREFERENCE))}
        # vLLM decodes in CUDA graphs on GPU: prefer graph-mode numbers when there are any.
        return min(cands, key=lambda m: (rank.get(m["backend"], 99), m["mode"] != "graph"))

    def latency_us(
        self, op: str, nbytes: float, backend: str | None = None, mode: str | None = None, timing: str | None = None
    ) -> float:
        """Predicted time of one `op` call moving `nbytes` per rank, in microseconds."""
        m = self.model(op, nbytes, backend, mode, timing)
        segs = m["segments"]
        seg = next((s for s in segs if s["max_bytes"] is None or nbytes <= s["max_bytes"]), segs[-1])
        beta = seg["beta_GBps"]
        return seg["alpha_us"] + (nbytes / (beta * 1e3) if beta and not math.isinf(beta) else 0.0)


def load_latency_model(run_dir: str | os.PathLike) -> LatencyModel:
    """The latency model saved by `tpcomm probe` (or `tpcomm probe import`) in RUN_DIR/probe/fit.json."""
    from tpcomm.rundir.layout import RunDir

    doc = RunDir(run_dir, create=False).read_json(C.PROBE_FIT)
    if not doc or not doc.get("models"):
        raise InputError(
            f"probe results in {run_dir}",
            "no probe/fit.json with fitted models",
            "a run directory written by `tpcomm probe --out` or `tpcomm probe import`",
        )
    return LatencyModel(doc)
