"""Config checks of model.lora: sane rank/alpha/lr, and in the machine pass every target module
matches a layer of the model (read on the meta device by rlctl.workers.compute.lora, no weights).

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_lora(c: Config, ctx: CheckContext) -> list[Problem]:
    lora = c.model.lora
    if lora.rank == 0:
        return []
    problems = []
    if not lora.target_modules:
        problems.append(Problem("model.lora.target_modules", "is empty; name the modules that get adapters"))
    elif "all-linear" in [str(t).lower() for t in lora.target_modules] and len(lora.target_modules) > 1:
        problems.append(Problem("model.lora.target_modules", "\"all-linear\" already covers every linear layer; "
                                                             "use it alone, or list layer names without it"))
    if lora.alpha / lora.rank > 16 or lora.alpha / lora.rank < 1 / 16:
        problems.append(Problem("model.lora.alpha", f"alpha/rank = {lora.alpha / lora.rank:g} is far from the usual "
                                                    "0.5-4; updates will be tiny or explosive", severity="warning"))
    if c.actor.lr < 1e-6:
        problems.append(Problem("actor.lr", f"{c.actor.lr:g} is very low for LoRA (usually 1e-5 to 1e-4)",
                                severity="warning"))
    return problems


def check_lora_targets(c: Config, ctx: CheckContext) -> list[Problem]:
    """Every name in model.lora.target_modules must match a layer of the model: read from its
    config.json on the meta device (no weights). A model not on disk (a hub id not yet
    downloaded) is checked by the workers at train start instead; "all-linear" matches any model."""
    from rlctl.workers.compute.lora import is_all_linear, mismatch_message

    lora = c.model.lora
    if lora.rank == 0 or not lora.target_modules or is_all_linear(lora.target_modules):
        return []
    model = meta_policy(c, ctx)
    message = mismatch_message(model, lora.target_modules) if model is not None else None
    return [Problem("model.lora.target_modules", message)] if message else []


def meta_policy(c: Config, ctx: CheckContext):
    """model.path built on the meta device (its layers, no weights), or None where it cannot be read
    here: a hub id not yet downloaded is checked by the workers at train start, a broken folder is
    reported by check_model, an architecture transformers cannot build fails at load with its reason."""
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model
    from rlctl.workers.compute.lora import meta_model

    try:   # a local folder or the cached snapshot of a hub id (the probe is cached: check_model made it)
        path = resolve_model(c.model.path, ctx.base_dir).folder
    except DataError:
        return None   # reported by check_model
    if path is None or not (path / "config.json").is_file():
        return None
    try:
        return meta_model(str(path), c.model.trust_remote_code)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build fails at load, with its reason
        return None
