"""The synthetic `arith` task: small additions, generated offline and seeded.

It exists so the end-to-end demo and the tests have a task that a tiny random model can learn
on CPU in minutes: prompts are short (about 56 tokens for a byte-level tokenizer with a ChatML
template), answers are 1-2 digits, and the reward (rlctl.rewards.scorers.arith) gives partial
credit for the answer's form. Every (a, b) pair with a, b in 0..MAX_OPERAND appears once;
the test split is a seeded random share of the pairs, so no test prompt is seen in training.
"""

from __future__ import annotations

import random

from rlctl.rewards.scorers.arith import DATA_SOURCE

MAX_OPERAND = 19
DEFAULT_VAL_FRACTION = 0.1


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}? Reply with digits only."


def _row(a: int, b: int, split: str, index: int) -> dict:
    text = question(a, b)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": text}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index, "question": text, "answer": str(a + b)},
    }


def generate(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: all pairs, shuffled by `seed`, test = val_fraction of them."""
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(seed).shuffle(pairs)
    n_test = round(len(pairs) * val_fraction)
    splits = {"train": pairs[n_test:], "test": pairs[:n_test]}
    return {split: [_row(a, b, split, i) for i, (a, b) in enumerate(chosen)]
            for split, chosen in splits.items() if chosen}
