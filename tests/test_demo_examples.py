"""The example scripts stay runnable: valid bash, and every `tpcomm X --flag` they
use is an option `tpcomm X` has (checked against the real CLI, no GPU needed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "examples").glob("*.sh")) + [ROOT / "reports" / "regenerate.sh"]


def _uses(script: Path) -> list[tuple[str, list[str]]]:
    """(subcommand, [--flags]) for each tpcomm call in the script, continuation lines joined."""
    text = script.read_text().replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        line = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        for m in re.finditer(r'(?:(?<![=\w])(?:\S*/)?tpcomm(?:\.cli)?|"\$T")\s+([a-z]+)((?:\s+[^|;&]*)?)', line):
            calls.append((m.group(1), re.findall(r"(--[a-z][a-z0-9-]*)", m.group(2))))
    return calls


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_script_is_valid_bash(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_flags_exist(script):
    from click.testing import CliRunner

    from tpcomm.cli import cli

    calls = _uses(script)
    assert calls, f"{script.name} calls no tpcomm command"
    helps: dict[str, str] = {}
    for cmd, flags in calls:
        if cmd not in helps:
            res = CliRunner().invoke(cli, [cmd, "--help"], terminal_width=200)
            assert res.exit_code == 0, (cmd, res.output)
            helps[cmd] = res.output
        for flag in flags:
            assert re.search(rf"{re.escape(flag)}\b", helps[cmd]), f"{script.name}: `tpcomm {cmd}` has no option {flag}"
