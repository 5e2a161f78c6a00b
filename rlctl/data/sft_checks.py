"""Config checks of an SFT run (run.kind = "sft"): the RL keys it ignores, and its batch.

An SFT config shares [run], [model], [data] (files, batch_size, shuffle, val_batch_size),
[actor] (optimizer, schedule, micro-batches) and [resources] with RL, and adds [sft]. Rollout,
reward, algorithm and critic settings mean nothing to it: a config that sets them gets a warning
per key (not an error: a file copied from an RL recipe still runs).
Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.plan import world_size
from rlctl.config.schema import Config

# Dotted keys (or whole sections, ending in ".") that an SFT run reads. data.max_response_length is
# not used in training: `rlctl eval` of the merged model generates that many tokens at most.
SFT_KEYS = ("run.", "model.", "resources.", "sft.", "data.train_files", "data.val_files", "data.batch_size",
            "data.shuffle", "data.max_response_length", "data.val_batch_size", "actor.lr", "actor.warmup_steps", "actor.lr_schedule",
            "actor.min_lr_ratio", "actor.weight_decay", "actor.grad_clip", "actor.micro_batch_size",
            "actor.ulysses_sequence_parallel_size", "actor.expert_parallel_size", "actor.moe_aux_loss_coef")


def flatten(raw: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in raw.items():
        if isinstance(value, dict) and not (prefix + key).endswith("reward.weights"):
            out += flatten(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def unused_keys(raw: dict) -> list[str]:
    """The keys the user set that an SFT run does not read."""
    return [k for k in flatten(raw) if not any(k == s or (s.endswith(".") and k.startswith(s)) for s in SFT_KEYS)]


def check_sft_keys(c: Config, ctx: CheckContext) -> list[Problem]:
    return [Problem(key, "not used by run.kind = \"sft\" (no rollouts, rewards or RL algorithm); remove it, or set "
                         "run.kind = \"rl\"", severity="warning") for key in unused_keys(ctx.raw)]


def check_sft_batch(c: Config, ctx: CheckContext) -> list[Problem]:
    """Examples split evenly over the workers; a token budget that fits the longest sample."""
    problems, workers = [], world_size(c.resources)
    if c.data.batch_size % workers:
        problems.append(Problem("data.batch_size", f"{c.data.batch_size} examples per step cannot be split evenly over "
                                                   f"{workers} workers"))
    budget = c.sft.micro_batch_max_tokens
    if budget and budget < c.sft.max_length:
        problems.append(Problem("sft.micro_batch_max_tokens", f"{budget} is below sft.max_length = {c.sft.max_length}: "
                                                              "a sample that long runs alone, over the budget",
                                severity="warning"))
    return problems


def check_sft_section_unused(c: Config, ctx: CheckContext) -> list[Problem]:
    """An RL run ignores [sft]: one warning per key set there."""
    return [Problem(f"sft.{k}", "only used by run.kind = \"sft\"", severity="warning") for k in ctx.raw.get("sft", {})]
