"""Saved states on disk, and the tinker:// paths that name them.

    tinker://<model_id>/weights/<name>          save_state: adapter + AdamW state + step count
    tinker://<model_id>/sampler_weights/<name>  save_weights_for_sampler: adapter only

live in `<state_dir>/<model_id with ':' as '-'>/<kind>/<name>/` as a PEFT adapter folder
(adapter_config.json, adapter_model.safetensors: what peft, `rlctl serve --lora` and merging tools
load), plus optimizer.pt (torch.save of AdamW's state_dict) and tinker.json (base model, LoRA
settings, step). A folder is written under a temporary name and renamed, so a path either opens
whole or not at all.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

import torch

from rlctl.tinker.base import LoraSpec
from rlctl.tinker.wire import TinkerError

KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
META = "tinker.json"


def tinker_path(model_id: str, kind: str, name: str) -> str:
    return f"tinker://{model_id}/{kind}/{name}"


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise TinkerError(f"checkpoint name {name!r} is not usable as a folder name: use letters, digits, '.', '_' "
                          "and '-' (up to 128)")
    return name


def folder_of(state_dir: Path, path: str) -> Path:
    """The folder a tinker:// path names; TinkerError (404) if it does not exist."""
    parts = path[len("tinker://"):].split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in KINDS:
        raise TinkerError(f"{path!r} is not a tinker://<model_id>/weights/<name> or .../sampler_weights/<name> path")
    folder = state_dir / parts[0].replace(":", "-") / parts[1] / check_name(parts[2])
    if not (folder / META).is_file():
        raise TinkerError(f"no saved state at {path} (looked in {folder})", status=404)
    return folder


def save(state_dir: Path, model_id: str, kind: str, name: str, *, adapter_state: dict, adapter_config,
         meta: dict, optimizer: dict | None) -> str:
    folder = state_dir / model_id.replace(":", "-") / kind / check_name(name)
    tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir(parents=True)
    try:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in adapter_state.items()}, str(tmp / "adapter_model.safetensors"))
        adapter_config.save_pretrained(str(tmp))
        if optimizer is not None:
            torch.save(optimizer, tmp / "optimizer.pt")
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tinker_path(model_id, kind, name)


def load(folder: Path, *, optimizer: bool) -> tuple[dict, dict[str, torch.Tensor], dict | None]:
    """(tinker.json, adapter tensors, AdamW state or None); TinkerError when the optimizer state was
    asked for but this is a sampler save (weights only)."""
    from safetensors.torch import load_file

    meta = json.loads((folder / META).read_text())
    state = load_file(str(folder / "adapter_model.safetensors"))
    opt = None
    if optimizer:
        if not (folder / "optimizer.pt").is_file():
            raise TinkerError(f"{folder} holds weights only (a sampler save): load it without the optimizer")
        opt = torch.load(folder / "optimizer.pt", weights_only=True)
    return meta, state, opt


def spec_of(meta: dict) -> LoraSpec:
    return LoraSpec(**meta["lora"])
