"""A run directory other people can write to (issue 22, items 3, 4 and 13), with real files and a real other
user: links, FIFOs, devices, huge and mistyped files planted by uid 65534 in a shared (0777) run directory.

`report` and the run directory's writers never write through a link (refused, one line, exit 2, the link's
target unchanged); what they write is as readable as the umask allows (another user reads it all); every
reader case is "Could not read" in the report and exit 2, within 5 s of reading and in bounded memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from other_user import as_nobody, skip_reason

from tpcomm.rundir import contract as C
from tpcomm.rundir import safefs
from tpcomm.rundir.layout import RunDir

DEMO = Path(__file__).parent / "data" / "demo_run"
NOT_ROOT = skip_reason()
needs_other_user = pytest.mark.skipif(NOT_ROOT is not None, reason=NOT_ROOT or "")


@pytest.fixture
def open_tmp():
    """A folder the other user can reach (pytest's own tmp_path lies under a 0700 folder)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="tpcomm-shared-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shared(open_tmp):
    """A copy of the demo run in a folder every user may write to, and a root-only file beside it."""
    run = open_tmp / "shared" / "run"
    shutil.copytree(DEMO, run)
    for p in [run.parent, run, *[d for d in run.rglob("*") if d.is_dir()]]:
        p.chmod(0o777)
    victim = open_tmp / "victim"
    victim.write_bytes(b"root's own data")
    victim.chmod(0o600)
    return run, victim


# Runs `tpcomm report` as its only child and prints that child's peak RSS (KiB) last on stderr.
_MEASURED = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(r.returncode)"
)


