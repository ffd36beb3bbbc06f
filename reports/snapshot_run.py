"""Copy a real run directory for committing (tests/data/demo_run, reports/runs/cpu-demo).

    .venv/bin/python reports/snapshot_run.py SRC DST [N_STEPS]

Leaves out the model weights, the server log and rendered reports; keeps the
hook records (hook/*.parquet) of N_STEPS (default 150) consecutive engine steps
from the single-stream level and of the step in attribution/timeline.json, rows
unchanged. attribution/collectives.parquet (every record aligned) is left out
for size: the report draws attribution/timeline.json. Everything else is copied as the
commands wrote it (attribution/summary.json was computed from all records).
"""

import json
import shutil
import sys
from pathlib import Path

import pandas as pd

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
n_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 150
if dst.exists():
    shutil.rmtree(dst)
dst.mkdir(parents=True)
skip = {"model", "server.log", "report.pdf", "report.md", "report_figures", "hook", "attribution"}
for p in src.iterdir():
    if p.name in skip:
        continue
    (shutil.copytree if p.is_dir() else shutil.copy2)(p, dst / p.name)
(dst / "attribution").mkdir()
for f in ("summary.json", "steps.parquet", "timeline.json"):
    if (src / "attribution" / f).exists():
        shutil.copy2(src / "attribution" / f, dst / "attribution" / f)
(dst / "hook").mkdir()
steps = pd.read_parquet(src / "hook/steps.parquet")
coll = pd.read_parquet(src / "hook/collectives.parquet")
dec = steps[(steps["kind"] == "decode") & (steps["num_seqs"] == 1)]["step"].sort_values().unique()
lo = dec[len(dec) // 3]
keep = set(range(int(lo), int(lo) + n_steps))
tl = src / "attribution/timeline.json"
if tl.exists():  # the step the report draws keeps its records too (tests compare the two)
    keep.add(int(json.loads(tl.read_text())["step"]))
steps[steps["step"].isin(keep)].to_parquet(dst / "hook/steps.parquet", index=False)
coll[coll["step"].isin(keep)].to_parquet(dst / "hook/collectives.parquet", index=False)
if (src / "hook/step_requests.parquet").exists():  # which of attribute's requests each kept step served
    sreq = pd.read_parquet(src / "hook/step_requests.parquet")
    sreq[sreq["step"].isin(keep)].to_parquet(dst / "hook/step_requests.parquet", index=False)
if (src / "hook/meta.json").exists():
    shutil.copy2(src / "hook/meta.json", dst / "hook/meta.json")
print("kept steps", min(keep), max(keep), "of", int(steps["step"].min()), int(steps["step"].max()))
