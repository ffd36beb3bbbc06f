#!/usr/bin/env bash
# The GPU check, as it is, on one bare GPU machine: python3 with torch (CUDA), pandas, pyarrow, click,
# httpx, rich, matplotlib, nvidia-ml-py and pytest; no vLLM, FlashInfer or reportlab, no network, no
# install (PYTHONPATH points at this checkout). At most 5 minutes in all, at most 8 files in one folder:
#
#   scripts/gpu-check.sh [OUT_DIR]      # default: $OUT when set, else gpu-check/<UTC time>
#
# What it checks on real CUDA (what the CPU simulation, tests/cuda_sim.py, cannot): the CUDAGraph patch
# with torch's real pybind binding (keep_graph through __init__), event rotation through the driver,
# query-only reads (no wait while steps are enqueued), the GPU step clock with the host a step ahead (as
# under vLLM's async scheduling), world-size-1 probe and replay paths, `tpcomm selfcheck` (its vLLM item
# SKIPs without vLLM), and what timing events cost per graph replay. What needs two or more GPUs (NCCL
# between ranks, custom all-reduce, FlashInfer PCIe IPC, graph timing around real collectives) is listed
# in docs/selfcheck.md.
#
# Files (7): summary.txt (steps, exit codes, times), env.txt (nvidia-smi, versions), gpu-tests.txt,
# gpu-tests.xml, selfcheck.txt, selfcheck.json, bench-graph-events.txt.
# CPU dry run (collects, skips, <= 5 min): GPU_CHECK_ALLOW_CPU=1 scripts/gpu-check.sh DIR
# (scripts/gpu-check-dry-run.sh builds the bare environment and runs it).
set -u
PY=${PYTHON:-python3}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
DIR=${1:-${OUT:-gpu-check/$STAMP}}
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ folders in the checkout
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
BUDGET_S=${GPU_CHECK_BUDGET_S:-290}  # the whole check; each step gets what is left, up to its own limit
log() { echo "# $(date -u +%H:%M:%S) $*" | tee -a "$DIR/summary.txt"; }

log "gpu-check in $ROOT with $PY, output in $DIR (budget ${BUDGET_S} s)"
{
    nvidia-smi 2>&1 && nvidia-smi topo -m 2>&1
    "$PY" - 2>&1 <<'EOF'
import json, torch
from tpcomm.versions import stack_versions
print(json.dumps({**stack_versions(deep=True), "cuda_available": torch.cuda.is_available(),
                  "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}, indent=1))
EOF
} > "$DIR/env.txt" 2>&1
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    if [ -z "${GPU_CHECK_ALLOW_CPU:-}" ]; then
        log "torch.cuda.is_available() is False in $PY: nothing to check (see $DIR/env.txt)"
        exit 2
    fi
    log "no CUDA: dry run (GPU_CHECK_ALLOW_CPU=1): every step runs and skips what needs a GPU"
fi

step() {  # step NAME LIMIT_S CMD...: run with a time limit (at most what is left), keep its output and exit code
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        log "$name: not run (budget spent)"
        return
    fi
    log "$name: start (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=10 "$limit" "$@" > "$DIR/$name.txt" 2>&1
    local rc=$?
    log "$name: exit $rc after $((SECONDS - t0)) s"
}

# 1. every gpu-marked test (graph patch on the real binding, rotation, GPU step clock, probe at world size 1, ...)
step gpu-tests 150 "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider tests --junitxml "$DIR/gpu-tests.xml"
# 2. the self-check, with its JSON (its vLLM item SKIPs without vLLM)
step selfcheck 100 "$PY" -m tpcomm.cli selfcheck --json "$DIR/selfcheck.json"
# 3. what timing events cost inside CUDA graphs, per replay
step bench-graph-events 40 "$PY" benchmarks/bench_hook_overhead.py --graph-events

log "done in $SECONDS s; $(find "$DIR" -maxdepth 1 -type f | wc -l) files in $DIR"
