#!/usr/bin/env bash
# The figures in recipes/sft-arith-cpu.toml's header: the recipe as a new user runs it, from a fresh
# tiny model, then merge and greedy held-out exact accuracy (40 unseen sums). Prints one line.
#   bash bench/sft_arith_recipe.sh OUT [SEED] [TINY_ARGS] [TRAIN_OVERRIDES]
#   bash bench/sft_arith_recipe.sh /tmp/s0 0                                   # default 2 x 64 model
#   bash bench/sft_arith_recipe.sh /tmp/b0 0 "--layers 4 --hidden 256" "actor.lr=1e-3"
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$1; seed=${2:-0}; tiny=${3:-}; over=${4:-}
export PATH="$repo/.venv/bin:$PATH" OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
rm -rf "$out" && mkdir -p "$out" && cd "$out"
# shellcheck disable=SC2086  # word-splitting of the optional arguments is intended
rlctl model tiny models/tiny --seed "$seed" $tiny > /dev/null
rlctl init p --recipe sft-arith-cpu --model ../models/tiny > /dev/null
cd p
rlctl data prep arith --sft > /dev/null
rlctl eval ../models/tiny --data data/arith-sft/test.parquet --max-new-tokens 8 --format json > base.json 2> /dev/null
start=$(date +%s)
# shellcheck disable=SC2086
rlctl train "run.seed=$seed" $over > train.log 2>&1
seconds=$(( $(date +%s) - start ))
rlctl merge runs/sft-arith-cpu --to-hf ../models/sft > /dev/null 2>&1
rlctl eval ../models/sft --data data/arith-sft/test.parquet --max-new-tokens 8 --format json > sft.json 2> /dev/null
python3 - "$seed" "$seconds" <<'PY'
import json, sys
acc = {stage: json.load(open(f"{stage}.json"))["all"]["accuracy"] for stage in ("base", "sft")}
print(f"seed {sys.argv[1]}: held-out exact accuracy {acc['base']:.3f} -> {acc['sft']:.3f}, train {sys.argv[2]} s")
PY
