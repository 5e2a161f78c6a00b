"""NuminaMath sources, scored as verl's PRIME math grader (`prime_math`) scores them.

verl's `default_compute_score` sends the six `numina_*` data sources of PRIME's Eurus-2 RL data here.
The answer is read loosely from the whole response (`match_answer`): the text after the last
"answer:" / "answer is", before "is the answer", the last `\\boxed{...}`, then after the last "is ",
"=", ": " and the like. It is right when any stage holds:

  1. `grade_answer` (PRM800K's grader): equal after the Hendrycks MATH normalisation; or equal after
     PRM800K's own (units, `\\text{}`, `$`, `%`, "million", mixed numbers, LaTeX to text through
     pylatexenc); or, element by element for tuples and intervals, sympy simplifies the difference
     to 0 (unreduced fractions must match as written; an integer answer must be an integer);
  2. `math_equal` (ToRA's grader, rlctl.tasks.math_grader): numerically within 1e-4, percentages,
     `\\pi` (also as 3.14), intervals, tuples, points and matrices.

The score is 1.0 or 0.0 (verl returns the bool); `acc` is the same. Grading that takes more than
GRADE_BUDGET_S (sympy on a long expression) is wrong, as verl's 10 s sympy limit makes it, but
within rlctl's default reward.timeout_s, so a slow sample never stops the run.
"""

from __future__ import annotations

import math
import re
import signal
import threading

from rlctl.tasks import math as hendrycks
from rlctl.tasks.math_grader import math_equal

