"""The README's example outputs are real: re-run each `$ tpcomm plan|predict ...` block and compare."""

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```\n\$ tpcomm ((?:plan|predict) [^\n]*)\n(.*?)```", README.read_text(), re.S)


def test_readme_has_plan_and_predict_examples():
    assert {b[0].split()[0] for b in BLOCKS} == {"plan", "predict"}


@pytest.mark.parametrize("command,expected", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_readme_output_matches_the_command(command, expected):
    r = CliRunner().invoke(cli, shlex.split(command))
    assert r.exit_code == 0, r.output
    assert r.output.rstrip("\n") == expected.rstrip("\n")
