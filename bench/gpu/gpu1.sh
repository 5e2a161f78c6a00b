set -o pipefail
source bench/gpu/setup_dev.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import sys,torch,transformers,peft,ray;print(sys.version.split()[0],'torch',torch.__version__,'tf',transformers.__version__,'peft',peft.__version__,'ray',ray.__version__,'cuda',torch.cuda.is_available())"
echo "== A: pytest -m gpu"; t0=$(date +%s)
python3 -m pytest -m gpu -q -p no:cacheprovider tests/workers/rollout/test_gpu_engines_cuda.py -rs 2>&1 | tail -8
echo "A took $(( $(date +%s)-t0 )) s"
W=/tmp/demo; rm -rf $W; mkdir -p $W; cd $W
GPU="resources.gpus_per_node=1 resources.workers=1 model.dtype=bfloat16"
rl model tiny models/base --layers 2 --hidden 128 >/dev/null
echo "== B1: SFT on GPU bf16"; t0=$(date +%s)
rl init sft --recipe sft-arith-cpu --model ../models/base >/dev/null
(cd sft && rl data prep arith --sft --limit 150 --val-fraction 0.25 >/dev/null && rl config validate $GPU | tail -2 && rl train run.total_steps=300 $GPU > train.log 2>&1; echo "train rc=$?"; tail -3 train.log; rl merge runs/sft-arith-cpu --to-hf ../models/sft 2>&1 | tail -2)
echo "B1 took $(( $(date +%s)-t0 )) s"
echo "== B2: GRPO on GPU bf16"; t0=$(date +%s)
rl init grpo --recipe grpo-arith-cpu --model ../models/sft >/dev/null
G="reward.function=arith_exact actor.lr=2e-4 actor.ppo_epochs=2 actor.mini_batch_size=8 actor.kl_loss_coef=0.05 run.total_steps=300 data.val_batch_size=100 $GPU"
(cd grpo && rl data prep arith --val-fraction 0.25 >/dev/null && rl config validate $G | tail -2 && rl train $G > train.log 2>&1; echo "train rc=$?"; tail -3 train.log; rl merge runs/grpo-arith-cpu --to-hf ../models/grpo 2>&1 | tail -2)
echo "B2 took $(( $(date +%s)-t0 )) s"
for s in base sft grpo; do rl eval models/$s --data sft/data/arith-sft/test.parquet --max-new-tokens 8 --format json > eval-$s.json 2>eval-$s.err || tail -2 eval-$s.err; done
python3 -c "
import json
print('held-out acc:', {s: json.load(open(f'eval-{s}.json'))['all']['accuracy'] for s in ('base','sft','grpo')})"
python3 - <<'PY'
import json
for run in ("sft/runs/sft-arith-cpu", "grpo/runs/grpo-arith-cpu"):
    rows = [json.loads(l) for l in open(f"/tmp/demo/{run}/metrics.jsonl")]
    keys = [k for k in rows[-1] if "time" in k or k in ("reward/mean", "critic/score/mean", "train/loss", "actor/pg_loss", "rollout/logprob_diff_mean", "rollout/logprob_diff_max", "perf/max_memory_allocated_gb")]
    print(run, len(rows), {k: rows[-1][k] for k in keys})
PY
cp /tmp/demo/sft/runs/sft-arith-cpu/metrics.jsonl $OUT/sft-metrics.jsonl; cp /tmp/demo/grpo/runs/grpo-arith-cpu/metrics.jsonl $OUT/grpo-metrics.jsonl; ls /tmp/demo/grpo/runs/grpo-arith-cpu
echo "== C: a 0.5B-shaped random model (24 x 896, Qwen2.5-0.5B's shape, byte-level vocab): GRPO step on one H100, hf engine, bf16"
cd /tmp/demo && rl model tiny models/big --layers 24 --hidden 896 --heads 14 --kv-heads 2 >/dev/null
python3 -c "import json;c=json.load(open('models/big/config.json'));print({k:c.get(k) for k in ('num_hidden_layers','hidden_size','intermediate_size','vocab_size','head_dim')})"
t0=$(date +%s)
(cd grpo && rl train model.path=../models/big run.name=big data.batch_size=16 rollout.n=8 data.max_response_length=256 actor.mini_batch_size=16 actor.micro_batch_size=32 run.total_steps=4 data.val_files=[] actor.lr=1e-6 $GPU > big.log 2>&1; echo "big rc=$?"; tail -2 big.log)
echo "C took $(( $(date +%s)-t0 )) s"
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/demo/grpo/runs/big/metrics.jsonl")]
for r in rows:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k.startswith(("timing", "perf", "step", "response_length/mean", "rollout/logprob_diff"))})
PY
cp /tmp/demo/grpo/runs/big/metrics.jsonl $OUT/big-metrics.jsonl
