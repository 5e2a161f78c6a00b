"""DAPO-Math-17k and AIME: prepared as the DAPO recipe ships them, scored as verl's `math_dapo` reward.

verl's `default_compute_score` sends `math_dapo`, `math`, `math_dapo_reasoning` and every
data_source that starts with `aime` here. The reward reads the response's last 300 characters:

  1. Minerva form first: the last `Answer: ...` line (any case), normalised as Minerva (Lewkowycz
     et al., 2022) normalises final answers (the text after the last `=`, units and `\\text{}`
     dropped, `\\frac12` braced, `1,000` -> `1000`), equal to the normalised ground truth;
  2. without an `Answer:` line, the last `\\boxed{...}` in the final 100 characters, equal to the
     ground truth exactly as written (no normalisation: DAPO's strict box);
  3. neither: wrong.

Right is +1.0, wrong (or no answer) is -1.0, as in DAPO; `acc` is 1.0 / 0.0.

Prep (`dapo-math-17k`, `aime24`, `aime25`) writes the rows the DAPO recipe trains and validates on:
the user message is PROMPT_TEMPLATE around the problem, data_source "math_dapo" (AIME:
"aime24" / "aime25", which verl also routes here), ability "MATH". The hub's DAPO-Math-17k file
repeats each problem about 100 times; repeats (same prompt, same answer) are dropped.
"""

from __future__ import annotations

import re

from rlctl.data.sources import FileSource, PrepSource, RowError
from rlctl.tasks.math import closing_brace

DATA_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
DATA_SOURCE_PREFIXES = ("aime",)   # verl: data_source.startswith("aime")
TAIL_CHARS = 300                   # verl: "the longest answer in MATH-500 has 159 characters"
BOX_TAIL_CHARS = 100
INVALID = "[INVALID]"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

PROMPT_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
                 "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
PROMPT_TEMPLATE = PROMPT_PREFIX + "{question}" + PROMPT_SUFFIX

# Minerva's normalisation, in its order: replacements, then words and marks removed outright
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
           "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
           "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
           "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
           ",\\!", "{,}", '"', "\\dots")
_UNWRAP = tuple(re.compile(p) for p in (r"(\\text\{)(.*?)(\})", r"(\\textbf\{)(.*?)(\})",
                                        r"(\\overline\{)(.*?)(\})", r"(\\boxed\{)(.*)(\})"))
_DOLLARS = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")
_FRAC = re.compile(r"(frac)([^{])(.)")
_SQRT = re.compile(r"(sqrt)([^{])")


def normalize_final_answer(answer: str) -> str:
    """Minerva's canonical form of a final answer: `x = \\frac12 \\text{ cm}` -> `\\frac{1}{2}`."""
    s = answer.split("=")[-1]
    for before, after in _REPLACE:
        s = s.replace(before, after)
    for mark in _REMOVE:
        s = s.replace(mark, "")
    s = _DOLLARS.sub(r"$\3$", s)          # keep only what the first pair of dollars holds
    for pattern in _UNWRAP:
        s = pattern.sub(r"\2", s)
    s = _FRAC.sub(r"frac{\2}{\3}", s)
    s = _SQRT.sub(r"sqrt{\2}", s).replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces kept); None without one or unclosed."""
    start = text.rfind("\\boxed{")
    end = closing_brace(text, start) if start >= 0 else None
    return None if end is None else text[start + len("\\boxed{"):end]


def verify(solution_str: str, ground_truth: str, *, strict_box: bool = False) -> tuple[bool, str | None]:
    """(right?, the answer read) for a response already cut to its tail; see the module docstring."""
    if not strict_box:
        lines = _ANSWER_LINE.findall(solution_str)
        pred = normalize_final_answer(lines[-1] if lines else INVALID)
        if pred != INVALID:
            return pred == normalize_final_answer(ground_truth), pred
    boxed = last_boxed(solution_str[-BOX_TAIL_CHARS:])
    if boxed is not None or strict_box:
        return boxed == ground_truth, boxed
    return INVALID == normalize_final_answer(ground_truth), INVALID


def score(solution_str: str, ground_truth: str, *, strict_box: bool = False) -> dict:
    """+1.0 for the right answer, -1.0 otherwise; `acc` 1.0 / 0.0."""
    correct, _ = verify(solution_str[-TAIL_CHARS:], str(ground_truth), strict_box=strict_box)
    return {"score": 1.0 if correct else -1.0, "acc": float(correct)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> dict:
    """verl's `math_dapo` reward (DAPO): an `Answer:` line, else the last `\\boxed{}`; +1 / -1."""
    return score(solution_str, ground_truth)


