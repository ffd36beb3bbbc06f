"""The `tpcomm` entry point: help, version, exit codes, run as a real subprocess."""

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "tpcomm"


def run(*args, **kw):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=120, **kw)


def test_help_lists_commands_without_importing_torch():
    code = (
        "import sys; from tpcomm.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit: pass\n"
        "bad = [m for m in ('torch', 'vllm', 'pandas', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for cmd in ("plan", "predict", "probe", "topo", "attribute", "report", "demo"):
        assert cmd in r.stdout


def test_version_prints_the_stack():
    r = run("--version")
    assert r.returncode == 0, r.stderr
    for key in ("tpcomm", "python", "torch", "vllm", "nccl"):
        assert any(line.startswith(key) for line in r.stdout.splitlines()), key


def test_plan_as_subprocess_and_bad_input_exit_code():
    ok = run("plan", "--model", "kimi-k2.5", "--tp", "8")
    assert ok.returncode == 0 and "all_reduce x123" in ok.stdout
    bad = run("plan", "--model", "kimi-k2.5", "--tp", "5")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--tp 5" in bad.stderr


def test_env_var_prefix():
    r = run("plan", "--model", "deepseek-v3", env={**os.environ, "TPCOMM_PLAN_TP": "8"})
    assert r.returncode == 0 and "TP=8" in r.stdout
