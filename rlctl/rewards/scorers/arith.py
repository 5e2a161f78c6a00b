"""The synthetic `arith` task's reward: shaped so that even a tiny random model gets a signal.

A random byte-level model almost never writes the exact sum, so a 0/1 reward would give GRPO
nothing to learn from. Partial credit rewards the answer's *form* first (digits only, short),
then how close the number is, so the mean reward climbs within minutes of CPU RL.

    s = response.strip(); t = ground_truth.strip(); n = len(s)
    exact  (s == t)                        -> 1.0
    otherwise  0.2 * digits + 0.2 * brevity + 0.4 * closeness        (below 1.0)
      digits    = share of the n characters that are ASCII digits (0 when n = 0)
      brevity   = min(1, (len(t) + 1) / n)  (0 when n = 0): long rambling scores less
      closeness = 1 / (1 + |int(s) - int(t)|) when s is an integer (optional minus), else 0
    A wrong number scores at most 0.6; only a zero-padded right one ("07") reaches 0.8.

`score_exact` is the 0/1 reward for a model that already answers in form (after SFT): 1.0 for
the exact sum, 0.0 otherwise, so GRPO's advantages come from right vs wrong and nothing else.
"""

from __future__ import annotations

import re

DATA_SOURCE = "rlctl/arith"
_INTEGER = re.compile(r"-?\d{1,18}")


def components(solution_str: str, ground_truth: str) -> dict:
    """The three partial-credit terms, each in [0, 1] (see the module docstring)."""
    s, t = solution_str.strip(), str(ground_truth).strip()
    n = len(s)
    if n == 0:
        return {"digits": 0.0, "brevity": 0.0, "closeness": 0.0}
    digits = sum(ch in "0123456789" for ch in s) / n
    brevity = min(1.0, (len(t) + 1) / n)
    closeness = 0.0
    if _INTEGER.fullmatch(s) and _INTEGER.fullmatch(t):
        closeness = 1.0 / (1.0 + abs(int(s) - int(t)))
    return {"digits": digits, "brevity": brevity, "closeness": closeness}


def score(solution_str: str, ground_truth: str) -> dict:
    """`score` in [0, 1] plus `acc` (exact) and the partial-credit terms as extra metrics."""
    parts = components(solution_str, ground_truth)
    exact = solution_str.strip() == str(ground_truth).strip()
    value = 1.0 if exact else 0.2 * parts["digits"] + 0.2 * parts["brevity"] + 0.4 * parts["closeness"]
    return {"score": value, "acc": float(exact), **parts}


def score_exact(solution_str: str, ground_truth: str) -> dict:
    """1.0 when the stripped response is the sum, else 0.0 (`acc` is the same number)."""
    exact = float(solution_str.strip() == str(ground_truth).strip())
    return {"score": exact, "acc": exact}
