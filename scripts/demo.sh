#!/usr/bin/env bash
# The main job end to end on the embedded default: CPU, embedded Ray, a tiny local model, offline.
#   set-up (.venv) -> rlctl model tiny -> SFT (recipe sft-arith-cpu: rlctl train, merge)
#   -> GRPO from the SFT model (recipe grpo-arith-cpu, exact-match reward: rlctl train, status --plot, merge)
#   -> rlctl eval of the base, SFT and GRPO models on the same held-out sums
# It ends with one line: held-out exact accuracy (greedy) after each stage.
# Everything lands in demo/ (git-ignored); each run starts from a clean demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
rm -rf demo && mkdir demo && cd demo
rlctl model tiny models/base --layers 2 --hidden 128

# Stage 1, SFT: next-token loss on the answers (the prompt masked out), then a Hugging Face folder.
rlctl init sft --recipe sft-arith-cpu --model ../models/base
(cd sft
 rlctl data prep arith --sft --limit 180  # data/arith-sft: 180 of the 360 training sums with answers; 40 held out
 rlctl config validate
 rlctl train run.total_steps=300
 rlctl merge runs/sft-arith-cpu --to-hf ../models/sft)

# Stage 2, GRPO from the SFT model on all 360 training prompts, answers never shown: reward 1 for the
# exact sum, 0 otherwise (the built-in reward "arith_exact"), a learning rate for fine-tuning.
rlctl init grpo --recipe grpo-arith-cpu --model ../models/sft
(cd grpo
 rlctl data prep arith                  # the same seeded split: the same 40 held-out sums
 GRPO="reward.function=arith_exact actor.lr=2e-4 run.total_steps=100"
 rlctl config validate $GRPO
 rlctl train $GRPO
 rlctl status runs/grpo-arith-cpu --plot runs/grpo-arith-cpu/curves.png
 rlctl merge runs/grpo-arith-cpu --to-hf ../models/grpo)

# Held-out exact accuracy of each stage: greedy answers to the 40 sums no stage trained on.
for stage in base sft grpo; do
  rlctl eval models/$stage --data sft/data/arith-sft/test.parquet --max-new-tokens 8 \
    --out eval-$stage.jsonl --format json > eval-$stage.json
done
python3 - <<'PY'
import json
acc = {stage: json.load(open(f"eval-{stage}.json"))["all"]["accuracy"] for stage in ("base", "sft", "grpo")}
print("held-out exact accuracy (40 unseen sums, greedy): "
      + " -> ".join(f"{stage} {value:.3f}" for stage, value in acc.items()))
PY
echo "demo done: demo/sft/runs/sft-arith-cpu, demo/grpo/runs/grpo-arith-cpu (metrics.jsonl, curves.png), demo/models/{base,sft,grpo}; serve one with: .venv/bin/rlctl serve demo/models/grpo"
