"""MATH (competition math): prepared as verl does, scored as verl's `math` reward scores it.

Prep follows verl's MATH preprocessing: the problem plus INSTRUCTION, the ground truth the last
`\\boxed{}` of the reference solution, data_source "DigitalLearningGmbH/MATH-lighteval";
`math-500` (HuggingFaceH4/MATH-500, the 500-problem test subset) is prepared the same way.

The reward is verl's `math_reward` (what `default_compute_score` uses for these three sources): the
answer in the response's last `\\boxed{...}` and the ground truth, compared after the Hendrycks MATH
normalisation, so `\\dfrac12`, `\\frac{1}{2}`, `1/2` and `0.5` compare equal and `\\text{ cm}`
units, `\\$`, `\\%`, `^\\circ`, `\\left`/`\\right` and spaces are dropped. No symbolic algebra: equal
strings after normalisation or it is wrong (the PRIME grader, rlctl.tasks.prime_math, adds sympy).
"""

from __future__ import annotations

import re

from rlctl.data.sources import FileSource, PrepSource, RowError

DATA_SOURCES = ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "HuggingFaceH4/MATH-500")
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
FINAL_ANSWER_FORMAT = "within \\boxed{}"   # `--tools`: the tool-use system message asks for this
_INT = re.compile(r"[-+]?\d+")


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; braced forms are kept.

    A `\\frac` with nothing after it raises IndexError, as in the Hendrycks code (the caller then
    falls back to comparing the raw strings); one character after it leaves the string as it was.
    """
    head, *parts = s.split("\\frac")
    out = [head]
    for part in parts:
        out.append("\\frac")
        if part[0] == "{":
            out.append(part)
        elif len(part) < 2:
            return s
        elif part[1] == "{":
            out.append("{" + part[0] + "}" + part[1:])
        else:
            out.append("{" + part[0] + "}{" + part[1] + "}" + part[2:])
    return "".join(out)


def _fix_slash(s: str) -> str:
    """`3/4` (two integers written plainly: no sign, no leading zero) -> `\\frac{3}{4}`."""
    a, sep, b = s.partition("/")
    if sep and "/" not in b and _INT.fullmatch(a) and _INT.fullmatch(b) and f"{int(a)}/{int(b)}" == s:
        return "\\frac{" + a + "}{" + b + "}"
    return s


def _fix_sqrt(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}`: the one character after a bare `\\sqrt` becomes its argument
    (IndexError for a trailing `\\sqrt`, as in the Hendrycks code)."""
    head, *parts = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]) for part in parts)


def normalize(answer: str) -> str:
    """Canonical string form of a MATH answer, the Hendrycks MATH `strip_string` that verl's `math`
    reward (and the first stage of its PRIME grader) uses; see the module docstring.

    Raises ValueError for a `\\text{ ` that appears twice and IndexError for a bare trailing
    `\\frac` / `\\sqrt`: callers compare the raw strings then, as verl does.
    """
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # trailing units: "5 \text{ cm}"
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one \\text{ unit")
        s = parts[0]
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:  # "x = 5" -> "5"
        s = parts[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def is_equiv(prediction: str, ground_truth: str) -> bool:
    """verl's `math_reward.is_equiv`: equal after `normalize`, or equal as written when it fails."""
    try:
        return normalize(prediction) == normalize(ground_truth)
    except (ValueError, IndexError):
        return prediction == ground_truth


def verl_boxed(text: str) -> str | None:
    """The answer verl's `math` reward reads: after a `\\boxed ` (space form) anywhere, the text up
    to the next `$`; else the last `\\boxed{...}` with nested braces. None when there is none, its
    braces never close, or the last box is `\\fbox{}` (verl extracts it but cannot unwrap it)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    end = closing_brace(text, start) if start >= 0 else None
    if end is None or not text.startswith("\\boxed{", start):
        return None
    return text[start + len("\\boxed{"):end]


def closing_brace(text: str, start: int) -> int | None:
    """The index of the `}` at which the braces counted from `start` on first balance (the one that
    closes the first `{` after it); None when they never do."""
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if text[i] == "}" and depth == 0:
            return i
    return None


def score(solution_str: str, ground_truth: str, *, format_score: float = 0.0) -> dict:
    """1.0 for an equivalent boxed answer, `format_score` for a wrong boxed one, 0 without a box."""
    predicted = verl_boxed(solution_str)
    correct = predicted is not None and is_equiv(predicted, str(ground_truth))
    value = 1.0 if correct else (float(format_score) if predicted is not None else 0.0)
    return {"score": value, "acc": float(correct)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """verl's `math` reward: the last `\\boxed{}` answer, equal to the ground truth after MATH normalisation."""
    return score(solution_str, ground_truth, format_score=format_score)


def compute_score_math_verify(data_source, solution_str, ground_truth, extra_info=None, **_) -> dict:
    """verl's optional MATH grader (`reward.function = "math_verify"`, extra rlctl[math]): Hugging Face's
    Math-Verify parses the ground truth as `\\boxed{truth}` and the response as expressions and LaTeX,
    and checks them symbolically; 1.0 when any answer it reads matches, else 0.0 (also on its timeouts)."""
    try:
        from math_verify.grader import verify
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse
    except ImportError:
        raise RuntimeError('reward.function = "math_verify" needs Math-Verify: pip install "rlctl[math]"') from None
    try:
        gold = parse("\\boxed{" + str(ground_truth) + "}", (LatexExtractionConfig(),))
        answers = parse(solution_str, (ExprExtractionConfig(), LatexExtractionConfig()))
        right = bool(gold and answers and any(verify(g, a) for a in answers for g in gold))
    except Exception:   # Math-Verify's own timeouts and parse failures: wrong, as in verl
        right = False
    return {"score": float(right), "acc": float(right)}


def _ground_truth(solution: str) -> str:
    truth = verl_boxed(solution)
    if truth is None:
        raise RowError("no \\boxed answer", "solution has no complete \\boxed{...} answer")
    if not truth.strip():
        raise RowError("no \\boxed answer", "the solution's \\boxed{} is empty")
    return truth.strip()


REWARDS = {"math": compute_score, "math_verify": compute_score_math_verify}
PREP = (PrepSource("math", FileSource("math", DATA_SOURCES[0], "math", "problem", "solution", _ground_truth,
                                      INSTRUCTION, hub_id="DigitalLearningGmbH/MATH-lighteval",
                                      hub_patterns=("data/*.parquet",)),
                   final_answer_format=FINAL_ANSWER_FORMAT),
        PrepSource("math-500", FileSource("math-500", DATA_SOURCES[2], "math", "problem", "solution", _ground_truth,
                                          INSTRUCTION, hub_id="HuggingFaceH4/MATH-500", hub_patterns=("test.jsonl",)),
                   help="the 500 MATH test problems of Let's Verify Step by Step (HuggingFaceH4/MATH-500's "
                        "test.jsonl), for validation"))
