#!/usr/bin/env bash
# The main job end to end on the embedded default: CPU, embedded Ray, a tiny local model, offline.
#   set-up (.venv) -> rlctl model tiny -> rlctl init -> rlctl data prep arith -> rlctl config validate
#   -> rlctl train (reward rises) -> rlctl status --plot
# Everything lands in demo/ (git-ignored); a second run starts from a clean demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
rm -rf demo
rlctl init demo --recipe grpo-arith-cpu
cd demo
rlctl model tiny models/tiny --layers 2 --hidden 64
rlctl data prep arith
rlctl config validate
rlctl train "$@"
rlctl status runs/grpo-arith-cpu --plot runs/grpo-arith-cpu/curves.png
echo "demo done: see demo/runs/grpo-arith-cpu (metrics.jsonl, curves.png)"
