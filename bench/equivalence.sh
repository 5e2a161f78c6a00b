#!/usr/bin/env bash
# Behaviour fingerprint of five short runs (GRPO, PPO, SFT, multi-turn GRPO, one-step off-policy):
# their metrics (timing/perf keys dropped: wall-clock) and the sha256 of their final weights.
# Run it before and after a refactor; equal digests = bit-identical metrics and weights on CPU.
#
#   bash bench/equivalence.sh OUT_DIR     # prints one "<run> metrics <sha> weights <sha>" line per run
set -euo pipefail
out=${1:?usage: bench/equivalence.sh OUT_DIR}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
RLCTL=${RLCTL:-rlctl}
mkdir -p "$out" && cd "$out"
$RLCTL model tiny models/tiny >/dev/null
$RLCTL data prep arith --out data/arith >/dev/null
$RLCTL data prep arith --sft --out data/arith-sft >/dev/null
$RLCTL data prep calc-tools --out data/calc-tools >/dev/null

digest() {   # metrics without wall-clock keys, then every tensor of the newest checkpoint's weights
  local run=$1
  python3 - "$run" <<'EOF'
import hashlib, json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
keep = [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/", "time"))} for r in rows]
print(hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16])
EOF
}

train() {   # train NAME RECIPE key=value ...
  local name=$1 recipe=$2; shift 2
  mkdir -p "$name" && cp -r models data "$name"/
  $RLCTL init "$name" --recipe "$recipe" --model models/tiny --force >/dev/null
  (cd "$name" && $RLCTL train run.name="$name" run.loggers='["jsonl"]' "$@" >train.log 2>&1) \
    || { echo "$name: train failed, see $out/$name/train.log" >&2; return 1; }
  (cd "$name" && $RLCTL merge "runs/$name" --to-hf hf >/dev/null 2>&1)
  local weights
  weights=$(python3 -c "
import hashlib, sys
from safetensors.numpy import load_file
import glob
h = hashlib.sha256()
for f in sorted(glob.glob('$name/hf/*.safetensors')):
    t = load_file(f)
    for k in sorted(t): h.update(k.encode()); h.update(t[k].tobytes())
print(h.hexdigest()[:16])")
  echo "$name metrics $(digest "$name/runs/$name") weights $weights"
}

train grpo grpo-arith-cpu run.total_steps=3 run.val_every=0 data.val_batch_size=40
train ppo grpo-arith-cpu run.total_steps=3 algorithm.name=gae critic.lr=1e-3 actor.use_kl_loss=false
train sft sft-arith-cpu run.total_steps=4
train offpolicy grpo-arith-offpolicy-cpu run.total_steps=4
train multiturn grpo-calc-tools-cpu run.total_steps=2 model.path=models/tiny data.batch_size=4 rollout.n=4 \
  actor.mini_batch_size=4 actor.micro_batch_size=8 data.max_response_length=48 run.val_every=0 run.val_before_train=false
