"""Config checks of the policy loss the actor computes, from what the loss declares when it
registers (rlctl.algorithms.registry.PolicyLossSpec): DAPO clip-higher bounds, what bypass_mode
replaces, and the settings it needs set > 0. No rule compares a loss's name, so a plugin loss
that declares nothing gets none of them.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, Config


def check_policy_loss(c: Config, ctx: CheckContext) -> list[Problem]:
    """The loss's declarations (PolicyLossSpec): DAPO clip-higher bounds, what bypass_mode
    replaces, and the settings it needs set > 0."""
    from rlctl.algorithms import get_policy_loss, loss_params

    loss, problems = get_policy_loss(c.actor.policy_loss), []
    if c.actor.clip_ratio_high < c.actor.clip_ratio_low and loss.clip_higher:
        problems.append(Problem("actor.clip_ratio_high", "is below clip_ratio_low; DAPO's clip-higher uses "
                                                         "high >= low (e.g. 0.28 vs 0.2)", severity="warning"))
    if c.actor.clip_ratio_low >= 1 and not loss.open_low:
        problems.append(Problem("actor.clip_ratio_low", f"{c.actor.clip_ratio_low} must be < 1: policy_loss "
                                f"\"{loss.name}\" clips the ratio below at 1 - low, which must stay above 0"))
    if c.algorithm.rollout_correction.bypass_mode:
        problems += _bypass_problems(c, loss)
    bad = params_problems_of("actor.loss_params", f"policy_loss {loss.name!r}", loss, c.actor.loss_params)
    if bad:
        return problems + bad
    values = loss_params(loss.name, c.actor.loss_params)
    for param in loss.required:
        if not getattr(values, param.key) > 0:
            problems.append(Problem(f"actor.loss_params.{param.key}", f"policy_loss = \"{loss.name}\" {param.why}, "
                                    f"which has no default: set it > 0 (e.g. {param.key} = {param.example:g} under "
                                    "[actor.loss_params])"))
    return problems


def params_problems_of(table: str, owner: str, spec, values) -> list[Problem]:
    """Problems of an algorithm's parameter table ([algorithm.params], [actor.loss_params]) against the
    dataclass its registration declares: unknown keys with did-you-mean, wrong types, its bounds."""
    from rlctl.algorithms.params import params_problems

    return [Problem(f"{table}.{key}" if key else table, message)
            for key, message in params_problems(owner, spec.params, values)]


def _bypass_problems(c: Config, loss) -> list[Problem]:
    """bypass_mode takes old_log_prob from the rollout engine and brings its own loss."""
    from rlctl.algorithms import run_needs
    from rlctl.workers.rollout.registry import rollout_engine_info

    rc, problems = c.algorithm.rollout_correction, []
    if c.rollout.mode not in SEPARATE_ROLLOUT_MODES and not rollout_engine_info(c.rollout.engine).owns_weights:
        problems.append(Problem("algorithm.rollout_correction.bypass_mode", "takes the rollout engine's log-probs "
                                "as old_log_prob, and the hf engine of rollout.mode = \"sync\" reports none: use "
                                "rollout.mode = \"one_step_off\" or a vLLM/SGLang engine"))
    if run_needs(c).sum_pi_squared:
        problems.append(Problem("algorithm.rollout_correction.bypass_mode", "skips the trainer's log-prob pass, "
                                f"which gives algorithm {c.algorithm.name!r} its sum_pi_squared: turn bypass_mode "
                                "off"))
    if not loss.bypass_loss:
        problems.append(Problem("algorithm.rollout_correction.bypass_mode", f"replaces actor.policy_loss = "
                                f"{c.actor.policy_loss!r} by loss_type = {rc.loss_type!r} (as verl does)",
                                severity="warning"))
    return problems


def check_staleness_loss(c: Config, ctx: CheckContext) -> list[Problem]:
    """rollout.max_staleness > 1 needs a loss that declares trust_region (an unclipped importance-
    sampling loss at staleness 3 destabilised in tinker-cookbook's tests); a loss that declares
    corrects_rollout (decoupled_ppo) must not get rollout correction's IS weights on top."""
    from rlctl.algorithms import get_policy_loss

    loss, rc, problems = get_policy_loss(c.actor.policy_loss), c.algorithm.rollout_correction, []
    bounded = rc.loss_type == "ppo_clip" if rc.bypass_mode else loss.trust_region
    if c.rollout.mode == "async" and c.rollout.max_staleness > 1 and not bounded:
        used = f"loss_type = {rc.loss_type!r}" if rc.bypass_mode else f"actor.policy_loss = {loss.name!r}"
        problems.append(Problem("rollout.max_staleness", f"{c.rollout.max_staleness} with {used}, which does not "
                                "bound how far an update moves from the stale samples: use actor.policy_loss = "
                                "\"decoupled_ppo\" (or another clipped loss), or rollout.max_staleness = 1"))
    if loss.corrects_rollout and rc.rollout_is not in ("auto", "") and not rc.bypass_mode:
        problems.append(Problem("algorithm.rollout_correction.rollout_is", f"{rc.rollout_is!r}: actor.policy_loss = "
                                f"{loss.name!r} weights each token by pi_old / pi_rollout itself, so these weights "
                                "would apply twice: set rollout_is = \"\" or \"auto\""))
    return problems
