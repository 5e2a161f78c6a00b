"""Full Hugging Face weights from a training engine or from a saved engine folder.

The sharded parameters are gathered into one state dict on rank 0, loaded into a plain CPU copy
of the model (the base from model.path, plus peft adapters for LoRA) and written with
`save_pretrained`: tied embeddings are handled by transformers, LoRA is merged into the base
weights (merge_lora=True) or kept as an adapter folder. The tokenizer is copied alongside.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from rlctl.workers import fsdp
from rlctl.workers.models import apply_lora, load_causal_lm, load_tokenizer, quiet_transformers


def gather_full_state(module: torch.nn.Module) -> dict:
    """The whole state dict on rank 0 (CPU tensors), {} elsewhere. A collective: call on all ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if fsdp.rank_and_world()[1] == 1:
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _plain_model(model_cfg) -> torch.nn.Module:
    """A float32 CPU copy of the trained architecture (with its LoRA adapters)."""
    model = load_causal_lm(model_cfg, dtype=torch.float32)
    return apply_lora(model, model_cfg.lora) if model_cfg.lora.rank > 0 else model


def _stored_dtype(model_cfg) -> torch.dtype:
    """The dtype model.path was published in: the export keeps it (bf16 in, bf16 out)."""
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code),
                    "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def save_hf(state: dict, model_cfg, out_dir: str | Path, *, merge_lora: bool = True) -> Path:
    """Write `state` (a full state dict of the trained model) as a HF folder in out_dir."""
    quiet_transformers()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = _plain_model(model_cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise RuntimeError(f"state dict does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if model_cfg.lora.rank > 0 and merge_lora:
        model = model.merge_and_unload()
    model.to(_stored_dtype(model_cfg)).save_pretrained(out, safe_serialization=True)
    load_tokenizer(model_cfg.path, model_cfg.trust_remote_code).save_pretrained(out)
    return out


def _tied_keys(model: torch.nn.Module) -> set[str]:
    names = {}
    for key, value in model.state_dict(keep_vars=True).items():
        names.setdefault(value.data_ptr(), []).append(key)
    return {k for keys in names.values() if len(keys) > 1 for k in keys[1:]}


def export_engine(engine, model_cfg, out_dir: str | Path, *, merge_lora: bool = True) -> None:
    """Gather `engine`'s weights and write them on rank 0 (call on every rank)."""
    state = gather_full_state(engine.module)
    rank, world = fsdp.rank_and_world()
    if rank == 0:
        save_hf(state, model_cfg, out_dir, merge_lora=merge_lora)
    if world > 1:
        dist.barrier()


def export_checkpoint(engine_dir: str | Path, model_cfg, out_dir: str | Path, *, merge_lora: bool = True) -> Path:
    """One process, no Ray: a saved engine folder (any number of ranks) -> HF folder. For merge."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    from rlctl.workers.checkpoint_io import drop_aliases, quiet_single_process, read_engine_meta

    engine_dir = Path(engine_dir)
    read_engine_meta(engine_dir)
    model = _plain_model(model_cfg)
    trained = {k: v for k, v in model.state_dict().items()
               if model_cfg.lora.rank == 0 or "lora_" in k}
    drop_aliases(trained)
    with quiet_single_process():
        dcp.load(trained, storage_reader=HuggingFaceStorageReader(str(engine_dir / "model")), no_dist=True)
    return save_hf({**model.state_dict(), **trained}, model_cfg, out_dir, merge_lora=merge_lora)