DATA_SOURCES = ("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                "numina_cn_k12", "numina_olympiads")
GRADE_BUDGET_S = 5.0   # grading past this is wrong (verl: 10 s per sympy comparison); inside reward.timeout_s
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard", "liter")
_UNIT_RES = tuple(re.compile(f"{unit}(es)?(s)? *(\\^[0-9]+)?") for unit in _UNITS)
_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_COMMAS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_FRAC = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_BAD_EVAL = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_TUPLE_CHARS = "()[]"


def _boxed_content(text: str) -> str | None:
    """The stripped content of the last `\\boxed`/`\\fbox`'s first brace pair; None without one."""
    start = text.rfind("\\boxed")
    start = text.rfind("\\fbox") if start < 0 else start
    if start < 0:
        return None
    depth, left = 0, None
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
            left = i if left is None else left
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return None if left is None else text[left + 1:i].strip()
    return None


def match_answer(response: str) -> tuple[bool, str]:
    """(an answer was found, the answer text), read as verl's PRIME grader reads it."""
    matched = False
    for marker in ("answer:", "answer is", "answers are"):
        at = response.lower().rfind(marker)
        if at != -1:
            matched, response = True, response[at + len(marker):].strip()
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        at = response.lower().rfind(marker)
        if at != -1:
            matched, response = True, response[:at].strip()
    boxed = _boxed_content(response)
    if boxed:
        matched, response = True, boxed
    if ". " in response:
        response = response[:response.lower().rfind(". ")].strip()
    for marker in ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n"):
        at = response.lower().rfind(marker)
        if at != -1:
            matched, response = True, response[at + len(marker):].strip()
    return matched and any(c.isdigit() for c in response), response


def mathd_normalize(answer: str) -> str:
    """PRM800K's `normalize_answer`: an enclosing `\\text{}` dropped, then the Hendrycks normalisation."""
    answer = answer.strip()
    match = _TEXT.search(answer)
    if match is not None:
        answer = match.group("text").strip()
    try:
        return hendrycks.normalize(answer)
    except (ValueError, IndexError):
        return answer


def _strip_thousands(expr: str) -> str:
    """`1,234,567` -> `1234567`, leaving tuple commas (`(1,2)`) alone."""
    while True:
        shorter = _COMMAS.sub(r"\1\3\4", expr)
        if shorter == expr:
            return expr
        expr = shorter


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


def _is_int(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (ValueError, OverflowError):   # nan, inf
        return False


def _str_is_int(text: str) -> bool:
    value = _float_or_none(_strip_thousands(text))
    return value is not None and _is_int(value)


def latex_to_text(expr: str) -> str:
    """LaTeX -> plain text sympy can read (pylatexenc), `√` -> sqrt, `π` -> pi, `×` -> *."""
    import logging

    from pylatexenc import latex2text

    logging.getLogger("pylatexenc").setLevel(logging.ERROR)   # it warns per malformed macro: one per sample
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, word in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(symbol, word)
    return expr.strip()


def prm800k_normalize(expr: str) -> str:
    """PRM800K's `_normalize` of an answer (see the module docstring)."""
    match = _TEXT.search(expr)
    if match is not None:
        expr = match.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNIT_RES:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(",\\\\! *", "", expr)
    value = _float_or_none(expr)
    if value is not None and _is_int(value):
        expr = str(int(round(value)))
    if "\\" in expr:
        try:
            expr = latex_to_text(expr)
        except Exception:   # pylatexenc on malformed LaTeX: keep the text as it is (verl does the same)
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)   # a mixed number: 7 3/4 -> 7+3/4
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


class _OverBudget(BaseException):
    """Grading ran out of time; a BaseException, so the graders' `except Exception` cannot swallow it."""


def _time_limited(fn, seconds: float):
    """fn() under a SIGALRM limit when this is the main thread (reward workers are); raises _OverBudget."""
    if threading.current_thread() is not threading.main_thread():
        return fn()   # no alarm off the main thread: reward.timeout_s still bounds the whole sample

    def expire(signum, frame):
        raise _OverBudget()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _may_eval(expr: str) -> bool:
    """Only expressions in at most two unknowns, without `^{` / `^(` or long powers, go to sympy."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return all(bad.search(expr) is None for bad in _BAD_EVAL)


def equal_under_sympy(ground_truth: str, given: str) -> bool:
    """sympy simplifies `(ground_truth) - (given)` to 0 (implicit multiplication allowed); False on
    any parse error."""
    expr = f"({ground_truth})-({given})"
    if not _may_eval(expr):
        return False

    def simplify_to_zero() -> bool:
        import sympy
        from sympy.parsing import sympy_parser

        transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
        return sympy.simplify(sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)) == 0

    try:
        return bool(simplify_to_zero())
    except Exception:   # sympy raises many kinds on text it cannot settle: not equal
        return False


def split_tuple(expr: str) -> list[str]:
    """`(1, 2]` -> ["1", "2"]; anything else is one element (thousands commas are not separators)."""
    expr = _strip_thousands(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS and not any(
            ch in inner for ch in _TUPLE_CHARS):
        return [elem.strip() for elem in inner.split(",")]
    return [expr]


def grade_answer(given: str | None, ground_truth: str) -> bool:
    """PRM800K's grader: the Hendrycks forms match, PRM800K's forms match, or sympy agrees element-wise."""
    if given is None:
        return False
    if mathd_normalize(ground_truth) == mathd_normalize(given):
        return True
    truth, answer = prm800k_normalize(ground_truth), prm800k_normalize(given)
    if truth == answer:
        return True
    if not answer:
        return False
    truth_elems, answer_elems = split_tuple(truth), split_tuple(answer)
    if len(truth_elems) != len(answer_elems):
        return False
    if len(truth_elems) > 1 and (truth[0] != answer[0] or truth[-1] != answer[-1]):
        return False   # (a, b) is not [a, b]
    for t, a in zip(truth_elems, answer_elems):
        if _FRAC.search(t) and _FRAC.search(a):
            right = t == a   # an unreduced fraction is not the reduced one
        elif _str_is_int(t) != _str_is_int(a):
            right = False
        else:
            right = equal_under_sympy(t, a)
        if not right:
            return False
    return True


def is_correct(solution_str: str, ground_truth: str) -> bool:
    _, answer = match_answer(str(solution_str))
    ground_truth = str(ground_truth)
    if grade_answer(answer, ground_truth):
        return True
    try:
        pis = (math.pi, 3.14) if "\\pi" in answer or "\\pi" in ground_truth else (math.pi,)
        return any([math_equal(answer, ground_truth, pi=pi) for pi in pis])
    except Exception:   # verl: any error in the second grader means wrong
        return False


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> dict:
    """verl's `prime_math` reward: 1.0 when the loosely read answer equals the ground truth, else 0.0."""
    try:
        right = float(_time_limited(lambda: is_correct(solution_str, ground_truth), GRADE_BUDGET_S))
    except _OverBudget:
        right = 0.0
    return {"score": right, "acc": right}


REWARDS = {"prime_math": compute_score}
PREP = ()   # NuminaMath rows come as verl's PRIME data ships them (rlctl data prep parquet --source FILE)
