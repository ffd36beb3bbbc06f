#!/usr/bin/env bash
# Two nodes, 8 GPUs each: probe TP inside a node and the pipeline send/recv across nodes.
# Run this script on BOTH nodes with NODE_RANK=0 and NODE_RANK=1 and the same MASTER_ADDR.
# The probe's ranks rendezvous through torchrun; rank 0 writes the run directory.
set -euo pipefail
RUN=${RUN:-runs/two-nodes}
CONFIG=${CONFIG:-deepseek-v3}
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
NODE_RANK=${NODE_RANK:?set NODE_RANK to 0 or 1}

# The plan for TP 8 inside each node and PP 2 across the two nodes.
[ "$NODE_RANK" = 0 ] && tpcomm plan --model "$CONFIG" --tp 8 --pp 2 --batch 1,16 --out "$RUN"
tpcomm topo --tp 8 --out "$RUN/node$NODE_RANK"

# torchrun starts 8 ranks per node; the probe detects the launcher (RANK/WORLD_SIZE) instead of spawning,
# so its collectives span both nodes: the cross-node cost of any group that would straddle them.
torchrun --nnodes 2 --nproc-per-node 8 --node-rank "$NODE_RANK" \
  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" \
  -m tpcomm.cli probe --model "$CONFIG" --out "$RUN"

if [ "$NODE_RANK" = 0 ]; then
  # The probe spanned 16 ranks, the TP groups are 8 wide: predict uses the NCCL model for them.
  tpcomm predict --model "$CONFIG" --tp 8 --pp 2 --gpu h100-sxm --out "$RUN"
  tpcomm report "$RUN"
fi

