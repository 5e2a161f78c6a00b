"""Config checks of self-play (SPIN, SPPO: rlctl.algorithms.selfplay, rlctl.controller.selfplay):
the reference refresh (`algorithm.ref_update_every`) and the estimator / loss pairs that only mean
SPIN or SPPO together. What an estimator needs is read from its registry declaration."""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_selfplay(c: Config, ctx: CheckContext) -> list[Problem]:
    from rlctl.algorithms import run_needs

    algo, actor = c.algorithm, c.actor
    needs = run_needs(c)
    problems = []
    every = algo.ref_update_every
    if every and not needs.reference:
        problems.append(Problem("algorithm.ref_update_every", f"is {every} but the run has no reference model to "
                                "refresh (neither the estimator nor a KL term reads one): set it to 0"))
    if every and c.model.lora.rank > 0:
        problems.append(Problem("algorithm.ref_update_every", "needs a frozen copy of the policy, and with LoRA the "
                                "reference is the base model (adapters off), which cannot be refreshed: set "
                                "model.lora.rank = 0 or algorithm.ref_update_every = 0"))
    if every and c.run.save_every and c.run.save_every % every:
        problems.append(Problem("run.save_every", f"{c.run.save_every} is not a multiple of "
                                f"algorithm.ref_update_every = {every}: a checkpoint inside a self-play iteration "
                                "cannot restore its opponent, so resume would refuse it; make it a multiple"))
    if needs.real_response:
        if actor.policy_loss != "vanilla" or actor.loss_agg_mode != "seq-mean-token-sum":
            problems.append(Problem("actor.policy_loss", f"algorithm {algo.name!r} turns its pairwise loss into "
                                    "per-sequence advantages whose gradient is the loss's only with "
                                    "policy_loss = \"vanilla\" and loss_agg_mode = \"seq-mean-token-sum\"; set both"))
    if (algo.name == "sppo") != (actor.policy_loss == "sppo"):
        problems.append(Problem("actor.policy_loss", "SPPO is the sppo estimator (win rates) with the sppo loss "
                                "(the squared regression onto them); one without the other is neither: set "
                                "algorithm.name = \"sppo\" and actor.policy_loss = \"sppo\" together"))
    return problems
