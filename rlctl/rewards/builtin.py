"""Built-in rule rewards with verl's signature, chosen by `data_source` or by name.

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict

Every built-in returns a dict: `score` (the reward) and `acc` (1.0 when the answer is right),
plus task-specific metrics. `reward.function = ""` uses `default_compute_score` (dispatch on the
row's data_source); `reward.function = "gsm8k"` (or "math", "arith", "arith_exact", "arith_answer", "code",
"calc-tools") forces one scorer.
The scorers live with their tasks (rlctl/tasks/: gsm8k.py, math.py, ...); this module routes to
them from the task table. The `code` scorer runs the response's program in rlctl.sandbox on
verl's stdin/stdout cases.
Every built-in takes the same keyword options (format_score, sandbox_url); one that has no use
for an option ignores it, so callers pass them all the same way.
"""

from __future__ import annotations

from rlctl.errors import UsageError
from rlctl.tasks import TASKS, code

# reward.function name -> scorer ("gsm8k", "math", "arith", "arith_exact", ...), and the scorer of
# each data_source, from the task table in its order (the order error messages list them in)
BUILTINS = {name: fn for task in TASKS for name, fn in task.REWARDS.items()}
_BY_SOURCE = {source: task.compute_score for task in TASKS for source in task.DATA_SOURCES}
# data_source prefixes a task claims as a family (verl routes every "aime..." source to math_dapo)
_BY_PREFIX = {prefix: task.compute_score for task in TASKS for prefix in getattr(task, "DATA_SOURCE_PREFIXES", ())}
CODE_SOURCES = code.DATA_SOURCES   # rows whose reward runs programs: the runner probes the sandbox for them


def scorer_for_source(data_source: str):
    """The built-in scorer for `data_source`; UsageError naming the source and the fix if none."""
    fn = _BY_SOURCE.get(data_source) or next(
        (f for prefix, f in _BY_PREFIX.items() if str(data_source).startswith(prefix)), None)
    if fn is None:
        known = [*_BY_SOURCE, *(f"{prefix}*" for prefix in _BY_PREFIX)]
        raise UsageError(
            f"no built-in reward for data_source {data_source!r} (built-ins: {', '.join(known)})",
            hint='set reward.function = "reward.py:compute_score" in rlctl.toml to score it with your own '
                 'function, or reward.function = "gsm8k" / "math" to use a built-in.')
    return fn


def resolve_builtin(name: str):
    """`reward.function = "gsm8k"` -> its scorer; UsageError listing the names otherwise."""
    fn = BUILTINS.get(name)
    if fn is None:
        raise UsageError(f"unknown built-in reward {name!r} (built-ins: {', '.join(BUILTINS)})",
                         hint='or point reward.function at your own: "reward.py:compute_score".')
    return fn


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, *,
                          format_score=0.0, sandbox_url="") -> dict:
    """Score one response with the built-in that matches its row's data_source."""
    return scorer_for_source(data_source)(data_source, solution_str, ground_truth, extra_info,
                                          format_score=format_score, sandbox_url=sandbox_url)
