"""The documented example outputs are real: re-run each `$ tpcomm plan|predict ...` block of the README and
docs/*.md and compare."""

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    b for doc in DOCS for b in re.findall(r"```\n\$ tpcomm ((?:plan|predict) [^\n]*)\n(.*?)```", doc.read_text(), re.S)
]


def test_readme_has_plan_and_predict_examples():
    assert {b[0].split()[0] for b in BLOCKS} == {"plan", "predict"}


@pytest.mark.parametrize("command,expected", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_readme_output_matches_the_command(command, expected):
    r = CliRunner().invoke(cli, shlex.split(command))
    assert r.exit_code == 0, r.output
    assert r.output.rstrip("\n") == expected.rstrip("\n")
