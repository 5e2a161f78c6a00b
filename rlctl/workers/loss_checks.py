"""Config checks of the policy loss the actor computes, from what the loss declares when it
registers (rlctl.algorithms.registry.PolicyLossSpec): DAPO clip-higher bounds, what bypass_mode
replaces, and the settings it needs set > 0. No rule compares a loss's name, so a plugin loss
that declares nothing gets none of them.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_policy_loss(c: Config, ctx: CheckContext) -> list[Problem]:
    """The loss's declarations (PolicyLossSpec): DAPO clip-higher bounds, what bypass_mode
    replaces, and the settings it needs set > 0."""
    from rlctl.algorithms import get_policy_loss

    loss, problems = get_policy_loss(c.actor.policy_loss), []
    if c.actor.clip_ratio_high < c.actor.clip_ratio_low and loss.clip_higher:
        problems.append(Problem("actor.clip_ratio_high", "is below clip_ratio_low; DAPO's clip-higher uses "
                                                         "high >= low (e.g. 0.28 vs 0.2)", severity="warning"))
    if c.algorithm.rollout_correction.bypass_mode:
        problems += _bypass_problems(c, loss)
    for param in loss.required:
        if not getattr(c.actor, param.key) > 0:
            problems.append(Problem(f"actor.{param.key}", f"policy_loss = \"{loss.name}\" {param.why}, which has no "
                                                          f"default: set it > 0 (e.g. {param.example:g})"))
    return problems


def _bypass_problems(c: Config, loss) -> list[Problem]:
    """bypass_mode takes old_log_prob from the rollout engine and brings its own loss."""
    from rlctl.algorithms import get_estimator
    from rlctl.workers.rollout.registry import rollout_engine_info

    rc, problems = c.algorithm.rollout_correction, []
    if c.rollout.mode != "one_step_off" and not rollout_engine_info(c.rollout.engine).owns_weights:
        problems.append(Problem("algorithm.rollout_correction.bypass_mode", "takes the rollout engine's log-probs "
                                "as old_log_prob, and the hf engine of rollout.mode = \"sync\" reports none: use "
                                "rollout.mode = \"one_step_off\" or a vLLM/SGLang engine"))
    if get_estimator(c.algorithm.name).needs_sum_pi_squared:
        problems.append(Problem("algorithm.rollout_correction.bypass_mode", "skips the trainer's log-prob pass, "
                                f"which gives algorithm {c.algorithm.name!r} its sum_pi_squared: turn bypass_mode "
                                "off"))
    if not loss.bypass_loss:
        problems.append(Problem("algorithm.rollout_correction.bypass_mode", f"replaces actor.policy_loss = "
                                f"{c.actor.policy_loss!r} by loss_type = {rc.loss_type!r} (as verl does)",
                                severity="warning"))
    return problems
