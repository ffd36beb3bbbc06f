#!/usr/bin/env bash
# One GPU check, run once on a machine with one (or more) NVIDIA GPUs: every test marked `gpu`,
# `tpcomm selfcheck`, and the hook overhead benchmark (the graph-event microbenchmark and the ABBA
# server starts), each with its own time limit, about 15 minutes in all. Output goes to one folder:
#
#   scripts/gpu-check.sh [OUT_DIR]        # default: $OUT/gpu-check-<UTC time> when $OUT is set, else gpu-check/<UTC time>
#
# Needs, in the Python it runs ($PYTHON, default `python`): torch with CUDA, vLLM's CUDA build (the
# vllm-serve selfcheck item and the benchmark start real vLLM; without vLLM they SKIP/fail and say so),
# FlashInfer for the PDL measurement (optional), and tpcomm installed (`pip install -e .`).
# What one GPU cannot run (NCCL between ranks, custom all-reduce, FlashInfer PCIe IPC, the fused
# all-reduce + RMSNorm kernel, graph timing around real collectives) is listed in docs/selfcheck.md.
set -u
PY=${PYTHON:-python}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
if [ -n "${OUT:-}" ]; then DEFAULT_DIR="$OUT/gpu-check-$STAMP"; else DEFAULT_DIR="gpu-check/$STAMP"; fi
DIR=${1:-$DEFAULT_DIR}
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$DIR"
log() { echo "# $(date -u +%H:%M:%S) $*" | tee -a "$DIR/summary.txt"; }

log "gpu-check in $(pwd), output in $DIR"
{ nvidia-smi; nvidia-smi topo -m; } > "$DIR/nvidia-smi.txt" 2>&1
"$PY" - > "$DIR/versions.txt" 2>&1 <<'EOF'
import json, torch
from tpcomm.versions import stack_versions
print(json.dumps({**stack_versions(deep=True), "cuda_available": torch.cuda.is_available(),
                  "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}, indent=1))
EOF
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "torch.cuda.is_available() is False in $PY: nothing to check (see $DIR/versions.txt)"
    exit 2
fi

step() {  # step NAME LIMIT_S CMD...: run with a time limit, keep its output and exit code
    local name=$1 limit=$2
    shift 2
    log "$name: start (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=20 "$limit" "$@" > "$DIR/$name.txt" 2>&1
    local rc=$?
    log "$name: exit $rc after $((SECONDS - t0)) s"
    echo "$name $rc $((SECONDS - t0))" >> "$DIR/exit-codes.txt"
}

# 1. every gpu-marked test (hook timing in graphs, event rotation, GPU step clock, probe at world size 1, ...)
step gpu-tests 300 "$PY" -m pytest -m gpu -q -rA tests --junitxml "$DIR/gpu-tests.xml"
# 2. the self-check (its own limit: 5 minutes), with its JSON
step selfcheck 330 "$PY" -m tpcomm.cli selfcheck --json "$DIR/selfcheck.json"
# 3. what timing events cost inside CUDA graphs, and around PDL-launched kernels (FlashInfer)
step bench-graph-events 120 "$PY" benchmarks/bench_hook_overhead.py --graph-events
# 4. TPOT: no plugin / plugin not recording / plugin recording, 4 starts ABBA, TP 1 tiny Llama
step bench-overhead-abba 420 "$PY" benchmarks/bench_hook_overhead.py --tp 1 --arch llama --rounds 2 \
    --per-batch 3 --extra-args "--gpu-memory-utilization 0.3 --max-num-seqs 4" --json "$DIR/bench-overhead.json"

log "done; exit codes in $DIR/exit-codes.txt"
