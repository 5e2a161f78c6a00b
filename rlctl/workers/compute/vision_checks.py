"""Config checks of training a vision-language model (rlctl.workers.compute.vision): what is built for one
so far (rollout.mode one_step_off / async: the hf engine, whole batches; what each rollout kind carries
images in: rlctl.rollouts.checks), model.freeze_vision_tower
on a model that has no vision tower, and a text-only critic beside a vision-language policy.

Machine pass only: whether model.path is a vision-language model is read from its config.json
(a `vision_config`). Checks keep the contract of rlctl.config.checks.
"""

from __future__ import annotations

import dataclasses

from rlctl.algorithms import run_needs
from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config
from rlctl.models.checks import model_config


def check_vision(c: Config, ctx: CheckContext) -> list[Problem]:
    hf = model_config(c, ctx)
    if hf is None:   # not a readable local folder: check_model reports it
        return []
    if hf.get("vision_config") is None:
        if c.model.freeze_vision_tower:
            return [Problem("model.freeze_vision_tower", f"{c.model.path} is a text-only model "
                            f"({hf.get('model_type', '?')}): it has no vision tower to freeze; remove the key")]
        return []
    problems = []
    if c.rollout.engine not in ("hf", "vllm"):
        problems.append(Problem("rollout.engine", f"{c.rollout.engine!r} with a vision-language model is not built "
                                "yet; use rollout.engine = \"hf\" (CPU and GPU) or \"vllm\" (GPU)"))
    if c.rollout.mode != "sync" and c.rollout.engine != "hf":
        problems.append(Problem("rollout.mode", f"\"{c.rollout.mode}\" with a vision-language model is built for "
                                f"rollout.engine = \"hf\" only, not {c.rollout.engine!r} (the separate rollout group's "
                                "vLLM engine does not take images yet); use rollout.engine = \"hf\" or rollout.mode = "
                                "\"sync\""))
    if c.rollout.mode == "async" and c.rollout.partial_rollout:
        problems.append(Problem("rollout.partial_rollout", "partial rollouts of a vision-language model are not built "
                                "yet (the unfinished samples do not keep their images); set it to false"))
    if run_needs(c).critic and c.critic.model_path:
        critic = model_config(dataclasses.replace(c, model=dataclasses.replace(c.model, path=c.critic.model_path)), ctx)
        if critic is not None and critic.get("vision_config") is None:
            problems.append(Problem("critic.model_path", f"{c.critic.model_path} is a text-only model "
                                    f"({critic.get('model_type', '?')}) but the policy reads images, which the critic "
                                    "must see too; point it at a vision-language model or remove it (model.path)"))
    return problems

