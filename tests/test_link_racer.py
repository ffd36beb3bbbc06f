"""Issue 32, item 1: a link planted at each output name of `attribute`, `report`, `compare` and `probe` while
the command runs, from another process (what another user with write access to a shared output folder can
do once the first file of the run appears). Nothing is written through (the file the links name is left as it
was), the command ends in one line with exit 2, and no temporary file is left behind.

The racer is a real process that waits for the command's first output to appear (or change), then keeps
replacing every output name with a link to the victim every few milliseconds until it is stopped.
`attribute` runs as `--reanalyse` on the recorded real run (tests/data/attribute_tiny_tp2): the same writers
as a live run, without a server. `trace` is the trace branch's (it writes through the same RunDir).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compare_synthetic import run_dir

DATA = Path(__file__).parent / "data"

RACER = r"""
import os, sys, time
root, trigger, victim, *names = sys.argv[1:]
t = os.path.join(root, trigger)
before = os.stat(t).st_mtime_ns if os.path.lexists(t) else None
deadline = time.monotonic() + 600
while time.monotonic() < deadline:  # wait for the command's first output
    if os.path.lexists(t) and (before is None or os.stat(t, follow_symlinks=False).st_mtime_ns != before):
        break
    time.sleep(0.002)
print("racing", flush=True)
while True:
    for n in names:
        p = os.path.join(root, n)
        if os.path.islink(p):
            continue
        try:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            tmp = p + ".racer"
            os.symlink(victim, tmp)
            os.replace(tmp, p)  # the name now links to the victim
        except OSError:
            pass
    time.sleep(0.003)
"""


def race(root: Path, trigger: str, names: list[str], victim: Path, cmd: list[str], timeout: float = 600):
    """Run `cmd` while a racer links `names` (under root) to `victim` from the moment `trigger` appears or
    changes; the CompletedProcess."""
    racer = subprocess.Popen(
        [sys.executable, "-c", RACER, str(root), trigger, str(victim), *names], stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.2)  # the racer has read the trigger's first state
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        racer.kill()
        racer.wait()
    assert racer.stdout.read().strip() == "racing", "the command ended before its first output appeared"
    return r


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_bytes(b"root's own data\n")
    return v


def refused(r, victim: Path, root: Path) -> None:
    assert victim.read_bytes() == b"root's own data\n", "written through a planted link"
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert err and all("link" in e for e in err), r.stderr[-3000:]
    assert not [p for p in root.rglob("*.tmp") if not p.is_symlink()], "a temporary file was left behind"


def tpcomm(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpcomm.cli", *args]


def test_attribute_outputs(tmp_path, victim):
    run = tmp_path / "run"
    shutil.copytree(DATA / "attribute_tiny_tp2", run)
    names = ["attribution/summary.json", "attribution/timeline.json", "attribution/steps.parquet", "status.json"]
    r = race(run, "meta.json", names, victim, tpcomm("attribute", "--reanalyse", str(run)))
    refused(r, victim, run)


def test_report_outputs(tmp_path, victim):
    run = tmp_path / "run"
    shutil.copytree(DATA / "demo_run", run)
    out = tmp_path / "out"
    out.mkdir()
    figs = [f"report_figures/{k}.svg" for k in ("breakdown", "ladder", "probe", "timeline", "what_if", "verdict")]
    # the first file `report` writes is the PDF; then the Markdown twin and its figures
    r = race(
        out,
        "report.pdf",
        ["report.md", *figs, "report.pdf"],
        victim,
        tpcomm("report", str(run), "--out", str(out / "report.pdf")),
    )
    refused(r, victim, out)


@pytest.mark.parametrize(
    "names",
    [
        ["compare.md"],  # the case: compare.md linked once compare.json appears (written plainly before)
        ["compare.pdf", "compare.md", "compare_figures/compare_terms.svg", "compare.json"],
    ],
    ids=["markdown", "every-name"],
)
def test_compare_outputs(tmp_path, victim, names):
    a = run_dir(tmp_path / "a", seed=1, requests=6, output_len=16)
    b = run_dir(tmp_path / "b", seed=2, requests=6, output_len=16)
    out = tmp_path / "cmp"
    r = race(out, "compare.json", names, victim, tpcomm("compare", str(a), str(b), "--out", str(out)))
    refused(r, victim, out)


@pytest.mark.dist
def test_probe_outputs(tmp_path, victim):
    run = tmp_path / "run"
    names = [
        "probe/spec.json",
        "probe/logs/rank0.log",
        "probe/logs/rank1.log",
        "probe/ranks/rank0.json",
        "probe/ranks/rank0.count",
        "probe/results.jsonl",
        "probe/results.json",
        "probe/results.parquet",
    ]
    cmd = tpcomm(
        "probe", "--gpus", "2", "--oversubscribe", "--sizes", "1K", "--iters", "3", "--warmup", "1", "--out", str(run)
    )
    r = race(run, "topo.json", names, victim, cmd)
    refused(r, victim, run)
