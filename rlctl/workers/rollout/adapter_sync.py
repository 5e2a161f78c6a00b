"""`model.lora.sync = "adapter"`: after an update only the LoRA adapter travels to the rollout engine.

The base weights never change in a LoRA run, so an engine that applies adapters itself needs only
the `lora_A` / `lora_B` tensors (rank x (in + out) per adapted layer: about 1% of the model at rank
16 on SmolLM2-135M) instead of the merged model. vLLM gets them as a PEFT folder (its LoRA loader
reads folders; in-memory loading needs a patch of its worker), written to tmpfs (/dev/shm) under a
temporary name and renamed into place, under a new adapter name per policy version: vLLM keys its
prefix cache by adapter, so reusing one name would reuse KV computed with the old adapter.

The separate rollout group of rollout.mode = "one_step_off" / "async" gets the same push through the
object store (`export_push`: {"adapter": {PEFT name: numpy}, "adapter_config": {...}}): its float32
copy is the base with a peft adapter of the run's shape (`load_adapter` copies the pushed tensors in),
and its vLLM engine, if any, loads the adapter as above. One adapter at a time suffices there too:
a rollout rank runs its calls one after another, so no generation is in flight when a push lands.

Where the adapter cannot carry the update, the run pushes merged weights, and `rlctl config validate`
(and the start of `rlctl train`) says so in one warning line (`refusal`): LoRA on embeddings or the
output head, on MoE expert banks, on a vision-language model, a tensor-parallel vLLM engine, and the
SGLang engine.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from rlctl.models.lora_adapter import VLLM_RANKS
from rlctl.workers.rollout.weights import hf_name

ADAPTER_NAME = "policy-v{version}"


def config_refusal(config) -> str | None:
    """Why this run's settings cannot sync the adapter alone (None: they can)."""
    rc = config.rollout
    if config.model.lora.rank == 0 or config.model.lora.sync != "adapter":
        return None
    if rc.engine == "sglang":
        return "the sglang engine takes merged weights here"
    if rc.engine == "vllm" and rc.tensor_parallel_size > 1:
        return "a tensor-parallel vLLM engine is not set up for LoRA here"
    if rc.engine == "vllm" and config.model.lora.rank > VLLM_RANKS[-1]:
        return f"vLLM's LoRA takes ranks up to {VLLM_RANKS[-1]}"
    return None


def model_refusal(model: torch.nn.Module, targets: list[str] | None = None) -> str | None:
    """Why the adapter of `model` (a peft model, or with `targets` the full names of the modules that
    will get adapters) cannot be applied by the engine unmerged (None: it can)."""
    from rlctl.workers.compute.vision import has_vision_tower

    if has_vision_tower(model):
        return "a vision-language model's adapter is pushed merged"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = getattr(head, "base_layer", head)   # peft wraps a targeted head
    modules = dict(model.named_modules())
    names = targets if targets is not None else [n for n, m in modules.items() if hasattr(m, "lora_A")]
    for name in names:
        layer = modules.get(name)
        layer = getattr(layer, "base_layer", layer)
        if hasattr(layer, "parameter_name") or any(p.dim() == 3 for p in layer.parameters(recurse=False)):
            return f"LoRA on the MoE expert banks ({hf_name(name)}) is pushed merged"
        if isinstance(layer, torch.nn.Embedding) or (head is not None and layer is head):
            return f"LoRA on the embeddings or the output head ({hf_name(name)}) is pushed merged"
    return None


def adapter_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT file name, whole tensor) of every lora_A / lora_B weight: `base_model.model.<module>.lora_A.weight`,
    as peft's save_pretrained names them. FSDP2 shards are gathered: call on every rank, same order."""
    for name, param in model.named_parameters():
        if (out := _peft_file_name(name)) is None:
            continue
        tensor = param.detach()
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield out, tensor.to(dtype) if dtype is not None else tensor


def _peft_file_name(name: str) -> str | None:
    """A trained module's lora_A / lora_B parameter name -> its PEFT file name (None: not one)."""
    if ".lora_A." not in name and ".lora_B." not in name:
        return None
    stem, _, rest = name.rpartition(".lora_")
    return "base_model.model." + hf_name(stem) + ".lora_" + rest.split(".")[0] + ".weight"


