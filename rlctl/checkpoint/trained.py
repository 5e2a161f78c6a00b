"""The trained policy rebuilt in this process from a checkpoint folder: no Ray, no process group.

The actor's DCP shards (saved by any number of ranks) are read straight into a plain float32
copy of the model (plus its LoRA adapters): DCP's HuggingFace reader places each saved shard
at its offsets, so W ranks' files load into one process (resharding). Before loading, the
checkpoint's keys and shapes are checked against the model model.path builds, so a checkpoint
from another model fails with a one-line CheckpointError instead of a silently wrong export.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlctl.checkpoint.manifest import CONFIG_FILE
from rlctl.errors import CheckpointError, ConfigError, DataError

ACTOR_DIR = "actor"


def load_step_config(step_dir: Path):
    """The run's Config as saved in the checkpoint (step_<N>/config.resolved.toml)."""
    from rlctl.config.loader import load_config

    path = Path(step_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing", hint="the checkpoint is incomplete; pick another with --step")
    try:
        return load_config(path).config
    except (ConfigError, DataError) as err:  # a config this rlctl cannot read
        raise CheckpointError(f"cannot read {path}: {err.message}",
                              hint="merge with the rlctl version that saved the checkpoint") from None


def _checkpoint_shapes(model_dir: Path) -> dict[str, tuple]:
    """{key: shape} of the tensors DCP saved under model_dir (from the safetensors headers)."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    try:
        metadata = HuggingFaceStorageReader(str(model_dir)).read_metadata()
    except Exception as err:  # noqa: BLE001 - any unreadable header is a broken checkpoint
        raise CheckpointError(f"cannot read the weights in {model_dir}: {str(err).splitlines()[0][:200]}",
                              hint="the shard files are missing or damaged; pick another step with --step") from None
    return {k: tuple(v.size) for k, v in metadata.state_dict_metadata.items() if hasattr(v, "size")}


def _tied_aliases(state: dict) -> dict[str, str]:
    """{alias: first key} for keys sharing one tensor (tied input/output embeddings)."""
    first: dict[int, str] = {}
    aliases = {}
    for key, value in state.items():
        ptr = value.untyped_storage().data_ptr()
        if ptr in first:
            aliases[key] = first[ptr]
        else:
            first[ptr] = key
    return aliases


def check_fits(model: torch.nn.Module, saved: dict[str, tuple], where: Path) -> None:
    """Raise CheckpointError unless the saved tensors are exactly the model's trained ones."""
    state = model.state_dict()
    hint = "the checkpoint was saved from a different model than model.path (or other LoRA settings)"
    extra = sorted(set(saved) - set(state))
    if extra:
        raise CheckpointError(f"{where} has weights the model at model.path lacks ({extra[0]}, {len(extra)} in all)",
                              hint=hint)
    for key, shape in saved.items():
        if tuple(state[key].shape) != shape:
            raise CheckpointError(f"{where}: {key} has shape {list(shape)} but the model at model.path has "
                                  f"{list(state[key].shape)}", hint=hint)
    aliases = _tied_aliases(state)
    for alias, kept in aliases.items():
        if alias in saved and kept in saved:
            raise CheckpointError(f"{where} stores {alias} and {kept} separately, but the model at model.path "
                                  "ties them (tied embeddings)", hint=hint)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n in trained if n not in saved and not any(a in saved for a, k in aliases.items() if k == n)]
    if missing:
        raise CheckpointError(f"{where} lacks trained weights of the model at model.path ({missing[0]}, "
                              f"{len(missing)} in all)", hint=hint)


def load_trained_model(step_dir: Path, config) -> torch.nn.Module:
    """The policy at this checkpoint: float32, on CPU, eval mode, LoRA adapters unmerged."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    from rlctl.workers.compute.checkpoint_io import read_engine_meta
    from rlctl.workers.compute.models import apply_lora, load_causal_lm

    engine_dir = Path(step_dir) / ACTOR_DIR
    read_engine_meta(engine_dir)
    torch.manual_seed(config.run.seed)  # LoRA init is overwritten by the checkpoint; seeded anyway
    model = load_causal_lm(config.model, torch.float32)
    if config.model.lora.rank > 0:
        model = apply_lora(model, config.model.lora)
    saved = _checkpoint_shapes(engine_dir / "model")
    check_fits(model, saved, engine_dir)
    state = model.state_dict()
    wanted = {k: v for k, v in state.items() if k in saved}
    try:
        dcp.load(wanted, storage_reader=HuggingFaceStorageReader(str(engine_dir / "model")), no_dist=True)
    except Exception as err:  # noqa: BLE001 - DCP raises many kinds on damaged files
        raise CheckpointError(f"cannot load the weights in {engine_dir / 'model'}: {str(err).splitlines()[0][:200]}",
                              hint="the shard files are damaged; pick another step with --step") from None
    model.load_state_dict(wanted, strict=False)
    return model.eval()
