"""The task the four framework agents share: an arith row's sum, worked out with a calculator tool.

Each agent (one folder per framework) is a `rollout.agent.command`: rlctl starts it once per episode
with OPENAI_BASE_URL / OPENAI_API_KEY in its environment and the row (`rlctl data prep arith`) as one
JSON line on stdin, and reads the reward from the last line it prints. The reward is the final
answer's correctness against the row's ground truth (1.0 when its last integer is the sum, else 0.0);
`called` (logged as agent/called) says whether the agent's calculator ran with a well-formed expression.

The frameworks' own packages live in their own virtual environment (`.venv-agents`, beside rlctl's),
so this module uses the standard library only.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys

MODEL = "policy"   # any name: the endpoint serves the policy being trained under every model name
INSTRUCTIONS = "Use the calculator tool to compute the answer, then reply with the number only."
MAX_TURNS = 4      # model calls an episode may make: bounded so a looping model cannot outgrow its context
MAX_TOKENS = 48    # per call: a tool call or a short answer

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}
_INTEGER = re.compile(r"-?\d+")
calls: list[str] = []   # expressions the calculator evaluated in this episode (one episode per process)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12+7 or 3*(4-1).

    Args:
        expression: the expression to evaluate, with + - * / and parentheses.
    """
    try:
        value = _evaluate(ast.parse(str(expression).strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as e:
        # an error the model can read and act on, as a tool result: every framework passes it back the same way
        return f"error: {type(e).__name__}: {e}"
    calls.append(str(expression))
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if abs(node.value) > 1e12:
            raise ValueError("number too large")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def read_row() -> dict:
    """The episode's row (parquet columns as JSON) from stdin."""
    return json.loads(sys.stdin.readline())


def question(row: dict) -> str:
    """The user's question: the prompt's last user message."""
    return [m for m in row["prompt"] if m["role"] == "user"][-1]["content"]


def score(answer, row: dict) -> float:
    """1.0 when the answer's last integer is the row's ground truth, else 0.0."""
    numbers = _INTEGER.findall(str(answer if answer is not None else "").replace(",", ""))
    return float(bool(numbers) and numbers[-1] == str(row["reward_model"]["ground_truth"]).strip())


def report(reward: float) -> None:
    """The reward line rlctl reads (the last line printed), with the calculator's use beside it."""
    print(json.dumps({"reward": reward, "called": float(bool(calls))}), flush=True)
