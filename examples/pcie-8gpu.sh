#!/usr/bin/env bash
# 8 PCIe GPUs, no NVLink (e.g. 8x RTX PRO 6000 Blackwell), Kimi-K2.5 served with TP 8.
# The question: is single-stream decode capped by PCIe all-reduce, and what would move it?
set -euo pipefail
RUN=${RUN:-runs/pcie-8gpu}
MODEL=${MODEL:-moonshotai/Kimi-K2.5}          # HF id or local folder for vLLM
CONFIG=${CONFIG:-kimi-k2.5}                   # tpcomm preset, or the folder holding config.json
PORT=${PORT:-8000}

# 1. What vLLM will send per decode step, and what the hardware predicts (no GPU needed): every number a range over
#    the model's uncertain inputs, a verdict only where the whole range agrees.
tpcomm plan    --model "$CONFIG" --tp 8 --batch 1,8,32 --out "$RUN"
tpcomm predict --model "$CONFIG" --tp 8 --gpu rtx-pro-6000 --batch 1,8,32 --out "$RUN"

# 2. The machine: GPUs, PCIe tree, P2P, NUMA, NCCL settings (flags a disabled P2P or a bad NCCL_P2P_LEVEL).
tpcomm topo --tp 8 --out "$RUN"

# 3. The model's own collectives on every backend vLLM could pick (NCCL, PyNccl, custom all-reduce), eager and
#    in CUDA graphs; then predict again, calibrated by what was measured.
tpcomm probe --gpus 8 --model "$CONFIG" --batch 1,8,32 --out "$RUN"
tpcomm predict --model "$CONFIG" --tp 8 --gpu rtx-pro-6000 --probe "$RUN" --batch 1,8,32 --out "$RUN"

# 4. The real server with the tpcomm hook (installed in vLLM's environment; VLLM_PLUGINS switches it on).
VLLM_PLUGINS=tpcomm vllm serve "$MODEL" --tensor-parallel-size 8 --port "$PORT" --trust-remote-code &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 5; done

# 5. Load (single stream, then a concurrency ladder, repeated) and the per-token split.
tpcomm attribute --server-url "http://127.0.0.1:$PORT" --concurrency 1,8,32,64 --repeat 2 --out "$RUN"

# 5b. The model anchored on what was just measured: what-ifs (one-shot all-reduce, NVLink, TP 4, batch) from the
#     measured compute, collective and host terms instead of assumed constants.
tpcomm predict --model "$CONFIG" --tp 8 --gpu rtx-pro-6000 --attribution "$RUN" --batch 1,8,32 --out "$RUN"

# 6. The report.
tpcomm report "$RUN"
echo "report: $RUN/report.pdf"

# Levers the report may point at, to try one at a time (then rerun steps 4-6):
#   VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1   one-shot PCIe all-reduce (vLLM 0.32, TP 2/4/8, bf16/fp16)
#   NCCL_PROTO=LL                              small-message protocol when NCCL mis-tunes on PCIe
#   NCCL_P2P_LEVEL=SYS / fix ACS in BIOS       when topo reports P2P disabled between GPUs
