"""Fit the two MoE-kernel extra terms to measured points (`--fitted-to` without values).

step_ms(B) = base_ms(B) + L x penalty_us / 1e3 + (factor - 1) x routed_ms(B), with L MoE
layers and routed_ms(B) the routed experts' roofline streaming time at batch B: linear in
(penalty, factor - 1), so two measured points give both (one point: the penalty alone). Both are
costs: when the exact solution makes one negative, it is held at 0 and the other is fitted to both
points by least squares. The penalty replaces the kernel backend's fixed cost per MoE layer.
Fitted at the central values of the uncertain inputs; a point used here is never called a
prediction afterwards (the output labels it "fitted to").

Units: us per MoE layer per step, ms per step, tok/s.
"""

from __future__ import annotations

from dataclasses import replace

from tpcomm.errors import InputError
from tpcomm.predict.model import step_time


def fit_moe_terms(plan, hw: dict, lat, k, points: dict[int, float], eager: bool = False) -> tuple[float, float, str]:
    """(moe_penalty_us, moe_bw_factor, method) that reproduce `points` {batch: tok/s} at the central inputs."""
    layers = len(plan.model.moe_layers)
    if not layers:
        raise InputError(
            "--fitted-to",
            f"{plan.model.name} has no MoE layers to fit a penalty to",
            "a MoE model, or give no --fitted-to",
        )
    # The fitted penalty replaces the kernel backend's fixed cost per MoE layer (kernels.py): both describe the
    # same thing, and a fit on top of it would count it twice.
    k0 = replace(k, moe_penalty_us=0.0, moe_bw_factor=1.0, moe_layer_us=0.0)
    rows = []
    for b, tok in sorted(points.items()):
        base = step_time(plan, b, hw, lat, k0, eager=eager)["step_ms"]
        # The routed-expert roofline term: the extra a factor of 2 adds.
        routed = step_time(plan, b, hw, lat, replace(k0, moe_bw_factor=2.0), eager=eager)["step_ms"] - base
        rows.append((layers / 1e3, routed, b * 1e3 / tok - base, b))
    if len(rows) == 1:
        a, _, y, b = rows[0]
        pen, fac, method = y / a, 0.0, "exact"
    elif len(rows) == 2:
        (a1, r1, y1, _), (a2, r2, y2, _) = rows
        det = a1 * r2 - a2 * r1
        if abs(det) < 1e-12:
            raise InputError(
                "--fitted-to",
                "the two points do not separate the two terms",
                "two batch sizes far apart, e.g. 1 and 32",
            )
        pen, fac, method = (y1 * r2 - y2 * r1) / det, (a1 * y2 - a2 * y1) / det, "exact"
        # Terms are costs (>= 0): a negative one is held at 0 and the other refitted to both points (least squares).
        if pen < 0 <= fac:
            method = f"least squares over both points, the penalty held at 0 (an exact fit makes it {pen:.1f} us)"
            pen, fac = 0.0, max(0.0, (r1 * y1 + r2 * y2) / (r1 * r1 + r2 * r2))
        elif fac < 0 <= pen:
            pen, fac = max(0.0, (a1 * y1 + a2 * y2) / (a1 * a1 + a2 * a2)), 0.0
            method = "least squares over both points, the bandwidth factor held at 1 (an exact fit makes it < 1)"
    else:
        raise InputError(
            "--fitted-to", f"has {len(rows)} points", "one or two batch:tok/s points (the rest are for validation)"
        )
    if pen < 0 or fac < 0:
        raise InputError(
            "--fitted-to",
            f"fits a negative term (penalty {pen:.1f} us, factor {1 + fac:.2f}): the model is already "
            "slower than these points",
            "points slower than the model predicts, or no --fitted-to",
        )
    return pen, 1.0 + fac, method
