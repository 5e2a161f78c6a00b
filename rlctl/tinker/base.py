"""One base model the server may train on: its weights loaded once, every training client's LoRA
adapter living beside them as a named peft adapter, and a sampling engine over the same weights
(rlctl.tinker.sampling) whose adapter slots hold the samplers' snapshots.

All training runs on the server's one worker thread (rlctl.tinker.futures), so switching the
active adapter is never raced. Gradients land only on the active adapter's tensors, so two
training clients' accumulated gradients and optimizer states never mix; base weights stay frozen.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("rlctl.tinker")
LORA_ALPHA = 32       # Tinker's adapters are scaled alpha / rank with alpha = 32 (docs/tinker.md)


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    def as_dict(self) -> dict:
        return dict(rank=self.rank, seed=self.seed, train_mlp=self.train_mlp, train_attn=self.train_attn,
                    train_unembed=self.train_unembed)


class BaseModel:
    """`name` is what clients send as base_model; `path` the local Hugging Face folder."""

    def __init__(self, name: str, path: Path, sampler_slots: int = 8):
        from rlctl.models.loading import load_tokenizer
        from rlctl.serve.source import load_model
        from rlctl.tinker.sampling import start_engine
        from rlctl.workers.compute.models import eos_token_ids

        self.name, self.path = name, Path(path)
        model, _ = load_model(self.path, "float32", device="cpu")
        self.tokenizer = load_tokenizer(str(self.path))
        self.eos_token_ids = eos_token_ids(str(self.path), self.tokenizer)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 20)
        self.arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
        for p in model.parameters():
            p.requires_grad_(False)
        self._linear_kinds = linear_kinds(model)   # read before peft wraps the layers
        self.engine = start_engine(model, self.tokenizer, name, sampler_slots)
        self.model = model          # becomes a peft model with the first adapter
        self._serial = 0

    def new_adapter_name(self, kind: str) -> str:
        self._serial += 1
        return f"tinker_{kind}{self._serial}"

    def add_adapter(self, name: str, spec: LoraSpec) -> list[torch.nn.Parameter]:
        """A fresh adapter (lora_B = 0, so it starts as the base model); its trainable tensors in
        a fixed order (optimizer state saved by one process loads into another)."""
        from peft import LoraConfig

        config = LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                            target_modules=self._targets(spec), task_type="CAUSAL_LM")
        rng = torch.random.fork_rng() if spec.seed is not None else contextlib.nullcontext()
        with rng:
            if spec.seed is not None:
                torch.manual_seed(spec.seed)
            self.attach(name, config)
        return self.adapter_params(name)

    def attach(self, name: str, config) -> None:
        """Add a peft adapter under `name` (the first one wraps the model). Its config names the base
        folder, so a saved adapter opens on its own (peft records it for the first adapter only)."""
        from peft import PeftModel, get_peft_model

        config.base_model_name_or_path = str(self.path.resolve())
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(name, config)
        else:
            self.model = get_peft_model(self.model, config, adapter_name=name)

    def adapter_params(self, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.model.named_parameters() if f".{name}." in n and ".lora_" in n]

    def delete_adapter(self, name: str) -> None:
        self.model.delete_adapter(name)

    def adapter_count(self) -> int:
        """Training adapters the model holds now."""
        return len(getattr(self.model, "peft_config", {}))

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=name, save_embedding_layers=False).items()}

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state, adapter_name=name)
        missing = [k for k in getattr(result, "unexpected_keys", []) if ".lora_" in k]
        if missing:
            raise ValueError(f"{len(missing)} adapter tensors do not fit this adapter (first: {missing[0]})")

    def adapter_config(self, name: str):
        return self.model.peft_config[name]

    def snapshot(self, name: str, sampler_id: str):
        """A copy of training adapter `name` for the sampling engine (rlctl.models.lora_adapter.LoraAdapter)."""
        from rlctl.models.lora_adapter import adapter_from_tensors

        return adapter_from_tensors(sampler_id, self.path, self.adapter_config(name).to_dict(), self.adapter_state(name))

    @contextlib.contextmanager
    def active(self, adapter: str):
        """Run the training model with `adapter` on."""
        self.model.set_adapter(adapter)
        yield self.model

    def _targets(self, spec: LoraSpec) -> list[str]:
        """Leaf names of the linear layers the spec trains: attention, MLP, the output head."""
        names = [n for kind, layer_names in self._linear_kinds.items() if getattr(spec, f"train_{kind}")
                 for n in layer_names]
        if not names:
            raise ValueError("the LoRA config trains no layer of this model")
        return list(dict.fromkeys(names))

    def target_log_probs(self, model, rows: list[torch.Tensor], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        """log p(targets[i][t] | rows[i][:t+1]) for every row, [N_i] float32 each: one right-padded
        forward over the batch (padding sits after every real token, so causal attention never sees it)."""
        from rlctl.workers.compute.vocab_logprob import token_log_probs

        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = r, 1
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return [token_log_probs(logits[i, :len(r)], targets[i])[0] for i, r in enumerate(rows)]


def linear_kinds(model: torch.nn.Module) -> dict[str, list[str]]:
    """{"attn" | "mlp" | "unembed": leaf names of the plain model's linear layers of that kind}."""
    head = model.get_output_embeddings()
    kinds: dict[str, list[str]] = {"attn": [], "mlp": [], "unembed": []}
    for full, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        leaf = full.rpartition(".")[2]
        kind = "unembed" if module is head else "attn" if ".self_attn." in full else "mlp" if ".mlp." in full else None
        if kind and leaf not in kinds[kind]:
            kinds[kind].append(leaf)
    return kinds