def load_adapter(model: torch.nn.Module, tensors: dict) -> None:
    """Copy a pushed adapter ({PEFT file name: tensor or numpy}, as `adapter_tensors` names them) into
    the peft `model`'s own lora_A / lora_B; a name it lacks, or one of its adapter weights left
    unset, is an error (the actor and the rollout group built different adapters)."""
    from rlctl.errors import UsageError

    params = {out: p for name, p in model.named_parameters() if (out := _peft_file_name(name)) is not None}
    if set(params) != set(tensors):
        odd = sorted(set(params) ^ set(tensors))[0]
        raise UsageError(f"the pushed adapter and the rollout group's differ ({odd})",
                         hint="the actor and the rollout group must build the adapter from the same model.lora")
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(torch.as_tensor(value))


def is_adapter_push(weights) -> bool:
    """Whether a push to the separate rollout group is `export_push`'s adapter form (else: HF name -> array)."""
    return isinstance(weights, dict) and "adapter_config" in weights


def export_push(model: torch.nn.Module, config, *, rank: int, adapter: bool) -> dict | None:
    """What the separate rollout group loads after an update, as numpy for the object store: the
    adapter ({"adapter": {PEFT name: array}, "adapter_config": {...}}) or every weight merged (HF name
    -> array, rlctl.workers.rollout.weights.engine_weights). Every rank joins the gathers; rank 0
    returns the push (the others None)."""
    from rlctl.workers.rollout.weights import engine_weights

    out = {}
    for name, tensor in adapter_tensors(model) if adapter else engine_weights(model):   # every rank: the gathers
        if rank == 0:
            out[name] = tensor.detach().to("cpu", torch.float32).numpy()
    if rank != 0:
        return None
    return {"adapter": out, "adapter_config": adapter_config(model, config.model.lora, config.model.path)} \
        if adapter else out


def push_mb(weights: dict) -> float:
    """10^6 bytes of arrays in a push to the separate rollout group (either form)."""
    arrays = weights["adapter"] if is_adapter_push(weights) else weights
    return sum(a.nbytes for a in arrays.values()) / 1e6


def adapter_config(model: torch.nn.Module, lora_cfg, base_path: str) -> dict:
    """adapter_config.json for `model`'s adapter: the modules that carry one, by leaf name."""
    targets = sorted({hf_name(n).rpartition(".")[2] for n, m in model.named_modules() if hasattr(m, "lora_A")})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(lora_cfg.rank), "lora_alpha": float(lora_cfg.alpha),
            "target_modules": targets, "bias": "none", "use_rslora": False, "use_dora": False,
            "base_model_name_or_path": base_path, "modules_to_save": None}


def adapter_root() -> Path:
    """Where this process writes its adapter folders: tmpfs when the machine has one (no disk I/O)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="rlctl-adapters-", dir=base))


def write_adapter(root: Path, name: str, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """The PEFT folder root/name, complete or absent: written under a temporary name, then renamed."""
    from safetensors.torch import save_file

    tmp, final = root / f".{name}.tmp", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "adapter_model.safetensors"))
    (tmp / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final


def adapter_sync_on(config, model: torch.nn.Module, targets: list[str] | None = None) -> bool:
    """Whether this run pushes the adapter alone to an engine with its own weights (the trainer's
    peft `model`, or a plain one with `targets`, as `model_refusal` takes them: the same refusals
    validate reported, so the run does what validate said)."""
    lora = config.model.lora
    return (lora.rank > 0 and lora.sync == "adapter" and config_refusal(config) is None
            and model_refusal(model, targets) is None)


def push_weights(engine, model: torch.nn.Module, config, *, adapter: bool, version: int,
                 dtype: torch.dtype | None) -> dict[str, float]:
    """Give `engine` the trained weights: the adapter alone, or the merged model (rlctl.workers.rollout.
    weights.engine_weights). Call on every rank (FSDP shards are gathered). Returns weight_sync_s and
    weight_sync_mb (10^6 bytes of tensors sent, in the engine's dtype)."""
    from rlctl.workers.rollout.weights import engine_weights

    start, sent = time.perf_counter(), [0]

    def counted(items):
        for name, tensor in items:
            sent[0] += tensor.numel() * tensor.element_size()
            yield name, tensor

    if adapter:
        tensors = dict(counted(adapter_tensors(model, dtype)))
        engine.update_adapter(tensors, adapter_config(model, config.model.lora, config.model.path), version)
    else:
        engine.update_weights(counted(engine_weights(model, dtype=dtype)))
    return {"weight_sync_s": time.perf_counter() - start, "weight_sync_mb": sent[0] / 1e6}
