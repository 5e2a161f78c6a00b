"""The numeric and structural stage of verl's PRIME math grader (ToRA's `math_equal`), for rlctl.tasks.prime_math.

`math_equal(prediction, reference)` holds when, in this order:
  - the strings match (case and spaces aside), after `$5` -> `5`, `50%` -> `50`, `12_3` (a base) -> 12
    and `2\\pi` -> its value;
  - both read as numbers and the prediction is within 1e-4 (relative) of the reference, or of the
    reference / 100 or * 100 (a percentage written either way);
  - brackets and braces aside they match, or they are intervals / tuples / comma lists whose parts
    match one by one, or a `Point(...)` / `Matrix(...)` / nested list whose entries match a tuple or
    `\\begin{pmatrix}` reference.

verl's last stage (sympy `simplify` of the difference) never holds in verl 0.9.1: its time limits
are decorators used as `with` blocks, which raise before anything is parsed. It is left out here,
so the scores stay verl's. Where verl calls `eval` on model text (a `\\pi` expression, a nested
list), this module evaluates plain arithmetic and literals only: same values, no code run.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from math import isclose

_DOLLAR_NUMBER = re.compile(r"\$\d+(\.\d+)?")
_PERCENT = (re.compile(r"^\d+(\.\d+)?%$"), re.compile(r"^\d+(\.\d+)?\\%$"))
_INTERVALS = ((re.compile(r"^Interval\((.*)\)$"), "[{}]"), (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[{})"),
              (re.compile(r"^Interval\.Lopen\((.*)\)$"), "({}]"), (re.compile(r"^Interval\.open\((.*)\)$"), "({})"))
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_CHARS = 1000
MAX_EXPONENT = 1000


def safe_eval(text: str):
    """The value of plain arithmetic or a (nested) list / tuple of it; ValueError for anything else."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:   # 9**9**9 would never finish
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [value(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:60]}")

    try:
        return value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, TypeError, ZeroDivisionError, OverflowError, RecursionError, MemoryError) as e:
        raise ValueError(str(e)) from None


def is_number(s) -> tuple[bool, float | None]:
    """(reads as a number, its value): `1,234` and `1{,}234` are 1234."""
    text = str(s)
    try:
        return True, float(text.replace("{,}", "") if "{,}" in text else text.replace(",", ""))
    except ValueError:
        return False, None


def _with_pi(text: str, pi: float):
    """`2\\pi` -> 2*pi, `\\pi/2` -> 1*pi/2, then the value if what is left is plain arithmetic."""
    idx = text.find("\\pi")
    while idx != -1:
        factor = f"*{pi}" if idx > 0 and text[idx - 1].isdigit() else f"1*{pi}"
        text = text[:idx] + factor + text[idx + 3:]
        idx = text.find("\\pi", idx + 1)
    try:
        return safe_eval(text)
    except ValueError:
        return text


def normalize(answer, pi: float):
    """`$5` -> `5`, `50%` -> `50`, `1011_2` -> 1011 (the digits before a base subscript), `\\pi` -> its value.

    A subscript whose head is no number raises ValueError, as in verl (the answer is then wrong)."""
    if not isinstance(answer, str):
        return answer
    if _DOLLAR_NUMBER.match(answer):
        return answer[1:]
    if any(p.match(answer) for p in _PERCENT):
        return answer.replace("\\%", "").replace("%", "")
    if "_" in answer:
        return int(float(answer.split("_")[0]))
    return _with_pi(answer, pi) if "\\pi" in answer else answer


def format_intervals(prediction: str) -> str:
    """sympy's printed intervals as brackets: `Interval.Ropen(a, b)` -> `[a, b)`."""
    for pattern, form in _INTERVALS:
        match = pattern.match(prediction)
        if match:
            return form.format(match.group(1))
    return prediction


def _numbers_equal(prediction, reference, include_percentage: bool, tolerance: float) -> bool | None:
    """Both numbers: whether they agree (None when either is not a number)."""
    ok_p, p = is_number(prediction)
    ok_r, r = is_number(reference)
    if not (ok_p and ok_r):
        return None
    candidates = (r / 100, r, r * 100) if include_percentage else (r,)
    return any(isclose(c, p, rel_tol=tolerance) for c in candidates)


