"""`rlctl merge ADAPTER_FOLDER --to-hf OUT`: a PEFT adapter folder (adapter_config.json +
adapter_model.safetensors, e.g. a state `rlctl tinker` saved) merged into its base model, or kept as
an adapter, verified logit by logit like a run's checkpoint (rlctl.checkpoint.merge)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

from rlctl.errors import CheckpointError

ADAPTER_CONFIG = "adapter_config.json"
TINKER_META = "tinker.json"    # rlctl tinker's record beside the adapter: base model, LoRA settings, steps


def is_adapter_folder(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file() and (path / "adapter_model.safetensors").is_file()


def merge_folder(source: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None, best: bool = False,
                 dtype: str = "auto", lora: str = "merge", force: bool = False):
    """What `rlctl merge SOURCE` writes: a run folder's checkpoint (merge.merge_run), or an adapter
    folder on its base."""
    from rlctl.checkpoint import merge as M
    from rlctl.errors import UsageError

    source, out = Path(source), Path(out)
    if not is_adapter_folder(source):
        return M.merge_run(source, out, step=step, best=best, dtype=dtype, lora=lora, force=force)
    if step is not None or best:
        raise UsageError(f"{source} is an adapter folder (one set of weights): --step and --best pick a run's checkpoint")
    if dtype not in M.DTYPES or lora not in M.LORA_MODES:
        raise UsageError(f"--dtype is one of {', '.join(M.DTYPES)} and --lora one of {', '.join(M.LORA_MODES)}")
    M.check_out(out, force)
    return merge_adapter_folder(source, out, dtype=dtype, lora=lora, max_shard_size=M.MAX_SHARD_SIZE)


def merge_adapter_folder(folder: Path, out: Path, *, dtype: str, lora: str, max_shard_size):
    """Write `folder`'s adapter on its base (adapter_config.json's base_model_name_or_path, a local
    folder) as a verified Hugging Face folder at `out`, atomically; returns merge.MergeResult."""
    from rlctl.checkpoint import merge as M

    base_path = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
    if not base_path or not Path(base_path).is_dir():
        raise CheckpointError(f"{folder}'s adapter names base model {base_path!r}, which is not a local folder",
                              hint=f"put the base model there, or edit base_model_name_or_path in {folder / ADAPTER_CONFIG}")
    meta = json.loads((folder / TINKER_META).read_text()) if (folder / TINKER_META).is_file() else {}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            verification, written = _export(folder, base_path, tmp, dtype=dtype, adapter=lora == "adapter",
                                             max_shard_size=max_shard_size)
        (tmp / M.SOURCE_FILE).write_text(json.dumps({"adapter_folder": str(folder.resolve()), "tinker": meta or None},
                                                    indent=1) + "\n", encoding="utf-8")
        M._usual_modes(tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        M._replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return M.MergeResult(out=out, step=int(meta.get("steps", 0)), dtype=written, lora=lora, files=files,
                         verification=verification.as_dict(), warning=None)


def _export(folder: Path, base_path: str, tmp: Path, *, dtype: str, adapter: bool, max_shard_size) -> tuple:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlctl.checkpoint import merge as M
    from rlctl.checkpoint import verify_export as V
    from rlctl.models.loading import load_tokenizer, quiet_transformers

    quiet_transformers()
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if not adapter:
        _untie_output_head(base)
    model = PeftModel.from_pretrained(base, str(folder))
    tokenizer = load_tokenizer(base_path)
    return M.verified_export(model, V.prompt_ids(tokenizer), tmp, merge=not adapter, adapter=adapter,
                             what="the merged model vs the adapter on its base",
                             dtype_of=lambda: M._export_dtype(dtype, SimpleNamespace(path=base_path, trust_remote_code=False)),
                             saver=tokenizer, base_path=base_path, trust_remote_code=False, max_shard_size=max_shard_size)


def _untie_output_head(model) -> None:
    """Give the output head its own copy of a tied embedding matrix: an adapter on the head (Tinker
    trains one by default) changes the outputs only, and merged into a shared matrix it would move
    the input embeddings too. The merged folder then stores lm_head.weight and says it is untied."""
    import torch

    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and emb is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(emb.weight.detach().clone())
        model.config.tie_word_embeddings = False
        text = getattr(model.config, "get_text_config", lambda: None)()
        if text is not None:
            text.tie_word_embeddings = False
