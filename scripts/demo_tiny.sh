#!/usr/bin/env bash
# The whole pipeline (SFT -> GRPO) on a tiny random model, a few minutes (the main job, scripts/demo.sh, trains a
# real one): CPU, embedded Ray, offline.
#   set-up (.venv) -> rlctl model tiny -> SFT (recipe sft-arith-cpu: rlctl train, merge)
#   -> GRPO from the SFT model (recipe grpo-arith-cpu, exact-match reward: rlctl train, status --plot, merge)
#   -> rlctl eval of the base, SFT and GRPO models on the same held-out sums
# It ends with one line: held-out exact accuracy (greedy) after each stage.
# Everything lands in demo-tiny/ (git-ignored); each run starts from a clean demo-tiny/.
set -euo pipefail
cd "$(dirname "$0")/.."
RLCTL_VLLM=${RLCTL_VLLM:-0} bash scripts/setup.sh   # the demo runs the hf engine: vLLM's CPU build (3.3 GB) is the tests' business
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
rm -rf demo-tiny && mkdir demo-tiny && cd demo-tiny
rlctl model tiny models/base --layers 2 --hidden 128

# Stage 1, SFT: next-token loss on the answers (the prompt masked out), then a Hugging Face folder.
rlctl init sft --recipe sft-arith-cpu --model ../models/base
(cd sft
 # data/arith-sft: 150 of the 300 training sums with answers; 100 of the 400 sums held out
 rlctl data prep arith --sft --limit 150 --val-fraction 0.25
 rlctl config validate
 rlctl train run.total_steps=300
 rlctl merge runs/sft-arith-cpu --to-hf ../models/sft)

# Stage 2, GRPO from the SFT model on all 300 training prompts, answers never shown: reward 1 for the
# exact sum, 0 otherwise (the built-in reward "arith_exact"); a learning rate for fine-tuning, 4 updates
# per batch (2 epochs x 2 mini-batches) and a KL loss to the SFT model strong enough to keep it general.
rlctl init grpo --recipe grpo-arith-cpu --model ../models/sft
(cd grpo
 rlctl data prep arith --val-fraction 0.25   # the same seeded split: the same 100 held-out sums
 GRPO="reward.function=arith_exact actor.lr=2e-4 actor.ppo_epochs=2 actor.mini_batch_size=8"
 GRPO="$GRPO actor.kl_loss_coef=0.05 run.total_steps=300 data.val_batch_size=100"
 rlctl config validate $GRPO
 rlctl train $GRPO
 rlctl status runs/grpo-arith-cpu --plot runs/grpo-arith-cpu/curves.png
 rlctl merge runs/grpo-arith-cpu --to-hf ../models/grpo)

# Held-out exact accuracy of each stage: greedy answers to the 100 sums no stage trained on.
for stage in base sft grpo; do
  rlctl eval models/$stage --data sft/data/arith-sft/test.parquet --max-new-tokens 8 \
    --out eval-$stage.jsonl --format json > eval-$stage.json
done
python3 - <<'PY'
import json
acc = {stage: json.load(open(f"eval-{stage}.json"))["all"]["accuracy"] for stage in ("base", "sft", "grpo")}
print("held-out exact accuracy (100 unseen sums, greedy): "
      + " -> ".join(f"{stage} {value:.3f}" for stage, value in acc.items()))
PY
echo "demo done: demo-tiny/sft/runs/sft-arith-cpu, demo-tiny/grpo/runs/grpo-arith-cpu (metrics.jsonl, curves.png), demo-tiny/models/{base,sft,grpo}; serve one with: .venv/bin/rlctl serve demo-tiny/models/grpo"
