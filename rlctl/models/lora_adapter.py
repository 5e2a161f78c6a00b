"""A PEFT LoRA adapter folder read into plain tensors, and the checks that it fits a base model.

A folder holds `adapter_config.json` (r, lora_alpha, target_modules, base_model_name_or_path, ...)
and `adapter_model.safetensors` with `base_model.model.<module>.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r]. What an engine applies per module is delta(x) = s * (x A^T) B^T with
s = alpha / r (alpha / sqrt(r) with rslora); the scale is folded into B here, once.

Only what both serving engines (the built-in one and vLLM) apply unmerged is accepted: LoRA on
linear layers, without DoRA, trained biases, `modules_to_save` or per-module rank/alpha patterns.
Anything else is a DataError naming the feature, with `rlctl merge`'s merged folder as the way out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.errors import DataError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# vLLM's max_lora_rank must be one of these (vllm.config.lora.MaxLoRARanks); an adapter of a larger
# rank cannot be served by it at all
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class LoraAdapter:
    name: str
    path: Path
    rank: int
    base: str                    # adapter_config's base_model_name_or_path ("" if unset)
    # module name in the base model -> (A [r, in], scale * B [out, r])
    weights: dict = field(default_factory=dict, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def _refusal(name: str, path: Path, what: str) -> DataError:
    return DataError(f"adapter {name!r} ({path}) {what}, which rlctl serves only merged",
                     hint="serve the merged model instead (`rlctl merge RUN --to-hf OUT` writes it)")


def read_config(name: str, path: Path) -> dict:
    """adapter_config.json, with every feature the unmerged engines cannot apply refused."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise DataError(f"adapter {name!r}: {path} has no {CONFIG_FILE}",
                        hint="pass a PEFT adapter folder (`rlctl merge RUN --to-hf OUT --lora adapter` writes one)")
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"adapter {name!r}: cannot read {file}: {e}") from None
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise _refusal(name, path, f"is a {cfg.get('peft_type')} adapter, not LoRA")
    for key, what in (("use_dora", "uses DoRA"), ("modules_to_save", "trains whole modules (modules_to_save)"),
                      ("rank_pattern", "has per-module ranks (rank_pattern)"),
                      ("alpha_pattern", "has per-module alphas (alpha_pattern)"),
                      ("fan_in_fan_out", "is for Conv1D layers (fan_in_fan_out)"), ("lora_bias", "trains LoRA biases (lora_bias)"),
                      ("target_parameters", "adapts expert banks (target_parameters)")):
        if cfg.get(key):
            raise _refusal(name, path, what)
    if cfg.get("bias", "none") != "none":
        raise _refusal(name, path, f"trains biases (bias = {cfg['bias']!r})")
    if not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        raise DataError(f"adapter {name!r}: {file} has no positive integer 'r'")
    return cfg


def read_adapter(name: str, path: str | Path, dtype=None) -> LoraAdapter:
    """The adapter at `path` as {module: (A, s * B)} (in `dtype`, default as stored)."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg = read_config(name, path)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise DataError(f"adapter {name!r}: {path} has no {WEIGHTS_FILE}",
                        hint="save the adapter with safetensors (peft's save_pretrained does by default)")
    return adapter_from_tensors(name, path, cfg, load_file(str(file)), dtype)


def adapter_from_tensors(name: str, path: Path, cfg: dict, tensors: dict, dtype=None) -> LoraAdapter:
    """The adapter of `cfg` (adapter_config.json's keys) and its PEFT-named tensors, as {module: (A, s * B)}:
    read from a folder, or taken from a live peft model (get_peft_model_state_dict)."""
    file = Path(path) / WEIGHTS_FILE
    rank, alpha = cfg["r"], float(cfg.get("lora_alpha", cfg["r"]))
    scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    pairs: dict[str, dict] = {}
    for key, t in tensors.items():
        module, _, kind = key.removeprefix(_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight"):
            raise _refusal(name, path, f"holds {key}, not a lora_A/lora_B weight of a linear layer")
        pairs.setdefault(module, {})[kind[0]] = t
    weights = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise DataError(f"adapter {name!r}: {module} has lora_{next(iter(ab))} without its pair in {file}")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise DataError(f"adapter {name!r}: {module} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                            "not [r, in] and [out, r]")
        a, b = (a, b * scale) if dtype is None else (a.to(dtype), (b.float() * scale).to(dtype))
        weights[module] = (a, b)
    if not weights:
        raise DataError(f"adapter {name!r}: {file} holds no LoRA weights")
    ranks = {a.shape[0] for a, _ in weights.values()}
    return LoraAdapter(name, path, max(ranks), str(cfg.get("base_model_name_or_path") or ""), weights)


def fit_problem(adapter: LoraAdapter, base) -> str | None:
    """Why `adapter` cannot be applied to the torch model `base` (real or on the meta device), or None:
    a module it adapts that the base lacks or that is not a linear layer, or a shape that differs."""
    import torch

    modules = dict(base.named_modules())
    for module, (a, b) in adapter.weights.items():
        layer = modules.get(module)
        if not isinstance(layer, torch.nn.Linear):
            what = "has no such layer" if layer is None else f"has a {type(layer).__name__} there, not a linear layer"
            return f"adapts {module}, but the base model {what}"
        want = (layer.out_features, layer.in_features)
        if (b.shape[0], a.shape[1]) != want:
            return (f"adapts {module} as [{b.shape[0]}, {a.shape[1]}] but the base model's layer is "
                    f"[{want[0]}, {want[1]}]")
    return None


def check_fits(adapter: LoraAdapter, base, base_name: str) -> None:
    """DataError (one line) when the adapter was made for another model than `base` (named base_name)."""
    problem = fit_problem(adapter, base)
    if problem:
        trained_on = f" (it was trained on {adapter.base})" if adapter.base else ""
        raise DataError(f"adapter {adapter.name!r} does not fit {base_name}{trained_on}: it {problem}",
                        hint="serve it on the model it was trained from")


def vllm_rank(ranks: list[int], requested: int | None) -> int:
    """The max_lora_rank to give vLLM: `requested`, else the smallest allowed value that holds every
    adapter (at least vLLM's default 16). DataError for an adapter above vLLM's largest rank."""
    top = max(ranks, default=0)
    if top > VLLM_RANKS[-1]:
        raise DataError(f"an adapter has rank {top}; vLLM serves ranks up to {VLLM_RANKS[-1]}",
                        hint="serve it with --engine hf, or merge it (`rlctl merge RUN --to-hf OUT`)")
    if requested is not None:
        return requested
    return next(r for r in VLLM_RANKS if r >= max(top, 16))
