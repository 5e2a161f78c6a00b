"""Config check of model.path: a model rlctl can load, whose context holds the longest sequence;
and its config.json as the other checks read it (model_config).

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_model(c: Config, ctx: CheckContext) -> list[Problem]:
    """model.path is a local folder, a cached hub id, or a hub id the hub can serve now (probed fast),
    whose context holds the longest sequence (prompt + response; SFT: sft.max_length)."""
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model

    try:
        source = resolve_model(c.model.path, ctx.base_dir)
    except DataError as e:
        return [Problem("model.path", e.message.removeprefix("model.path ") + f"; {e.hint}")]
    problems = [Problem("model.path", source.note, severity="warning")] if source.note else []
    if source.folder is None:
        return problems  # on the hub: downloaded when training starts
    path = source.folder
    if not (path / "config.json").is_file():
        return [Problem("model.path", f"{c.model.path} has no config.json; point it at a Hugging Face model "
                                      "folder (or make one: `rlctl model tiny models/tiny`)")]
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [Problem("model.path", f"{path / 'config.json'} is unreadable: {e}")]
    ctx_len = hf.get("max_position_embeddings")
    if c.run.kind == "sft":   # the longest training sample
        key, total, what = "sft.max_length", c.sft.max_length, ""
    else:
        key, total = "data.max_response_length", c.data.max_prompt_length + c.data.max_response_length
        what = "max_prompt_length + max_response_length = "
    if isinstance(ctx_len, int) and total > ctx_len:
        problems.append(Problem(key, f"{what}{total} exceeds the model's context of {ctx_len} tokens"))
    return problems


def model_config(c: Config, ctx: CheckContext) -> dict | None:
    """model.path's config.json when it is a readable local folder (check_model reports the rest):
    what the checks of the workers read of the model (its heads, experts, vision tower)."""
    path = Path(c.model.path).expanduser()
    path = path if path.is_absolute() else ctx.base_dir / path
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
