"""Config checks of PRIME's implicit PRM (rlctl.workers.roles.prime_rm, rlctl.controller.prime).

Its parameters (beta_train > 0, the coefficients, prm_lr, prm_update, prm_label) are checked against
PrimeParams by the generic [algorithm.params] check; here, what the PRM is not built for is refused
in one line each (a vision-language model in the machine pass). Checks keep the contract of
rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_prime(c: Config, ctx: CheckContext) -> list[Problem]:
    from rlctl.algorithms import run_needs

    if not run_needs(c).implicit_prm:
        return []
    name, problems = c.algorithm.name, []
    if c.rollout.mode != "sync":
        problems.append(Problem("rollout.mode", f"algorithm {name!r} trains its implicit PRM on each step's batch "
                                f"in the synchronous loop; rollout.mode = {c.rollout.mode!r} is not built with it: "
                                "set rollout.mode = \"sync\""))
    return problems


def check_prime_model(c: Config, ctx: CheckContext) -> list[Problem]:
    """Machine pass: the PRM scores text tokens only; a vision-language model.path is refused."""
    from rlctl.algorithms import run_needs
    from rlctl.models.checks import model_config

    if not run_needs(c).implicit_prm:
        return []
    hf = model_config(c, ctx)
    if hf is None or hf.get("vision_config") is None:   # not readable here (check_model reports it), or text
        return []
    return [Problem("algorithm.name", f"algorithm {c.algorithm.name!r}'s implicit PRM is not built for "
                    f"vision-language models ({c.model.path} has a vision tower): its process rewards would not "
                    "see the images; use a text model or another algorithm")]
