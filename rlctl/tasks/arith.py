"""The synthetic `arith` task: small additions, generated offline and seeded, with a shaped reward.

It exists so the end-to-end demo and the tests have a task that a tiny random model can learn
on CPU in minutes: prompts are short (about 56 tokens for a byte-level tokenizer with a ChatML
template), answers are 1-2 digits. Every (a, b) pair with a, b in 0..MAX_OPERAND appears once;
the test split is a seeded random share of the pairs, so no test prompt is seen in training.

A random byte-level model almost never writes the exact sum, so a 0/1 reward would give GRPO
nothing to learn from. Partial credit rewards the answer's *form* first (digits only, short),
then how close the number is, so the mean reward climbs within minutes of CPU RL.

    s = response.strip(); t = ground_truth.strip(); n = len(s)
    exact  (s == t)                        -> 1.0
    otherwise  0.2 * digits + 0.2 * brevity + 0.4 * closeness        (below 1.0)
      digits    = share of the n characters that are ASCII digits (0 when n = 0)
      brevity   = min(1, (len(t) + 1) / n)  (0 when n = 0): long rambling scores less
      closeness = 1 / (1 + |int(s) - int(t)|) when s is an integer (optional minus), else 0
    A wrong number scores at most 0.6; only a zero-padded right one ("07") reaches 0.8.

`score_exact` is the 0/1 reward for a model that already answers in form (after SFT): 1.0 for
the exact sum, 0.0 otherwise, so GRPO's advantages come from right vs wrong and nothing else.

`score_answer` is for a pretrained instruct model, which knows many sums but not the form: it
answers "7 + 10 = 17" and rarely the digits alone. The exact reward gives such a model no signal
(every sample scores 0); here the right number in another form earns less the longer the text
around it, so within a group the shorter right answer always wins and GRPO walks toward the form:
    exact (s == t)                       -> 1.0
    the last integer in s equals t       -> 0.5 * len(t) / len(s)      ("7 + 10 = 17": 0.09, "17.": 0.33)
    otherwise                            -> 0.0
`number` (the last integer is right, whatever the form) is reported beside `acc` (exact).
"""

from __future__ import annotations

import random
import re

from rlctl.data.sources import Generated, PrepSource, rule_row

DATA_SOURCE = "rlctl/arith"
DATA_SOURCES = (DATA_SOURCE,)
MAX_OPERAND = 19
DEFAULT_VAL_FRACTION = 0.1
_INTEGER = re.compile(r"-?\d{1,18}")


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}? Reply with digits only."


def _row(a: int, b: int, split: str, index: int) -> dict:
    text, truth = question(a, b), str(a + b)
    return rule_row(DATA_SOURCE, [{"role": "user", "content": text}], "arithmetic", truth, split, index,
                    question=text, answer=truth)


def generate(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: all pairs, shuffled by `seed`, test = val_fraction of them."""
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(seed).shuffle(pairs)
    n_test = round(len(pairs) * val_fraction)
    splits = {"train": pairs[n_test:], "test": pairs[:n_test]}
    return {split: [_row(a, b, split, i) for i, (a, b) in enumerate(chosen)]
            for split, chosen in splits.items() if chosen}


def components(solution_str: str, ground_truth: str) -> dict:
    """The three partial-credit terms, each in [0, 1] (see the module docstring)."""
    s, t = solution_str.strip(), str(ground_truth).strip()
    n = len(s)
    if n == 0:
        return {"digits": 0.0, "brevity": 0.0, "closeness": 0.0}
    digits = sum(ch in "0123456789" for ch in s) / n
    brevity = min(1.0, (len(t) + 1) / n)
    closeness = 0.0
    if _INTEGER.fullmatch(s) and _INTEGER.fullmatch(t):
        closeness = 1.0 / (1.0 + abs(int(s) - int(t)))
    return {"digits": digits, "brevity": brevity, "closeness": closeness}


def score(solution_str: str, ground_truth: str) -> dict:
    """`score` in [0, 1] plus `acc` (exact) and the partial-credit terms as extra metrics."""
    parts = components(solution_str, ground_truth)
    exact = solution_str.strip() == str(ground_truth).strip()
    value = 1.0 if exact else 0.2 * parts["digits"] + 0.2 * parts["brevity"] + 0.4 * parts["closeness"]
    return {"score": value, "acc": float(exact), **parts}


def score_exact(solution_str: str, ground_truth: str) -> dict:
    """1.0 when the stripped response is the sum, else 0.0 (`acc` is the same number)."""
    exact = float(solution_str.strip() == str(ground_truth).strip())
    return {"score": exact, "acc": exact}


def score_answer(solution_str: str, ground_truth: str) -> dict:
    """1.0 for the exact sum; 0.5 x len(sum) / len(response) when the response's last integer is the sum."""
    s, t = solution_str.strip(), str(ground_truth).strip()
    numbers = _INTEGER.findall(s)
    number = bool(numbers) and numbers[-1] == t
    value = 1.0 if s == t else 0.5 * len(t) / len(s) if number else 0.0
    return {"score": value, "acc": float(s == t), "number": float(number)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The synthetic task's shaped reward (format_score is unused: the shaping is built in)."""
    return score(solution_str, ground_truth)


def compute_score_exact(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0,
                        **_) -> dict:
    """The synthetic task's exact-match reward: 1.0 for the sum, else 0.0 (format_score unused)."""
    return score_exact(solution_str, ground_truth)


def compute_score_answer(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0,
                         **_) -> dict:
    """The synthetic task's reward for instruct models: 1.0 exact, less for the right number in more text."""
    return score_answer(solution_str, ground_truth)


# arith_exact and arith_answer: by name only (reward.function), the data_source picks `arith`
REWARDS = {"arith": compute_score, "arith_exact": compute_score_exact, "arith_answer": compute_score_answer}
PREP = (PrepSource("arith", Generated(DATA_SOURCE, generate, DEFAULT_VAL_FRACTION),
                   help="the synthetic offline task", aliases=("synthetic",)),)
