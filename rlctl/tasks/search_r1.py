"""Search-R1's question answering sources, scored as verl's `search_r1_like_qa_em` reward scores them.

verl's `default_compute_score` sends the seven `searchR1_*` data sources (NQ, TriviaQA, PopQA,
HotpotQA, 2WikiMultiHopQA, MuSiQue, Bamboogle) here. The answer is the last `<answer>...</answer>`
of the response; it is right when, lower-cased with punctuation, articles (a, an, the) and extra
spaces removed, it equals one of the golden answers normalised the same way (SQuAD's exact match).
Right is 1.0, but only 0.25 when the response holds more than 10 `<answer>` or `</answer>` tags (a
policy must not win by listing answers); a wrong answer is `format_score` (0 by default, as in
verl) and no answer 0.

The ground truth is verl's `{"target": [answers]}` (a struct column in verl's parquet, passed on as
the dict it is): a dict, its JSON text, a list of answers or one answer as text all work.
"""

from __future__ import annotations

import ast
import json
import re
import string

DATA_SOURCES = ("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle")
MAX_TAGS = 10
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def golden_answers(ground_truth) -> list[str]:
    """verl's `{"target": [...]}` (or its JSON text, a list, or one answer) -> the answers."""
    if isinstance(ground_truth, str):
        ground_truth = _parsed(ground_truth)
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("target", [])
    if isinstance(ground_truth, str):
        return [ground_truth]
    return [str(answer) for answer in ground_truth]


def _parsed(text: str):
    """JSON text (or the Python repr a struct became) -> the dict / list; anything else stays text."""
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, (dict, list)):
            return value
    return text


def extract_answer(solution_str: str) -> str | None:
    """The stripped text of the last `<answer>...</answer>`, or None."""
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def exact_match(prediction: str, answers: list[str]) -> bool:
    wanted = normalize_answer(prediction)
    return any(normalize_answer(answer) == wanted for answer in answers)


def score(solution_str: str, ground_truth, *, format_score: float = 0.0) -> dict:
    answer = extract_answer(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": 0.0}
    if not exact_match(answer, golden_answers(ground_truth)):
        return {"score": float(format_score), "acc": 0.0}
    flooded = solution_str.count("<answer>") > MAX_TAGS or solution_str.count("</answer>") > MAX_TAGS
    return {"score": 0.25 if flooded else 1.0, "acc": 1.0}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """verl's Search-R1 exact-match reward on the last `<answer>...</answer>`."""
    return score(solution_str, ground_truth, format_score=format_score)


REWARDS = {"search_r1": compute_score}
PREP = ()   # Search-R1 rows come from verl's examples/data_preprocess/preprocess_search_r1_dataset.py