def compute_score_strict_box(data_source, solution_str, ground_truth, extra_info=None, **_) -> dict:
    """verl's `math_dapo` with `strict_box_verify`: only the last `\\boxed{}` of the final 100 characters."""
    return score(solution_str, ground_truth, strict_box=True)


def dapo_prompt(problem: str) -> str:
    return PROMPT_TEMPLATE.format(question=problem.strip())


def problem_of(prompt: str) -> str:
    """The problem inside a DAPO-template prompt (the prompt itself when it has no template)."""
    text = prompt
    if text.startswith(PROMPT_PREFIX):
        text = text[len(PROMPT_PREFIX):]
    return text[:-len(PROMPT_SUFFIX)] if text.endswith(PROMPT_SUFFIX) else text


def _truth(answer: str) -> str:
    text = answer.strip()
    if not text:
        raise RowError("empty answer", "the ground truth is empty")
    return text


def from_verl_row(record: dict) -> dict:
    """A verl row (the hub's DAPO-Math-17k / AIME-2024 files) -> {problem, answer}: the problem out of
    its last user message's template, the answer its reward_model.ground_truth."""
    prompt, reward_model = record.get("prompt"), record.get("reward_model")
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"] if isinstance(prompt, list) else []
    if not users or not isinstance(users[-1].get("content"), str):
        raise RowError("bad prompt", "'prompt' is not a list of chat messages with a user message")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise RowError("missing ground_truth", "no 'reward_model.ground_truth'")
    return {"problem": problem_of(users[-1]["content"]), "answer": str(reward_model["ground_truth"])}


REWARDS = {"math_dapo": compute_score, "math_dapo_strict_box": compute_score_strict_box}
_NO_SFT = "has final answers only, no worked solutions"


def _source(name: str, data_source: str, hub_id: str, hub_patterns: tuple, split: str, *, verl_rows: bool):
    return FileSource(name, data_source, "MATH", "problem", "answer", _truth, hub_id=hub_id, hub_patterns=hub_patterns,
                      template=PROMPT_TEMPLATE, one_split=split,
                      adapter=from_verl_row if verl_rows else None)


PREP = (
    PrepSource("dapo-math-17k", _source("dapo-math-17k", "math_dapo", "BytedTsinghua-SIA/DAPO-Math-17k",
                                        ("data/*.parquet",), "train", verl_rows=True),
               help="DAPO's 17k integer-answer problems (BytedTsinghua-SIA/DAPO-Math-17k), repeats dropped",
               no_sft=_NO_SFT),
    PrepSource("aime24", _source("aime24", "aime24", "BytedTsinghua-SIA/AIME-2024", ("data/*.parquet",), "test",
                                 verl_rows=True),
               help="the 30 AIME 2024 problems, DAPO's validation set (BytedTsinghua-SIA/AIME-2024)", no_sft=_NO_SFT),
    PrepSource("aime25", _source("aime25", "aime25", "yentinglin/aime_2025", ("*.parquet", "*/*.parquet", "*.jsonl"),
                                 "test", verl_rows=False),
               help="the 30 AIME 2025 problems (yentinglin/aime_2025: problem, answer) in DAPO's template",
               no_sft=_NO_SFT),
)
