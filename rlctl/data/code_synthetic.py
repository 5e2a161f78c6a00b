"""The synthetic `code-synthetic` task: tiny stdin/stdout programs, generated offline and seeded.

Each problem asks for a one-line program over two integers read from one input line (their sum,
difference, product, maximum or minimum, plus a constant), with three test cases in verl's
`{"inputs", "outputs"}` format, scored by the `code` reward in the sandbox. The shortest right
answer is about 40 bytes, so a tiny model's responses fit in a short response length; with
`reward.format_score` a program that runs but prints the wrong thing earns partial credit.
"""

from __future__ import annotations

import json
import random

from rlctl.rewards.scorers.code import DATA_SOURCE

OPERATIONS = {"sum": lambda a, b: a + b, "difference": lambda a, b: a - b, "product": lambda a, b: a * b,
              "maximum": max, "minimum": min}
OFFSETS = range(20)
CASES = 3
DEFAULT_VAL_FRACTION = 0.1
INSTRUCTION = "Reply with a Python program in a ```python block."


def question(operation: str, offset: int) -> str:
    plus = f" plus {offset}" if offset else ""
    return (f"Read two integers a and b from one line of standard input and print their {operation}{plus}. "
            f"{INSTRUCTION}")


def _cases(rng: random.Random, operation: str, offset: int) -> str:
    pairs = [(rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(CASES)]
    return json.dumps({"inputs": [f"{a} {b}\n" for a, b in pairs],
                       "outputs": [f"{OPERATIONS[operation](a, b) + offset}\n" for a, b in pairs]})


def _row(operation: str, offset: int, truth: str, split: str, index: int) -> dict:
    text = question(operation, offset)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": text}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "question": text, "answer": truth},
    }


def generate(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: every (operation, offset) once, test = val_fraction of them."""
    rng = random.Random(seed)
    problems = [(op, k, _cases(rng, op, k)) for op in OPERATIONS for k in OFFSETS]
    rng.shuffle(problems)
    n_test = round(len(problems) * val_fraction)
    splits = {"train": problems[n_test:], "test": problems[:n_test]}
    return {split: [_row(op, k, truth, split, i) for i, (op, k, truth) in enumerate(chosen)]
            for split, chosen in splits.items() if chosen}
