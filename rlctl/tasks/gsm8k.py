"""GSM8K: grade-school word problems, prepared and scored as verl does, so scores stay comparable.

Prep follows verl's `examples/data_preprocess/gsm8k.py`: the question plus INSTRUCTION, the ground
truth the number after the first `#### ` of the worked answer, data_source "openai/gsm8k".

The reward is verl's strict one: only the last 300 characters are searched (the answer comes last;
long regex scans are slow), the last `#### <number>` wins, and commas and dollar signs are removed
before an exact string comparison with the ground truth.
"""

from __future__ import annotations

import re

from rlctl.data.sources import FileSource, PrepSource, RowError

DATA_SOURCES = ("openai/gsm8k",)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# `--tools`: the tool-use system message asks for the answer in the form `score` reads
FINAL_ANSWER_FORMAT = "as `#### <number>`, e.g. `#### 42`"
CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def answer_lines(solution_str: str) -> list[str]:
    """The numbers written after `#### ` anywhere in the text, in order, as written."""
    return _STRICT.findall(solution_str)


def extract_answer(solution_str: str) -> str | None:
    """The number after the last `#### ` in the response's tail, or None."""
    found = answer_lines(solution_str[-CLIP_CHARS:])
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


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """verl's strict GSM8K reward: the number after the last `#### `, exact match."""
    return score(solution_str, ground_truth, format_score=format_score)


def _ground_truth(answer: str) -> str:
    truth = ground_truth_from_solution(answer)
    if truth is None:
        raise RowError("no #### answer", "answer has no '#### <number>' line")
    return truth


REWARDS = {"gsm8k": compute_score}
PREP = (PrepSource("gsm8k", FileSource("gsm8k", DATA_SOURCES[0], "math", "question", "answer", _ground_truth,
                                       INSTRUCTION, hub_id="openai/gsm8k", hub_patterns=("main/*.parquet",)),
                   final_answer_format=FINAL_ANSWER_FORMAT),)
