"""Built-in tools: plain typed Python functions whose docstrings become their OpenAI schemas.

`BUILTINS` maps each name `[rollout.multi_turn] tools` may use to a factory of its function; the
loader (rlctl.multiturn.tools.make_tool) and `rlctl config validate` read it, and a test keeps it
equal to rlctl.config.schema.BUILTIN_TOOLS. Each docstring is in the Google style that `transformers.utils.get_json_schema` reads (a summary,
then `Args:` with one line per parameter), so the schema rendered into a prompt by the chat
template (`tools=[calculator]`) is derived from the function itself, at training and at data prep.
"""

from __future__ import annotations

import ast
import operator
from typing import Callable

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64          # 10**64 is plenty for a calculator; 9**9**9 would hang the process
MAX_RESULT_DIGITS = 100    # refuse integer results with more digits than this
_MAX_RESULT_BITS = int(MAX_RESULT_DIGITS * 3.3220) + 1  # log2(10) bits per digit

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Refused(ValueError):
    """An expression the calculator will not evaluate; the message is the tool's answer."""


def calculator(expression: str) -> str:
    """Evaluate arithmetic: numbers, + - * / // % ** and parentheses.

    Args:
        expression: e.g. "4821 * 37"
    """
    if not isinstance(expression, str):
        return f"error: expression must be a string, got {type(expression).__name__}"
    text = expression.strip().replace(",", "")  # "1,234 + 5" is a number with a thousands separator
    if not text:
        return "error: empty expression"
    if len(text) > MAX_EXPRESSION_CHARS:
        return f"error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return f"error: not an arithmetic expression: {expression[:80]!r}"
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        return "error: division by zero"
    except _Refused as e:
        return f"error: {e}"
    except (OverflowError, ValueError) as e:  # e.g. float overflow, int too large to convert to str
        return f"error: {e}"
    return _format(value)


def _evaluate(node: ast.AST) -> int | float:
    """Walk the parsed expression: only numbers and the arithmetic operators above; no names, no calls."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise _Refused(f"exponent {right} is larger than {MAX_EXPONENT}")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):  # (-8) ** 0.5
            raise _Refused("the result is not a real number")
        if isinstance(value, int) and value.bit_length() > _MAX_RESULT_BITS:
            raise _Refused(f"the result has more than {MAX_RESULT_DIGITS} digits")
        return value
    what = type(node).__name__ if not isinstance(node, ast.Constant) else repr(node.value)
    raise _Refused(f"only numbers and + - * / // % ** ( ) are allowed, found {what}")


def _format(value: int | float) -> str:
    """Integers as digits; whole floats without '.0' (6 / 3 = 2); others to 12 significant digits."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "error: the result is not a finite number"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)



def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed.

    Args:
        code: A complete Python program; print the values you need (stdout is returned).
    """
    from rlctl.sandbox import Limits, run

    result = run(code, limits=Limits(wall_s=5.0, cpu_s=5.0, memory_mb=512))
    out = result.stdout
    if not result.ok:
        tail = result.stderr.strip().splitlines()[-3:]
        out += f"\n{result.status}" + (": " + " | ".join(tail) if tail else "")
    return out.strip() or "(no output)"


# name -> factory of the tool's function (FunctionTool derives its schema from it)
BUILTINS: dict[str, Callable[[], Callable]] = {"calculator": lambda: calculator, "python": lambda: python}
