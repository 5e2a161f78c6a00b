"""An RL loop written only against the official `tinker` SDK, run on `rlctl tinker`: the shape of
tinker-cookbook's `rl_loop` (groups of samples per prompt, advantages = reward minus the group's
mean, `importance_sampling` with the sampler's log-probs, one Adam step per batch), on offline
two-digit sums instead of a hub dataset. The reward is 1 when the last number of the answer is the
sum (the `arith_answer` rule of rlctl's own arith recipes).

    rlctl tinker --model models/smollm2 &
    python examples/tinker/rl_arith.py --base-url http://127.0.0.1:8765 --model "$(realpath models/smollm2)" --seed 0

Prints one JSON line per step: {"step", "reward"}, with "held_out" (greedy accuracy on 32 fixed sums
never trained on) before the first step and after the last.
"""

from __future__ import annotations

import argparse
import json
import random
import re

import tinker
from tinker import types


def problems(rng: random.Random, n: int) -> list[tuple[str, int]]:
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        out.append((f"What is {a} + {b}? Answer with the number only.", a + b))
    return out


def reward(text: str, answer: int) -> float:
    numbers = re.findall(r"-?\d+", text)
    return float(bool(numbers) and int(numbers[-1]) == answer)


def prompt_tokens(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def held_out(sampler, tok, tests) -> float:
    greedy = types.SamplingParams(max_tokens=16, temperature=0.0)
    futures = [sampler.sample(types.ModelInput.from_ints(prompt_tokens(tok, q)), 1, greedy) for q, _ in tests]
    return sum(reward(tok.decode(f.result().sequences[0].tokens), a) for f, (_, a) in zip(futures, tests)) / len(tests)


def step_data(sampler, tok, batch, group: int, max_tokens: int) -> tuple[list[types.Datum], float]:
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
    prompts = [prompt_tokens(tok, q) for q, _ in batch]
    futures = [sampler.sample(types.ModelInput.from_ints(p), group, params) for p in prompts]
    data, rewards = [], []
    for prompt, (_, answer), fut in zip(prompts, batch, futures):
        seqs = fut.result().sequences
        r = [reward(tok.decode(s.tokens), answer) for s in seqs]
        rewards += r
        mean = sum(r) / len(r)
        if all(x == r[0] for x in r):
            continue   # no signal in this group (the cookbook drops these too)
        for s, x in zip(seqs, r):
            full = prompt + s.tokens
            pad = [0.0] * (len(prompt) - 1)
            data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                    loss_fn_inputs={"target_tokens": full[1:], "logprobs": pad + s.logprobs,
                                                    "advantages": pad + [x - mean] * len(s.tokens)}))
    return data, sum(rewards) / len(rewards)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tests = problems(random.Random(1234), 32)
    service = tinker.ServiceClient(base_url=args.base_url, api_key="tml-example")
    tc = service.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed).result()
    tok = tc.get_tokenizer()
    for step in range(args.steps + 1):
        sampler = tc.save_weights_and_get_sampling_client().result()
        line = {"step": step}
        if step in (0, args.steps):
            line["held_out"] = held_out(sampler, tok, tests)
        if step < args.steps:
            data, line["reward"] = step_data(sampler, tok, problems(rng, args.batch), args.group, args.max_tokens)
            if data:
                tc.forward_backward(data, "importance_sampling").result()
                tc.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        print(json.dumps(line), flush=True)
    service.close("success").result()


if __name__ == "__main__":
    main()
