"""Which layers get LoRA adapters, and a check that model.lora.target_modules fits the model.

peft matches a list of names by suffix (`q_proj` matches `model.layers.0.self_attn.q_proj`) and
stays silent about a name that matches nothing as long as one other name matched: on Phi-3
(fused `qkv_proj`, `gate_up_proj`) the usual seven Llama names gave adapters to `o_proj` and
`down_proj` only. So every name must match a layer of the model (error otherwise, with the
model's own layer names). The default, "all-linear", is peft's: every linear layer of the
decoder except the output head; on MoE models peft also adapts the experts' fused weight banks.

validate runs the check on a meta-device model built from config.json (no weights read); the
worker runs it again on the real model, for models validate could not see (a hub id).
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from typing import Iterator

import torch

from rlctl.errors import ConfigError

ALL_LINEAR = "all-linear"
# transformers 5 fuses MoE experts into 3-D banks (`experts.gate_up_proj` [E, 2I, H],
# `experts.down_proj`); peft maps the per-expert names of transformers 4 onto them.
_EXPERT_BANK_ALIASES = {"gate_up_proj": ("gate_proj", "up_proj", "w1", "w3"), "down_proj": ("down_proj", "w2")}


def is_all_linear(targets) -> bool:
    return [str(t).lower() for t in targets] == [ALL_LINEAR]


def peft_targets(targets, model: torch.nn.Module | None = None) -> str | list[str]:
    """target_modules as peft takes it: the "all-linear" string, or the list of names. On a
    vision-language `model`, "all-linear" is the language model's linear layers by full name:
    peft's own "all-linear" would also adapt the vision tower (its MLP shares the LM's names)."""
    if not is_all_linear(targets):
        return list(targets)
    from rlctl.workers.compute.vision import language_model_linears

    return (language_model_linears(model) if model is not None else None) or ALL_LINEAR


def _adaptable(model: torch.nn.Module) -> dict[str, str]:
    """{full name: kind} of what LoRA can wrap: linear layers and embeddings ("module"), and MoE
    expert banks, 3-D parameters ("bank")."""
    from transformers.pytorch_utils import Conv1D

    found = {name: "module" for name, m in model.named_modules()
             if isinstance(m, (torch.nn.Linear, torch.nn.Embedding, Conv1D))}
    found.update({name: "bank" for name, p in model.named_parameters() if p.dim() == 3})
    return found


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """The distinct leaf names of the decoder's linear layers and expert banks, in model order,
    without the output head (what "all-linear" adapts): the words a user can put in the list."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = {name for name, m in model.named_modules() if head is not None and m is head}
    names: dict[str, None] = {}
    for name, kind in _adaptable(model).items():
        module = model.get_submodule(name) if kind == "module" else None
        if name in skip or isinstance(module, torch.nn.Embedding):
            continue
        names[name.rpartition(".")[2]] = None
    return list(names)


def _matches(target: str, name: str, kind: str) -> bool:
    if name == target or name.endswith("." + target):
        return True
    leaf = name.rpartition(".")[2]
    return kind == "bank" and target in _EXPERT_BANK_ALIASES.get(leaf, ())


def unmatched_targets(model: torch.nn.Module, targets) -> list[str]:
    """The names in `targets` that match no layer of `model` (none for "all-linear")."""
    if is_all_linear(targets):
        return []
    adaptable = _adaptable(model)
    return [t for t in targets if not any(_matches(t, name, kind) for name, kind in adaptable.items())]


def adapted_modules(model: torch.nn.Module, targets) -> list[str]:
    """Full names of the modules `targets` gives adapters (an expert bank: the module holding it);
    "all-linear": every linear layer and bank but the output head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out: dict[str, None] = {}
    for name, kind in _adaptable(model).items():
        module = model.get_submodule(name) if kind == "module" else None
        if is_all_linear(targets):
            if module is head or isinstance(module, torch.nn.Embedding):
                continue
        elif not any(_matches(t, name, kind) for t in targets):
            continue
        out[name if kind == "module" else name.rpartition(".")[0]] = None
    return list(out)


def _fused_into(target: str, name: str) -> bool:
    """q_proj -> qkv_proj, up_proj -> gate_up_proj: the fused layer that holds `target`'s weights."""
    part, whole = target.removesuffix("_proj"), name.removesuffix("_proj")
    if part == whole or not name.endswith("_proj"):
        return False
    return part in whole.split("_") or (len(part) == 1 and whole.isalpha() and part in whole)


def mismatch_message(model: torch.nn.Module, targets) -> str | None:
    """One line naming the targets that match nothing and the model's own layer names, or None."""
    missing = unmatched_targets(model, targets)
    if not missing:
        return None
    names = linear_layer_names(model)
    hints: dict[str, None] = {}
    for t in missing:
        fused = [n for n in names if _fused_into(t, n)]
        hints.update(dict.fromkeys(fused or difflib.get_close_matches(t, names, n=1, cutoff=0.75)))
    matched = [t for t in targets if t not in missing]
    got = f"only {', '.join(matched)} would get adapters; " if matched else ""
    mean = f"did you mean {', '.join(hints)}, or " if hints else "use "
    return (f"{', '.join(missing)} match no layer of {type(model).__name__} ({got}its linear layers are "
            f"{', '.join(names)}); {mean}[\"{ALL_LINEAR}\"] for all of them")


@contextlib.contextmanager
def quiet_moe_patterns() -> Iterator[None]:
    """MoE models: peft maps the per-expert names onto the fused expert banks and leaves a rank/alpha
    pattern for `gate_up_proj` that applies only to modules, then warns (at every load) that it
    matched none. The adapters are the same either way; the warning is noise to a user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The following (rank|alpha)_pattern keys did not match",
                                category=RuntimeWarning)
        yield


def meta_model(path: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """The architecture at `path` (config.json only) on the meta device: names and shapes, no memory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from rlctl.models.loading import quiet_transformers

    quiet_transformers()
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=trust_remote_code)


def check_targets(model: torch.nn.Module, lora_cfg) -> None:
    """Refuse a target list that leaves some of its names without a layer (train start)."""
    message = mismatch_message(model, lora_cfg.target_modules)
    if message:
        raise ConfigError(f"model.lora.target_modules: {message}",
                          hint="fix model.lora.target_modules in rlctl.toml (`rlctl config validate` shows it too)")


def pin_adapted_targets(peft_model, adapter: str = "default") -> None:
    """Make the adapter's config list exactly the modules that carry adapters (full names, as peft
    itself writes for "all-linear"), so a saved adapter_config.json says what was trained and
    loads back onto the same modules. Expert banks stay in peft's `target_parameters`."""
    banks = {name.rpartition(".")[0] for name in getattr(peft_model, "targeted_parameter_names", []) or []}
    modules = set(peft_model.targeted_module_names) - banks
    peft_model.peft_config[adapter].target_modules = sorted(modules)
