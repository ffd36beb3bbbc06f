"""`report --out` writes only regular files; bad targets and empty run directories are one line, exit 2 (issue 12)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).parents[1] / "reports/runs/kimi-k2.5-int4-tp8-rtx-pro-6000"


def _report(*args: str):
    return subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "report", *args], capture_output=True, text=True, timeout=300
    )


def _one_line_exit_2(r, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert len(err) == 1, r.stderr
    for n in needles:
        assert n in err[0], err[0]


@pytest.mark.parametrize("dev", ["/dev/full", "/dev/null"])
def test_a_device_node_is_refused_and_left_alone(dev):
    before = os.stat(dev)
    _one_line_exit_2(_report(str(RUN), "--out", dev), dev, "is a device")
    after = os.stat(dev)
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)


def test_a_directory_is_refused(tmp_path):
    _one_line_exit_2(_report(str(RUN), "--out", str(tmp_path)), "directory")
    assert list(tmp_path.iterdir()) == []


def test_a_link_to_a_device_is_refused(tmp_path):
    link = tmp_path / "r.pdf"
    link.symlink_to("/dev/full")
    _one_line_exit_2(_report(str(RUN), "--out", str(link)), "is a symbolic link", "does not write through links")
    assert link.is_symlink() and os.readlink(link) == "/dev/full"


def test_a_read_only_file_is_refused_and_kept(tmp_path):
    ro = tmp_path / "r.pdf"
    ro.write_bytes(b"keep me")
    ro.chmod(0o444)
    _one_line_exit_2(_report(str(RUN), "--out", str(ro)), "read-only")
    assert ro.read_bytes() == b"keep me"


def test_a_folder_that_takes_no_files_is_one_line():
    # /proc takes no new files, even from root (access() says writable to root: the write itself fails).
    r = _report(str(RUN), "--out", "/proc/tpcomm-report.pdf")
    _one_line_exit_2(r, "/proc/tpcomm-report.pdf")
    assert "not writable" in r.stderr or "cannot be written" in r.stderr


def test_an_empty_run_directory_is_an_error(tmp_path):
    _one_line_exit_2(_report(str(tmp_path)), "nothing to report")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_regular_file_is_replaced_atomically(tmp_path):
    out = tmp_path / "r.pdf"
    out.write_bytes(b"old")
    r = _report(str(RUN), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:5] == b"%PDF-" and (tmp_path / "r.md").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind
