#!/usr/bin/env bash
# The main job end to end on the embedded default: CPU, embedded Ray, a tiny local model, offline.
#   set-up (.venv) -> rlctl model tiny -> rlctl init -> rlctl data prep arith -> rlctl config validate
#   -> rlctl train (the reward rises) -> rlctl status --plot -> rlctl merge --to-hf -> rlctl eval
# Everything lands in demo/ (git-ignored); each run starts from a clean demo/.
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
rlctl merge runs/grpo-arith-cpu --to-hf out/grpo-arith-cpu
rlctl eval out/grpo-arith-cpu --data data/arith/test.parquet
python3 - <<'PY'
import json
rows = [json.loads(line) for line in open("runs/grpo-arith-cpu/metrics.jsonl")]
first = sum(r["reward/mean"] for r in rows[:5]) / 5
last = sum(r["reward/mean"] for r in rows[-5:]) / 5
print(f"mean reward: first 5 steps {first:.3f} -> last 5 steps {last:.3f}")
PY
echo "demo done: demo/runs/grpo-arith-cpu (metrics.jsonl, curves.png); serve it with: .venv/bin/rlctl serve demo/out/grpo-arith-cpu"
