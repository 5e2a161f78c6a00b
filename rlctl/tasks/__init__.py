"""The built-in tasks, one module each: its data (adapter or generator), data_source names, scorer
and tool offer, as nanochat keeps `tasks/gsm8k.py`. Each task module declares:

    DATA_SOURCES  the data_source strings whose rows its `compute_score` scores (reward.function = "")
                  (optional DATA_SOURCE_PREFIXES: every data_source starting with one, as verl's "aime*")
    REWARDS       {reward.function name: scorer with verl's signature}
    PREP          its `rlctl data prep SOURCE` choices (rlctl.data.sources.PrepSource)
                  (optional FAMILIES: {family: (spec, args, size) -> PrepSource} for `family:SPEC`
                  sources such as reasoning-gym:TASK)

Adding a task: its module here and one entry in TASKS. rlctl.tasks.prep (the prep choices) and
rlctl.rewards.builtin (the reward names and the data_source routing) read the table, in its order;
tests/tasks checks that no two tasks claim one name.
"""

from __future__ import annotations

from rlctl.tasks import (arith, calc_tools, code, geo3k, gsm8k, math, math_dapo, prime_math, reasoning_gym,
                         search_r1, shapes, verifiers_env)

TASKS = (gsm8k, math, arith, code, calc_tools, shapes, geo3k, math_dapo, prime_math, search_r1, reasoning_gym,
         verifiers_env)

