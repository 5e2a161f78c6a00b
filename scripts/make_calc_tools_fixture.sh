#!/usr/bin/env bash
# Rebuild tests/fixtures/calc-tools-sft: the SFT stage of the CPU tool-use recipe, run as a user runs it.
#   rlctl model tiny -> rlctl data prep calc-tools -> rlctl train (recipe sft-calc-tools-cpu) -> rlctl merge
# tests/multiturn/test_tool_learning.py starts GRPO from it, so the suite need not spend the SFT stage's
# ~4 minutes. Rerun it whenever the tiny model, the byte-level chat template, the calc-tools data or
# the SFT recipe change (the test checks the fixture's chat template against rlctl's).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rlctl="${RLCTL:-$root/.venv/bin/rlctl}"
out="$root/tests/fixtures/calc-tools-sft"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
cd "$work"
"$rlctl" model tiny models/tiny
"$rlctl" data prep calc-tools
"$rlctl" recipes show sft-calc-tools-cpu > sft.toml
"$rlctl" train sft.toml
"$rlctl" merge runs/sft-calc-tools-cpu --to-hf merged
# the weights and tokenizer only: the run's provenance files name this temporary folder
rm -rf "$out.new" && mkdir "$out.new"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -e "merged/$f" ] && cp "merged/$f" "$out.new/"
done
tail -n 1 runs/sft-calc-tools-cpu/metrics.jsonl > "$out.new/sft_last_step.json"
[ -e "$out/README.md" ] && cp "$out/README.md" "$out.new/"
rm -rf "$out" && mv "$out.new" "$out"
echo "wrote $out"
