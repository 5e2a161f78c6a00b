"""GSM8K: strict `#### <number>` extraction, scored like verl's gsm8k reward.

Scores stay comparable with verl runs: only the last 300 characters are searched (the answer
comes last; long regex scans are slow), the last `#### <number>` wins, and commas and dollar
signs are removed before an exact string comparison with the ground truth.
"""

from __future__ import annotations

import re

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_answer(solution_str: str) -> str | None:
    """The number after the last `#### ` in the response's tail, or None."""
    found = _STRICT.findall(solution_str[-CLIP_CHARS:])
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "")


def ground_truth_from_solution(answer: str) -> str | None:
    """Data prep: the text after the first `#### ` in a GSM8K answer, commas removed (verl)."""
    match = _STRICT.search(answer)
    return None if match is None else match.group(1).replace(",", "")


def score(solution_str: str, ground_truth: str, *, format_score: float = 0.0) -> dict:
    """1.0 for the right number, `format_score` for a `####` answer that is wrong, else 0."""
    answer = extract_answer(solution_str)
    correct = answer is not None and answer == str(ground_truth)
    value = 1.0 if correct else (float(format_score) if answer is not None else 0.0)
    return {"score": value, "acc": float(correct)}
