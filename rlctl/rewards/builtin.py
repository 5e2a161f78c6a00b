"""Built-in rule rewards with verl's signature, chosen by `data_source` or by name.

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict

Every built-in returns a dict: `score` (the reward) and `acc` (1.0 when the answer is right),
plus task-specific metrics. `reward.function = ""` uses `default_compute_score` (dispatch on the
row's data_source); `reward.function = "gsm8k"` (or "math", "arith", "arith_exact", "code",
"calc-tools") forces one scorer.
The `code` scorer runs the response's program in rlctl.sandbox on verl's stdin/stdout cases.
Every built-in takes the same keyword options (format_score, sandbox_url); one that has no use
for an option ignores it, so callers pass them all the same way.
"""

from __future__ import annotations

from rlctl.errors import UsageError
from rlctl.rewards.scorers import arith, calc_tools, code, gsm8k, math

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH")
ARITH_SOURCES = (arith.DATA_SOURCE,)
CALC_TOOLS_SOURCES = (calc_tools.DATA_SOURCE,)
CODE_SOURCES = ("codecontests", "apps", "taco", "codeforces", code.DATA_SOURCE)  # verl's code sources + ours


def compute_gsm8k(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """verl's strict GSM8K reward: the number after the last `#### `, exact match."""
    return gsm8k.score(solution_str, ground_truth, format_score=format_score)


def compute_math(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The last `\\boxed{}` answer, equal to the ground truth after MATH normalisation."""
    return math.score(solution_str, ground_truth, format_score=format_score)


def compute_arith(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The synthetic task's shaped reward (format_score is unused: the shaping is built in)."""
    return arith.score(solution_str, ground_truth)


def compute_arith_exact(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The synthetic task's exact-match reward: 1.0 for the sum, else 0.0 (format_score unused)."""
    return arith.score_exact(solution_str, ground_truth)


def compute_calc_tools(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The exact final answer after any calculator calls (the last assistant turn), plus `tool_call`."""
    return calc_tools.score(solution_str, ground_truth, extra_info, format_score=format_score)


def compute_code(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0,
                 sandbox_url="") -> dict:
    """1.0 when the last fenced Python block passes every stdin/stdout case in the sandbox
    (rlctl's own, or the SandboxFusion service at `sandbox_url`)."""
    return code.score(solution_str, ground_truth, format_score=format_score,
                      bare_program=data_source == code.DATA_SOURCE, sandbox_url=sandbox_url)


BUILTINS = {"gsm8k": compute_gsm8k, "math": compute_math, "arith": compute_arith, "arith_exact": compute_arith_exact,
            "code": compute_code, "calc-tools": compute_calc_tools}
_BY_SOURCE = {
    **{src: compute_gsm8k for src in GSM8K_SOURCES},
    **{src: compute_math for src in MATH_SOURCES},
    **{src: compute_arith for src in ARITH_SOURCES},
    **{src: compute_code for src in CODE_SOURCES},
    **{src: compute_calc_tools for src in CALC_TOOLS_SOURCES},
}


def scorer_for_source(data_source: str):
    """The built-in scorer for `data_source`; UsageError naming the source and the fix if none."""
    fn = _BY_SOURCE.get(data_source)
    if fn is None:
        raise UsageError(
            f"no built-in reward for data_source {data_source!r} (built-ins: {', '.join(_BY_SOURCE)})",
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
