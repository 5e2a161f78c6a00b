"""The trained policy's weights as the Hugging Face checkpoint names a GPU engine loads.

vLLM's and SGLang's `load_weights` take (name, tensor) pairs named as in the model's HF
safetensors (`model.layers.0.self_attn.q_proj.weight`, ...) and fuse q/k/v and gate/up
themselves. The module the actor trains is named differently:
    FSDP2 / torch.compile / checkpoint wrappers   `_orig_mod.`, `_fsdp_wrapped_module.`, ...
    peft LoRA                                     `base_model.model.` + `<layer>.base_layer.weight`
                                                  + `lora_A/lora_B` (merged here: W + s * B @ A)
    peft LoRA on MoE expert banks (3-D weights)   `experts.base_layer.base_layer.gate_up_proj`:
                                                  one wrapper per targeted bank, nested; each adds
                                                  its per-expert delta to its own bank
    expert parallelism (ep > 1)                   each rank holds E/ep experts of every bank: the
                                                  bank is gathered whole before it leaves
MoE banks leave in transformers 5's fused layout (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]), which vLLM's fused-MoE loader takes as it is. Tied embeddings exist once (`lm_head.weight` is
the embedding; engines tie it themselves).
`engine_weights` streams one tensor at a time, cast to the engine's dtype, so a sync never holds
a second full copy of the model.
"""

from __future__ import annotations

import re
from typing import Iterator

import torch

_WRAPPER_SEGMENTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_PEFT_PREFIX = "base_model.model."


def hf_name(name: str) -> str:
    """A trained module's parameter name -> its HF checkpoint name (wrappers and peft removed)."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX):]
    return _BASE_LAYERS.sub(".", name)


_BASE_LAYERS = re.compile(r"(?:\.base_layer)+\.")


def _full(t: torch.Tensor) -> torch.Tensor:
    """A whole tensor: FSDP2 DTensor shards are gathered (a collective: every rank, same order)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _lora_delta(module: torch.nn.Module) -> torch.Tensor | None:
    """Sum over a peft LoRA layer's active adapters of scaling * B @ A ([out, in]), from whole
    tensors (so sharded A and B work too)."""
    adapters = [a for a in getattr(module, "active_adapters", []) if a in getattr(module, "lora_A", {})]
    if any(getattr(module, "use_dora", {}).get(a) for a in adapters):
        raise NotImplementedError("DoRA adapters cannot be synced to a GPU engine; use plain LoRA")
    delta = None
    for a in adapters:
        d = (_full(module.lora_B[a].weight) @ _full(module.lora_A[a].weight)) * module.scaling[a]
        d = d.T if getattr(module, "fan_in_fan_out", False) else d
        delta = d if delta is None else delta + d
    return delta


def _bank_delta(wrapper: torch.nn.Module) -> torch.Tensor | None:
    """peft's delta for the parameter a ParamWrapper adapts (an expert bank [E, ., .] or a router
    weight), summed over active adapters. peft's own get_delta_weight does the per-expert reshape;
    it runs on whole A and B (FSDP2 shards are gathered first and put back afterwards)."""
    adapters = [a for a in getattr(wrapper, "active_adapters", []) if a in getattr(wrapper, "lora_A", {})]
    delta = None
    for a in adapters:
        layers = (wrapper.lora_A[a], wrapper.lora_B[a])
        sharded = [layer._parameters["weight"] for layer in layers]
        try:
            for layer, param in zip(layers, sharded):
                layer._parameters["weight"] = torch.nn.Parameter(_full(param.detach()), requires_grad=False)
            d = wrapper.get_delta_weight(a)
        finally:
            for layer, param in zip(layers, sharded):
                layer._parameters["weight"] = param
        delta = d if delta is None else delta + d
    return delta


def _param_delta(modules: dict, name: str) -> torch.Tensor | None:
    """The LoRA delta for the parameter `name`: from the peft layer right above it (`<layer>.base_layer.weight`),
    or from the ParamWrapper, among the nested ones above it, that targets this parameter."""
    parts = name.split(".")
    leaf = parts[-1]
    cuts = [i for i, part in enumerate(parts) if part == "base_layer"]  # each owner ends before one
    for cut in cuts:
        owner = modules.get(".".join(parts[:cut]))
        if owner is None or not hasattr(owner, "lora_A"):
            continue
        if hasattr(owner, "parameter_name"):   # peft's ParamWrapper (target_parameters)
            if owner.parameter_name == leaf:
                return _bank_delta(owner)
        elif cut == len(parts) - 2 and leaf == "weight":
            return _lora_delta(owner)
    return None


def engine_weights(model: torch.nn.Module, *, dtype: torch.dtype | None = None,
                   tied_embeddings: bool | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every weight an inference engine needs, LoRA merged.

    Call on every rank, in the same order: inside `rlctl.workers.parallel.fsdp.whole_weights(model)` the
    parameters are whole (no per-tensor collectives); outside it DTensors and expert-parallel banks
    are gathered one by one (rlctl.workers.parallel.expert_parallel.whole_parameter). `dtype`: the engine's
    (None = as trained). `tied_embeddings`: drop `lm_head.weight` (None = the model config's).
    """
    if tied_embeddings is None:
        config = getattr(model, "config", None)
        tied_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    from rlctl.workers.parallel.expert_parallel import whole_parameter

    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        if ".lora_" in name or name.endswith(".lora_magnitude_vector"):
            continue
        out = hf_name(name)
        if tied_embeddings and out == "lm_head.weight":
            continue
        tensor = whole_parameter(modules, name, _full(param.detach()))   # expert-parallel banks: every expert
        delta = _param_delta(modules, name)
        if delta is not None:
            tensor = tensor + delta.detach().to(tensor.dtype)
        yield out, tensor.to(dtype) if dtype is not None else tensor
