#!/usr/bin/env bash
# CPU dry run of scripts/gpu-check.sh in a bare environment like the GPU machine's: a fresh venv with torch
# (CPU) and only pandas, pyarrow, click, httpx, rich, matplotlib, nvidia-ml-py and pytest; no vLLM, no
# reportlab, no fastapi, tpcomm not installed. Checks that every test module collects (pytest exit 0, the gpu
# tests skip), the whole check ends within 300 s and leaves at most 8 files. Not part of `make test` (it
# builds a venv: a few minutes); run it by hand after changing test imports or the script.
#
#   scripts/gpu-check-dry-run.sh [VENV_DIR]     # default: a temporary venv, removed afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(command -v python3.11 || command -v python3)
venv=${1:-}
if [ -z "$venv" ]; then
    venv=$(mktemp -d)/venv
    trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
    "$venv/bin/pip" -q install "torch==2.13.0+cpu" pandas pyarrow click httpx rich matplotlib nvidia-ml-py pytest \
        2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
fi
for forbidden in vllm reportlab fastapi tpcomm; do
    if (cd / && "$venv/bin/python" -c "import $forbidden" 2>/dev/null); then
        echo "gpu-check-dry-run: $forbidden is importable in $venv: not a bare environment" >&2
        exit 1
    fi
done
out=$(mktemp -d)
t0=$SECONDS
PYTHON="$venv/bin/python" GPU_CHECK_ALLOW_CPU=1 scripts/gpu-check.sh "$out" > /dev/null
took=$((SECONDS - t0))
files=$(find "$out" -type f | wc -l)
cat "$out/summary.txt"
rc=0
grep -q "gpu-tests: exit 0 " "$out/summary.txt" || { echo "gpu-check-dry-run: the gpu tests did not collect and skip cleanly (see $out/gpu-tests.txt)" >&2; rc=1; }
grep -q "bench-graph-events: exit 0 " "$out/summary.txt" || { echo "gpu-check-dry-run: bench-graph-events failed ($out)" >&2; rc=1; }
[ "$took" -le 300 ] || { echo "gpu-check-dry-run: took $took s (limit 300)" >&2; rc=1; }
[ "$files" -le 8 ] || { echo "gpu-check-dry-run: $files files (limit 8)" >&2; rc=1; }
echo "gpu-check-dry-run: $took s, $files files in $out, exit $rc"
exit $rc