def math_equal(prediction, reference, include_percentage: bool = True, tolerance: float = 1e-4,
               pi: float = math.pi) -> bool:
    """Whether `prediction` equals `reference` (see the module docstring for the stages)."""
    prediction, reference = normalize(prediction, pi), normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > MAX_CHARS:
        prediction = prediction[:MAX_CHARS]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    numbers = _numbers_equal(prediction, reference, include_percentage, tolerance)
    if numbers is not None:
        return numbers
    if not prediction and prediction not in (0, False):
        return False
    return _structures_equal(format_intervals(str(prediction).strip()), str(reference).strip(), include_percentage,
                             tolerance)


def _parts_equal(pred_parts, ref_parts, include_percentage, tolerance) -> bool:
    return len(pred_parts) == len(ref_parts) and all(
        math_equal(p, r, include_percentage, tolerance) for p, r in zip(pred_parts, ref_parts))


def _structures_equal(prediction: str, reference: str, include_percentage: bool, tolerance: float) -> bool:
    pred_str, ref_str = prediction, reference
    if ((prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("("))
            or (prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("["))):
        pred_str, ref_str = pred_str.strip("[]()"), ref_str.strip("[]()")
    for ch in "{}()":
        pred_str, ref_str = pred_str.replace(ch, ""), ref_str.replace(ch, "")
    if pred_str == ref_str:
        return True
    if (prediction and reference and prediction[0] in "([" and prediction[-1] in ")]"
            and prediction[0] == reference[0] and prediction[-1] == reference[-1]
            and _parts_equal(prediction[1:-1].split(","), reference[1:-1].split(","), include_percentage, tolerance)):
        return True
    if "," in prediction and "," in reference:
        pred_parts = [p.strip() for p in prediction.split(",")]
        ref_parts = [r.strip() for r in reference.split(",")]
        if len(pred_parts) == len(ref_parts):
            return _parts_equal(pred_parts, ref_parts, include_percentage, tolerance)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":   # "" raises, as in verl
        pred_parts = prediction[prediction.find("(") + 1:-1].split(",")
        if _parts_equal(pred_parts, reference[1:-1].split(","), include_percentage, tolerance):
            return True
    if r"\begin{pmatrix}" in reference:
        return _matrix_equal(prediction, reference, include_percentage, tolerance)
    return False


def _matrix_equal(prediction: str, reference: str, include_percentage: bool, tolerance: float) -> bool:
    """A `Matrix([...])` or nested-list prediction against a `\\begin{pmatrix} a \\\\ b \\end{pmatrix}` reference."""
    if prediction.startswith("Matrix"):
        try:
            from sympy.parsing.sympy_parser import parse_expr

            entries = list(parse_expr(prediction)) if _parse_is_safe(prediction) else None
        except Exception:   # sympy raises many kinds on text it cannot read
            return False
        if entries is None:
            return False
        refs = reference.split()[1:-1:2]
        return len(entries) == len(refs) and all(math_equal(p, r, include_percentage, tolerance)
                                                 for r, p in zip(refs, entries))
    if not (prediction.startswith("[") and prediction.endswith("]")):
        return False
    rows = safe_eval(prediction)   # not a literal: ValueError, the answer is wrong (verl: eval raises)
    if not isinstance(rows, list):
        return False
    body = (reference.removeprefix(r"\\begin{pmatrix}").removeprefix(r"\begin{pmatrix}")
            .removesuffix(r"\\end{pmatrix}").removesuffix(r"\end{pmatrix}"))
    refs = [row.split("&") if "&" in row else row for row in body.split("\\")]
    return len(rows) == len(refs) and all(math_equal(p, r, include_percentage, tolerance) for r, p in zip(refs, rows))


def _parse_is_safe(text: str) -> bool:
    """sympy's parse_expr runs Python: refuse text that could reach past arithmetic (no math answer has these)."""
    return not any(bad in text for bad in ("__", "'", '"', "lambda", "import", ";", "\n"))