def _report(run: Path, *args: str, timeout: float = 300):
    """`tpcomm report` as a subprocess: (result without the measurement line, peak RSS of it in KiB)."""
    r = subprocess.run(
        [sys.executable, "-c", _MEASURED, sys.executable, "-m", "tpcomm.cli", "report", str(run), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    *rest, last = r.stderr.rstrip("\n").split("\n")
    assert last.startswith("maxrss_kib "), r.stderr[-2000:]
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout, "\n".join(rest)), int(last.split()[1])


def _one_line_exit_2(r, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert err, r.stderr
    for n in needles:
        assert any(n in e for e in err), (n, err)
    return "\n".join(err)


# ---- writes: never through a link ---------------------------------------------------------------
@needs_other_user
def test_a_link_another_user_plants_at_report_pdf_is_refused_and_its_target_kept(shared):
    run, victim = shared
    as_nobody(os.symlink, str(victim), str(run / "report.pdf"))
    r, _ = _report(run)
    _one_line_exit_2(r, "report.pdf", "symbolic link", "does not write through links")
    assert victim.read_bytes() == b"root's own data" and (run / "report.pdf").is_symlink()


@needs_other_user
def test_a_linked_figures_folder_or_figure_is_refused_and_nothing_lands_behind_it(shared, open_tmp):
    run, victim = shared
    theirs = open_tmp / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    as_nobody(os.symlink, str(theirs), str(run / "report_figures"))
    r, _ = _report(run)
    _one_line_exit_2(r, "report_figures", "symbolic link")
    assert list(theirs.iterdir()) == []
    # A real folder they made, with a link at one figure's name: that figure is refused, its target kept.
    (run / "report_figures").unlink()
    as_nobody(os.mkdir, str(run / "report_figures"), 0o777)
    as_nobody(os.symlink, str(victim), str(run / "report_figures" / "token_split.svg"))
    r, _ = _report(run)
    _one_line_exit_2(r, "token_split.svg", "symbolic link")
    assert victim.read_bytes() == b"root's own data"


@needs_other_user
def test_the_run_directory_writers_refuse_links_at_a_file_or_a_folder(shared):
    run, victim = shared
    rd = RunDir(run)
    as_nobody(os.unlink, str(run / "load" / "levels.json"))
    as_nobody(os.symlink, str(victim), str(run / "load" / "levels.json"))
    with pytest.raises(safefs.UnsafePath, match="symbolic link"):
        rd.write_json(C.LOAD_LEVELS, [{"concurrency": 1, "repeat": 0}])
    shutil.rmtree(run / "hook")
    as_nobody(os.symlink, str(victim.parent), str(run / "hook"))
    with pytest.raises(safefs.UnsafePath, match="not a folder"):
        rd.write_json(C.HOOK_META, {"ranks": [0, 1]})
    assert victim.read_bytes() == b"root's own data" and not (victim.parent / "meta.json").exists()
    # The temporary name cannot be aimed at either: it is random and created O_EXCL|O_NOFOLLOW.
    assert not [p for p in run.rglob(".*.tmp")]


@needs_other_user
def test_what_tpcomm_writes_is_readable_by_another_user_as_the_umask_allows(open_tmp):
    from tpcomm.report.analysis import analyze
    from tpcomm.report.markdown import render_markdown

    tmp_path = open_tmp
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    old = os.umask(0o022)
    try:
        rd = RunDir(run / "fresh")
        rd.write_json(C.STATUS, {"attribute": {"state": "complete", "utc": "now"}})
        rd.write_table(C.LOAD_TOKENS, __import__("pandas").read_parquet(run / "load/tokens.parquet"))
        r, _ = _report(run)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr[-2000:]
    for p in [run / "fresh", run / "fresh/status.json", run / "fresh/load", run / "fresh/load/tokens.parquet"]:
        want = 0o755 if p.is_dir() else 0o644
        assert p.stat().st_mode & 0o777 == want, (p, oct(p.stat().st_mode))
    for name in ("report.pdf", "report.md", "report_figures/token_split.svg"):
        assert (run / name).stat().st_mode & 0o777 == 0o644, name
    out = tmp_path / "theirs"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    # Warm every import and codec here: the other user cannot read this interpreter's own folders (/root).
    rep = analyze(run)
    render_markdown(rep, tmp_path / "warm" / "r.md")

    def read_all() -> tuple[int, list[str]]:
        n = 0
        for p in sorted((run / "fresh").rglob("*")) + [run / "report.pdf", run / "report.md"]:
            if p.is_file():
                n += len(p.read_bytes())
        again = analyze(run)
        render_markdown(again, out / "r.md")
        return n, sorted(again.errors)

    n, errors = as_nobody(read_all)
    assert n > 0 and errors == sorted(rep.errors) == []
    assert (out / "r.md").stat().st_uid == 65534


# ---- reads: bounded, never blocking, typed ----------------------------------------------------------
def _fifo(p: Path) -> None:
    os.unlink(p)
    os.mkfifo(p, 0o666)


def _dev_zero(p: Path) -> None:
    os.unlink(p)
    os.symlink("/dev/zero", p)


def _sparse_2gb(p: Path) -> None:
    os.unlink(p)
    with open(p, "wb") as f:
        f.truncate(2_000_000_000)


def _typed(doc_fn):
    def plant(p: Path) -> None:
        doc = json.loads(p.read_text())
        os.unlink(p)
        p.write_text(json.dumps(doc_fn(doc)))

    return plant


CASES = {
    "status.json FIFO": ("status.json", _fifo, "is a FIFO, not a regular file"),
    "summary.json -> /dev/zero": ("attribution/summary.json", _dev_zero, "is a device, not a regular file"),
    "summary.json 2 GB sparse": ("attribution/summary.json", _sparse_2gb, "is 2000000000 bytes, more than"),
    "plan.json FIFO": ("plan.json", _fifo, "is a FIFO"),
    "steps.parquet -> /dev/zero": ("attribution/steps.parquet", _dev_zero, "is a device"),
    "status.json stage is text": (
        "status.json",
        _typed(lambda d: {**d, "attribute": "complete"}),
        "status.json [attribute]: holds text where an object was expected",
    ),
    "status.json state is a number": (
        "status.json",
        _typed(lambda d: {**d, "attribute": {"state": 5}}),
        "[attribute.state]: holds a number where text was expected",
    ),
    "summary.json level concurrency is text": (
        "attribution/summary.json",
        _typed(lambda d: {**d, "levels": [{**d["levels"][0], "concurrency": "one"}] + d["levels"][1:]}),
        "[levels[0].concurrency]: holds text where an integer was expected",
    ),
    "levels.json flags is a number": (
        "load/levels.json",
        _typed(lambda d: [{**d[0], "flags": 3}] + d[1:]),
        "[[0].flags]: holds a number where a list was expected",
    ),
    "plan.json collectives is text": (
        "plan.json",
        _typed(lambda d: {**d, "collectives": "all of them"}),
        "[collectives]: holds text where a list was expected",
    ),
    "meta.json commands hold numbers": (
        "meta.json",
        _typed(lambda d: {**d, "commands": [1, 2]}),
        "[commands[0]]: holds a number where an object was expected",
    ),
}


@needs_other_user
@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_file_another_user_plants_is_could_not_read_and_exit_2(shared, case):
    from tpcomm.report.analysis import analyze

    run, _ = shared
    rel, plant, needle = CASES[case]
    as_nobody(plant, run / rel)
    t0 = time.monotonic()
    rep = analyze(run)  # the readers, in this process: bounded in time
    read_s = time.monotonic() - t0
    assert read_s < 5, f"{case}: reading took {read_s:.1f} s"
    assert any(needle in e for e in rep.errors.values()), (case, rep.errors)
    r, rss_kib = _report(run, timeout=120)
    err = _one_line_exit_2(r, needle)
    assert rel in err
    md = (run / "report.md").read_text()
    assert f"**Could not read:** {rel}" in md, md[:3000]
    # Peak memory of the whole `tpcomm report` process (a 2 GB file once took 4.3 GB, /dev/zero all of it).
    assert rss_kib < 1_000_000, f"{case}: {rss_kib / 1024:.0f} MiB"


def test_an_oversized_table_is_refused_before_it_is_read(tmp_path):
    rd = RunDir(tmp_path / "r")
    (tmp_path / "r" / "load").mkdir()
    with open(tmp_path / "r" / C.LOAD_REQUESTS.path, "wb") as f:
        f.truncate(safefs.MAX_TABLE_BYTES + 1)
    t0 = time.monotonic()
    with pytest.raises(C.SchemaError, match="more than the 1073741824 this reader takes"):
        rd.read_table(C.LOAD_REQUESTS)
    assert time.monotonic() - t0 < 1


@needs_other_user
def test_a_file_another_user_cannot_read_is_one_line_not_a_traceback(open_tmp):
    """A run directory written before files followed the umask (data files 0600): another user's report says
    which file it could not read, and renders the rest."""
    from tpcomm.report.analysis import analyze

    run = open_tmp / "run"
    shutil.copytree(DEMO, run)
    (run / "attribution" / "summary.json").chmod(0o600)
    analyze(run)  # warm the imports (the other user cannot read this interpreter's folders)
    errors = as_nobody(lambda: analyze(run).errors)
    assert list(errors) == ["attribution/summary.json"], errors
    assert "cannot be read (Permission denied)" in errors["attribution/summary.json"]
