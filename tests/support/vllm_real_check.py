"""vLLM's CPU engine on a real model (SmolLM2-135M-Instruct) against the trainer's log-probs, in a
process of its own (vLLM's external launcher makes its process a torch.distributed world of one).

Usage: python vllm_real_check.py MODEL_DIR. Prints `REPORT {json}`: for float32 and bfloat16
engines, the largest and mean |engine log-prob - trainer log-prob| over the sampled tokens, the trainer
computing in float32 (and under bfloat16 autocast for the bfloat16 engine, as model.dtype runs it).
"""

from __future__ import annotations

import json
import sys

import torch

QUESTIONS = [f"What is {a}+{b}? Reply with digits only." for a, b in ((7, 10), (3, 4), (12, 9), (15, 18))]


def trainer_log_probs(model, prompt: list[int], response: list[int], bf16: bool) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def main(model_dir: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.workers.rollout.gpu import GPUEngineSpec
    from rlctl.workers.rollout.vllm import VLLMRolloutEngine

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for q in QUESTIONS]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    report = {}
    for dtype in ("float32", "bfloat16"):
        engine = VLLMRolloutEngine(GPUEngineSpec(model_path=model_dir, dtype=dtype, max_model_len=128, seed=3,
                                                 enforce_eager=True), pad_token_id=eos, eos_token_ids=[eos])
        out = engine.generate(prompts, n=2, max_new_tokens=12, temperature=1.0,
                              generator=torch.Generator().manual_seed(0))
        engine.close()
        diffs = []
        for row in range(len(out["responses"])):
            length = int(out["response_length"][row])
            response = out["responses"][row, :length].tolist()
            mine = torch.tensor(out["rollout_log_prob"][row, :length], dtype=torch.float32)
            diffs.append((trainer_log_probs(model, prompts[row // 2], response, dtype == "bfloat16") - mine).abs())
        every = torch.cat(diffs)
        report[dtype] = {"max": float(every.max()), "mean": float(every.mean()), "tokens": int(every.numel())}
    return report


if __name__ == "__main__":
    print("REPORT " + json.dumps(main(sys.argv[1])))
