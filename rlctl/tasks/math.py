"""MATH (competition math): prepared as verl does, scored by the last `\\boxed{...}` answer.

Prep follows verl's MATH preprocessing: the problem plus INSTRUCTION, the ground truth the last
`\\boxed{}` of the reference solution, data_source "DigitalLearningGmbH/MATH-lighteval".

The normalisation follows the Hendrycks MATH convention that verl's `math` reward uses, so
`\\dfrac12`, `\\frac{1}{2}`, `1/2` and `0.5` all compare equal, `\\text{ cm}` units, `$`, `%`,
`^\\circ`, `\\left`/`\\right` and spaces are dropped. No symbolic algebra (no sympy, no
math_verify): equal strings after normalisation or it is wrong.
"""

from __future__ import annotations

import re

from rlctl.data.sources import FileSource, PrepSource, RowError

DATA_SOURCES = ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH")
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
FINAL_ANSWER_FORMAT = "within \\boxed{}"   # `--tools`: the tool-use system message asks for this
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_SQRT_BARE = re.compile(r"\\sqrt(\w)")
_INT = re.compile(r"-?\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`), nested braces kept.

    Returns None when there is no box or its braces never close (a truncated response).
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    rest = rest[len(next(cmd for cmd in _BOX_COMMANDS if rest.startswith(cmd))):]
    if rest.startswith(" "):  # "\boxed 5$": the answer runs to the closing dollar
        bare = rest.strip().split("$")[0].strip()
        return bare or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[1:i]
    return None


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; braced forms are kept."""
    head, *parts = s.split("\\frac")
    out = [head]
    for part in parts:
        out.append("\\frac")
        if not part or part[0] == "{":
            out.append(part)
        elif len(part) < 2:
            return s
        elif part[1] == "{":
            out.append("{" + part[0] + "}" + part[1:])
        else:
            out.append("{" + part[0] + "}{" + part[1] + "}" + part[2:])
    return "".join(out)


def _fix_slash(s: str) -> str:
    """`3/4` (two plain integers) -> `\\frac{3}{4}`."""
    a, sep, b = s.partition("/")
    if sep and _INT.fullmatch(a) and _INT.fullmatch(b):
        return "\\frac{" + a + "}{" + b + "}"
    return s


def normalize(answer: str) -> str:
    """Canonical string form of a MATH answer (see the module docstring for what is dropped)."""
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    if "\\text{ " in s:  # trailing units: "5 \text{ cm}"
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs.strip()) <= 2:  # "x = 5" -> "5"
        s = rhs
    s = _SQRT_BARE.sub(r"\\sqrt{\1}", s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def is_equiv(prediction: str, ground_truth: str) -> bool:
    return prediction.strip() == ground_truth.strip() or normalize(prediction) == normalize(ground_truth)


def score(solution_str: str, ground_truth: str, *, format_score: float = 0.0) -> dict:
    """1.0 for an equivalent boxed answer, `format_score` for a wrong boxed one, 0 without a box."""
    predicted = last_boxed(solution_str)
    correct = predicted is not None and is_equiv(predicted, str(ground_truth))
    value = 1.0 if correct else (float(format_score) if predicted is not None else 0.0)
    return {"score": value, "acc": float(correct)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The last `\\boxed{}` answer, equal to the ground truth after MATH normalisation."""
    return score(solution_str, ground_truth, format_score=format_score)


def _ground_truth(solution: str) -> str:
    truth = last_boxed(solution)
    if truth is None:
        raise RowError("no \\boxed answer", "solution has no complete \\boxed{...} answer")
    if not truth.strip():
        raise RowError("no \\boxed answer", "the solution's \\boxed{} is empty")
    return truth.strip()


REWARDS = {"math": compute_score}
PREP = (PrepSource("math", FileSource("math", DATA_SOURCES[0], "math", "problem", "solution", _ground_truth,
                                      INSTRUCTION, hub_id="DigitalLearningGmbH/MATH-lighteval",
                                      hub_patterns=("data/*.parquet",)),
                   final_answer_format=FINAL_ANSWER_FORMAT),)
