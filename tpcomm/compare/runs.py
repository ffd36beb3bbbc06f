"""The two run directories a comparison reads, each loaded once through the contract (RunDir + the typed
Attribution), and the checks that refuse a comparison in one line (InputError, exit 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpcomm.compare.conditions import model_identity
from tpcomm.errors import InputError
from tpcomm.rundir import contract as C
from tpcomm.rundir.documents import Meta, Plan, Prediction, Topo
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution


@dataclass
class Run:
    label: str  # "RUN_A" | "RUN_B"
    path: Path
    rd: RunDir
    attribution: Attribution | None
    predict: Prediction | None
    plan: Plan | None
    topo: Topo | None
    meta: Meta | None
    hook_status: dict | None
    _samples: Any = field(default=None, repr=False)

    def samples(self):
        """({(C, repeat): LevelSample}, why none) from the run's per-step files (read once)."""
        if self._samples is None:
            from tpcomm.compare.samples import load_samples

            self._samples = load_samples(self.rd, self.attribution) if self.attribution else ({}, "no attribution")
        return self._samples


def load_run(path: str | Path, label: str) -> Run:
    rd = RunDir(path, create=False)
    att = rd.read(C.ATTR_SUMMARY)  # another schema version: refused here, one line
    predict = rd.read(C.PREDICT)
    if att is None and predict is None:
        raise InputError(
            f"{label} {path}",
            "has no attribution (attribution/summary.json) and no prediction (predict.json)",
            "a run directory written by `tpcomm attribute --out DIR` (or `tpcomm predict --out DIR`)",
        )
    status = rd.read_json(C.HOOK_STATUS) or rd.read_json(C.HOOK_META)
    return Run(
        label=label,
        path=Path(path),
        rd=rd,
        attribution=att,
        predict=predict,
        plan=rd.read(C.PLAN),
        topo=rd.read(C.TOPO),
        meta=rd.read(C.META),
        hook_status=status,
    )


def check_pair(a: Run, b: Run, allow_different_models: bool) -> str:
    """The kind of comparison the two runs allow ("measured", "model-based", "measured and model-based"), or
    an InputError: one run measured and the other not, no prediction on one side, or different models."""
    measured = a.attribution is not None and b.attribution is not None
    modelled = a.predict is not None and b.predict is not None
    if not measured and not modelled:
        lacking, has = (a, b) if a.attribution is None else (b, a)
        raise InputError(
            f"{lacking.label} {lacking.path}",
            f"has no attribution (attribution/summary.json) while {has.label} has one, and the two runs share no "
            "prediction (predict.json) to compare instead",
            "two run directories written by `tpcomm attribute`, or two with predict.json",
        )
    ia, ib = model_identity(a), model_identity(b)
    if ia and ib and not allow_different_models:
        differ = [
            f"{k} {ia[k]} vs {ib[k]}" for k in ia if ia.get(k) is not None and ib.get(k) is not None and ia[k] != ib[k]
        ]
        if differ:
            raise InputError(
                f"{a.label} {a.path} and {b.label} {b.path}",
                "are runs of different models (" + ", ".join(differ) + ")",
                "two runs of one model (another checkpoint or quantization of it is fine); "
                "give --allow-different-models to compare them anyway",
            )
    if measured and modelled:
        return "measured and model-based"
    return "measured" if measured else "model-based"
