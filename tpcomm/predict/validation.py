"""tpcomm predict against public measurements (data/validation.json): per row the central value, the range over
the stated inputs, whether the measurement lies inside, the error; in total the share inside, the median |error|
and the median half-width of the range. Rows that set a number in tpcomm (`fitted`) and TP-1 rows are counted
apart from the held-out TP >= 2 rows. benchmarks/predict_validation.py prints it; tests run a subset.

Units: tok/s (all streams of a row's batch), percent.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib import resources

from tpcomm.models import load_config
from tpcomm.plan.layout import Layout
from tpcomm.predict import predict
from tpcomm.predict.model import Knobs


def load_rows() -> tuple[list[dict], dict]:
    doc = json.loads(resources.files("tpcomm.predict").joinpath("data", "validation.json").read_text())
    return doc["rows"], doc.get("quantization_configs", {})


def model_of(row: dict, qconfigs: dict):
    """The model a row names: a preset or inline config, with the checkpoint's quantization_config if given."""
    if "config" in row:
        cfg, name = dict(row["config"]), row["id"]
    else:
        cfg, name, _ = load_config(row["model"])
        cfg = dict(cfg)
    qc = row.get("quantization_config")
    if qc is not None:
        cfg["quantization_config"] = qconfigs[qc] if isinstance(qc, str) else qc
    cfg["_name_or_path"] = name
    return cfg


@dataclass
class Result:
    row: dict
    central: float | None
    low: float | None
    high: float | None
    error: str | None = None
    coverage: dict | None = None  # predict.json's `coverage`: the rows that informed it, and any widening

    @property
    def measured(self) -> float:
        return self.row["measured_tok_per_s"]

    @property
    def inside(self) -> bool:
        return self.central is not None and self.low <= self.measured <= self.high

    @property
    def error_pct(self) -> float | None:
        return None if self.central is None else 100 * (self.central / self.measured - 1)

    @property
    def half_width_pct(self) -> float | None:
        return None if self.central is None else 100 * (self.high - self.low) / 2 / self.central

    @property
    def held_out(self) -> bool:
        return not self.row.get("fitted") and self.row["tp"] >= 2

    def as_dict(self) -> dict:
        return {
            "id": self.row["id"],
            "tp": self.row["tp"],
            "held_out": self.held_out,
            "measured_tok_per_s": self.measured,
            "central_tok_per_s": self.central,
            "low_tok_per_s": self.low,
            "high_tok_per_s": self.high,
            "inside": self.inside,
            "error_pct": self.error_pct,
            "half_width_pct": self.half_width_pct,
            "error": self.error,
            "engine_covered": None if self.coverage is None else self.coverage["covered"],
            "widened": None if self.coverage is None else _widened(self.coverage),
        }


def _widened(cov: dict) -> dict | None:
    """The input widened for an uncovered engine, from -> to (None: nothing widened)."""
    w = cov.get("widened")
    return {"input": w["input"], "from": w["from"], "to": w["to"]} if w and w["changed"] else None


def predict_for_row(row: dict, qconfigs: dict, **knobs) -> dict:
    """predict.json for a row's model, TP, GPU, engine, batch and context; `knobs`: other Knobs fields, given."""
    return predict(
        model_of(row, qconfigs),
        Layout(tp=row["tp"]),
        gpu=row["gpu"],
        engine=row.get("engine"),
        batches=[row["batch"]],
        knobs=Knobs(context=row["context"], **knobs),
        what_if=False,
    )


def run_row(row: dict, qconfigs: dict) -> Result:
    try:
        doc = predict_for_row(row, qconfigs)
    except Exception as e:  # a row the model cannot run is reported, not skipped
        return Result(row, None, None, None, f"{type(e).__name__}: {e}")
    b = next(x for x in doc["batches"] if x["batch"] == row["batch"])
    r = b["tok_per_s_range"]
    if r is None:  # predict gives no tok/s where the weights do not fit its 90% rule; the row ran, so compare anyway
        s, n = b["step_ms_range"], row["batch"] * 1e3
        return Result(row, n / s["central"], n / s["high"], n / s["low"], coverage=doc["coverage"])
    return Result(row, r["central"], r["low"], r["high"], coverage=doc["coverage"])


def run(ids: list[str] | None = None) -> list[Result]:
    rows, qconfigs = load_rows()
    if ids:
        unknown = set(ids) - {r["id"] for r in rows}
        if unknown:
            raise KeyError(f"no validation rows {sorted(unknown)}")
        rows = [r for r in rows if r["id"] in ids]
    return [run_row(r, qconfigs) for r in rows]


def summary(results: list[Result]) -> dict:
    """Share inside, median |error| and median half-width (percent) of the rows given. Rows marked `approximate`
    (a figure whose load or lengths the source does not state, and which a range was widened to hold) are listed
    but not counted: their being inside proves nothing."""
    results = [r for r in results if not r.row.get("approximate")]
    ok = [r for r in results if r.central is not None]
    if not ok:
        return {
            "rows": len(results),
            "predicted": 0,
            "inside": 0,
            "share_inside": None,
            "median_abs_error_pct": None,
            "median_half_width_pct": None,
        }
    return {
        "rows": len(results),
        "predicted": len(ok),
        "inside": sum(r.inside for r in ok),
        "share_inside": sum(r.inside for r in ok) / len(results),
        "median_abs_error_pct": statistics.median(abs(r.error_pct) for r in ok),
        "median_half_width_pct": statistics.median(r.half_width_pct for r in ok),
    }
