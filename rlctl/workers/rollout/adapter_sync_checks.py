"""Config check of model.lora.sync = "adapter" (rlctl.workers.rollout.adapter_sync): where the
adapter cannot carry the update, one warning that the run pushes merged weights instead.

Machine pass: the model's layers are read from its config.json on the meta device (no weights)."""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_adapter_sync(c: Config, ctx: CheckContext) -> list[Problem]:
    from rlctl.workers.rollout.adapter_sync import config_refusal

    lora = c.model.lora
    if lora.rank == 0 or lora.sync != "adapter" or (c.rollout.engine == "hf" and c.rollout.mode == "sync"):
        return []   # the hf engine of a sync run is the trainer's own module: nothing is pushed
    reason = config_refusal(c) or _model_refusal(c, ctx)
    if reason is None:
        return []
    return [Problem("model.lora.sync", f"\"adapter\" cannot carry this run's updates ({reason}): the run pushes "
                                       "merged weights", severity="warning")]


def _model_refusal(c: Config, ctx: CheckContext) -> str | None:
    from rlctl.workers.compute.lora import adapted_modules
    from rlctl.workers.compute.lora_checks import meta_policy
    from rlctl.workers.rollout.adapter_sync import model_refusal

    model = meta_policy(c, ctx)
    return None if model is None else model_refusal(model, adapted_modules(model, c.model.lora.target_modules))
