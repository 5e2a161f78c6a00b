set -o pipefail
source bench/gpu/setup_dev.sh
W=/tmp/g3; rm -rf $W; mkdir -p $W; cd $W
G1="resources.gpus_per_node=1"
rl model tiny models/tiny-vl --arch qwen2_5_vl >/dev/null
rl init vl --recipe grpo-shapes-cpu --model ../models/tiny-vl >/dev/null
cd vl && rl data prep shapes-colour 2>&1 | tail -3
echo "== V1: grpo-shapes-cpu as shipped (fp32, 300 steps) on the GPU"; t0=$(date +%s)
rl config validate $G1 | tail -1
rl train $G1 > train.log 2>&1; echo "rc=$?"; grep -i "validation" train.log; tail -1 train.log
echo "V1 took $(( $(date +%s)-t0 )) s"
rl merge runs/grpo-shapes-cpu --to-hf ../models/vl-out 2>&1 | tail -2
cp runs/grpo-shapes-cpu/metrics.jsonl $OUT/vl-fp32-metrics.jsonl
echo "== V2: the same in bf16, 60 steps"; t0=$(date +%s)
rl train $G1 model.dtype=bfloat16 run.name=vl-bf16 run.total_steps=60 run.val_every=0 > bf16.log 2>&1; echo "rc=$?"; grep -i "validation" bf16.log; tail -1 bf16.log
echo "V2 took $(( $(date +%s)-t0 )) s"
cd $W
echo "== D: the README demo in float32 on the GPU"; t0=$(date +%s)
GPU="resources.gpus_per_node=1 resources.workers=1 model.dtype=float32"
rl model tiny models/base --layers 2 --hidden 128 >/dev/null
rl init sft --recipe sft-arith-cpu --model ../models/base >/dev/null
(cd sft && rl data prep arith --sft --limit 150 --val-fraction 0.25 >/dev/null && rl train run.total_steps=300 $GPU > train.log 2>&1; echo "sft rc=$?"; rl merge runs/sft-arith-cpu --to-hf ../models/sft 2>&1 | tail -1)
rl init grpo --recipe grpo-arith-cpu --model ../models/sft >/dev/null
G="reward.function=arith_exact actor.lr=2e-4 actor.ppo_epochs=2 actor.mini_batch_size=8 actor.kl_loss_coef=0.05 run.total_steps=300 data.val_batch_size=100 $GPU"
(cd grpo && rl data prep arith --val-fraction 0.25 >/dev/null && rl train $G > train.log 2>&1; echo "grpo rc=$?"; tail -1 train.log; rl merge runs/grpo-arith-cpu --to-hf ../models/grpo 2>&1 | tail -1)
for s in base sft grpo; do rl eval models/$s --data sft/data/arith-sft/test.parquet --max-new-tokens 8 --format json > eval-$s.json 2>/dev/null; done
python3 -c "
import json
print('fp32 on GPU held-out acc:', {s: json.load(open(f'eval-{s}.json'))['all']['accuracy'] for s in ('base','sft','grpo')})"
echo "D took $(( $(date +%s)-t0 )) s"
