"""A first training loop on the Tinker API, run against `rlctl tinker` with the official SDK.

    rlctl tinker --model models/smollm2 --port 8765 &
    TINKER_BASE_URL=http://127.0.0.1:8765 TINKER_API_KEY=tml-local python examples/tinker/first_loop.py

It is plain Tinker code: nothing here knows about rlctl. A LoRA training client on the server's first
base model learns one answer by supervised steps (`forward_backward` with `cross_entropy`, then
`optim_step`), printing the loss per answer token of each step, then samples the answer from the
trained weights. The loss falls step by step; with SmolLM2 the greedy sample after 6 steps is the
taught answer.
"""

from __future__ import annotations

import argparse

import tinker
from tinker import types

PROMPT = "Q: What is 17 + 25?\nA:"
ANSWER = " 42"


def supervised_datum(tokenizer, prompt: str, answer: str) -> types.Datum:
    """Tinker's shape: the input is the sequence less its last token, the targets are the sequence
    shifted by one, and the weights select which targets count (the answer's, not the prompt's)."""
    prompt_ids = tokenizer.encode(prompt)
    ids = prompt_ids + tokenizer.encode(answer, add_special_tokens=False)
    if tokenizer.eos_token_id is not None:   # taught to stop after the answer, so sampling does
        ids.append(tokenizer.eos_token_id)
    weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * (len(ids) - len(prompt_ids))
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": weights})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0,
                    help="seeds the adapter's initial weights, so a rerun prints the same losses")
    args = ap.parse_args()

    service = tinker.ServiceClient()    # TINKER_BASE_URL / TINKER_API_KEY from the environment
    base = tinker.RestClient().get_server_capabilities().result().supported_models[0].model_name
    trainer = service.create_lora_training_client(base_model=base, rank=args.rank, seed=args.seed).result()
    tokenizer = trainer.get_tokenizer()
    datum = supervised_datum(tokenizer, PROMPT, ANSWER)
    answer_tokens = sum(1 for w in datum.loss_fn_inputs["weights"].tolist() if w)
    for step in range(args.steps):
        out = trainer.forward_backward([datum], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        # losses are sums over the weighted tokens: divide for a per-token figure
        print(f"step {step + 1}  loss/token {out.metrics['loss:sum'] / answer_tokens:.4f}", flush=True)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    reply = sampler.sample(types.ModelInput.from_ints(tokenizer.encode(PROMPT)), 1,
                           types.SamplingParams(max_tokens=4, temperature=0.0)).result()
    print(f"sample {tokenizer.decode(reply.sequences[0].tokens)!r}")


if __name__ == "__main__":
    main()
