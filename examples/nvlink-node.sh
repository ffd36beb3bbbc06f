#!/usr/bin/env bash
# One NVLink/NVSwitch node (8x H100 or H200 SXM), DeepSeek-V3 with TP 8.
# On NVSwitch vLLM uses its custom all-reduce (or symmetric memory): the report shows whether the
# interconnect still matters at single stream or weight streaming dominates.
set -euo pipefail
RUN=${RUN:-runs/nvlink-node}
MODEL=${MODEL:-deepseek-ai/DeepSeek-V3}
CONFIG=${CONFIG:-deepseek-v3}
GPU=${GPU:-h200}                               # h100-sxm | h200 | b200
PORT=${PORT:-8000}

tpcomm plan    --model "$CONFIG" --tp 8 --batch 1,16,64 --out "$RUN"
tpcomm topo    --tp 8 --out "$RUN"
tpcomm probe   --gpus 8 --model "$CONFIG" --out "$RUN"
tpcomm predict --model "$CONFIG" --tp 8 --gpu "$GPU" --probe "$RUN" --batch 1,16,64 --out "$RUN"

VLLM_PLUGINS=tpcomm vllm serve "$MODEL" --tensor-parallel-size 8 --port "$PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 5; done

tpcomm attribute --server-url "http://127.0.0.1:$PORT" --concurrency 1,16,64 --repeat 2 --out "$RUN"
tpcomm report "$RUN"
