"""What `serve` and `eval` were pointed at: a Hugging Face model folder, or a training run folder.

A run folder (rlctl.checkpoint.run_folder.is_run_folder) holds sharded training checkpoints, not
a model a server can load, so it is exported to a temporary Hugging Face folder first with
`rlctl.checkpoint.merge.export_hf`, the same code `rlctl merge` uses.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from rlctl.errors import CheckpointError, DataError, UsageError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


@contextlib.contextmanager
def model_folder(path: str | Path, step: int | None = None):
    """Yield a loadable Hugging Face folder for `path` (exporting a run's checkpoint if needed)."""
    from rlctl.checkpoint.run_folder import is_run_folder

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path} does not exist", hint="pass a Hugging Face model folder or a run folder (a hub id "
                                                       "is not fetched here: `hf download ID --local-dir DIR` first)")
    if is_model_dir(path):   # a folder with config.json is a model, never a run folder
        if step is not None:
            raise UsageError(f"--step applies to run folders; {path} is a model folder")
        yield path
        return
    if not is_run_folder(path):
        raise DataError(f"{path} is neither a Hugging Face model folder (no config.json) nor a run "
                        "folder (no checkpoints/ or run.json)",
                        hint="pass the folder `rlctl merge` wrote, or a run folder.")
    try:
        from rlctl.checkpoint.merge import export_hf
    except ImportError:
        raise CheckpointError(
            f"{path} is a training run folder, and exporting its checkpoint needs rlctl.checkpoint.merge, "
            "which this build does not have", hint=f"run `rlctl merge {path} --to-hf OUT` and serve OUT.") from None
    with tempfile.TemporaryDirectory(prefix="rlctl-serve-") as tmp:
        out = export_hf(path, Path(tmp) / "model", step=step)
        yield Path(out or Path(tmp) / "model")


@contextlib.contextmanager
def serve_source(path: str | Path, step: int | None = None, served_name: str | None = None):
    """Yield (model folder, its served name, the run's adapter as (name, adapter folder) or None).
    A LoRA run folder is served as its base model (by the base's folder name) plus its adapter,
    unmerged (rlctl merge --lora adapter), named `served_name` or the run's name; anything else as
    model_folder exports it, named `served_name` or the folder's name."""
    from rlctl.checkpoint.run_folder import is_run_folder

    path = Path(path)
    name = served_name or path.resolve().name
    if not path.is_dir() or is_model_dir(path) or not is_run_folder(path):
        with model_folder(path, step) as folder:
            yield folder, name, None
        return
    from rlctl.checkpoint.merge import merge_run, pick_checkpoint
    from rlctl.checkpoint.trained import load_step_config
    from rlctl.models.hub import resolve_model

    config = load_step_config(pick_checkpoint(path, step)[0].path)
    if config.model.lora.rank == 0:
        with model_folder(path, step) as folder:
            yield folder, name, None
        return
    base = resolve_model(config.model.path, Path.cwd()).folder
    if base is None:
        raise DataError(f"the base model of {path} ({config.model.path}) is not on this machine",
                        hint="download it first (`rlctl model get` or `hf download`)")
    with tempfile.TemporaryDirectory(prefix="rlctl-serve-") as tmp:
        merge_run(path, Path(tmp) / "adapter", step=step, lora="adapter")
        yield base, base.name, (name, Path(tmp) / "adapter")


def resolve_dtype(name: str, device: str):
    """Torch dtype for `--dtype`; auto = bfloat16 on GPU (float16 when bf16 is missing), float32 on CPU."""
    import torch

    if name not in DTYPES:
        raise UsageError(f"--dtype {name!r} is not one of {', '.join(DTYPES)}")
    if name != "auto":
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_model(folder: Path, dtype: str = "auto", device: str | None = None, chat_template: str = ""):
    """(model, tokenizer) in eval mode on `device` (cuda when available, else cpu); the tokenizer renders
    chats with the `chat_template` file when one is given (rlctl eval --config's model.chat_template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from rlctl.models.vision import is_vision_model

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    auto = AutoModelForImageTextToText if is_vision_model(folder) else AutoModelForCausalLM
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = auto.from_pretrained(folder, dtype=resolve_dtype(dtype, device))
    except (OSError, ValueError) as e:
        raise DataError(f"cannot load a model from {folder}: {e}",
                        hint="is it a complete Hugging Face folder (config, weights, tokenizer)?") from None
    from rlctl.models.chat_template import use_template

    return model.to(device).eval(), use_template(tokenizer, chat_template)


def load_processor_of(folder: Path):
    """A vision-language model folder's processor (rlctl.models.vision.load_processor); None for a text model."""
    from rlctl.models.vision import is_vision_model, load_processor

    return load_processor(folder) if is_vision_model(folder) else None


def context_room(folder: Path, prompt_ids: list[list[int]]) -> list[int]:
    """The tokens each prompt leaves in the model's context (max_position_embeddings); DataError for
    a prompt that fills it."""
    from transformers import AutoConfig

    context = int(getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings", 0) or 2048)
    rooms = []
    for i, ids in enumerate(prompt_ids):
        rooms.append(context - len(ids))
        if rooms[-1] < 1:
            raise DataError(f"prompt {i} has {len(ids)} tokens; the model's context is {context}",
                            hint="drop it with --limit or shorten it in the data.")
    return rooms
