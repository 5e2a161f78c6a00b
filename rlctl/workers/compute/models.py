"""Loading the models the workers train: the policy (+ LoRA) and the critic (tokenizers: rlctl.models.loading)."""

from __future__ import annotations

import weakref

import torch

from rlctl.errors import DataError
from rlctl.models.loading import quiet_transformers


def _check_path(path: str, what: str) -> None:
    """The controller resolved model.path already (rlctl.models.hub); this catches a worker on
    another node, where the folder or the cache may be missing."""
    from rlctl.models.hub import resolve_model

    resolve_model(path, key=what)


def load_causal_lm(model_cfg, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The HF causal LM at model.path in `dtype` (float32 for trained masters); a vision-language
    model (its config has a vision_config: Qwen2.5-VL, Qwen3-VL, Gemma 3) through
    AutoModelForImageTextToText, the class that holds its vision tower."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    quiet_transformers()
    _check_path(model_cfg.path, "model.path")
    try:
        config = AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
        auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
        return auto.from_pretrained(model_cfg.path, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
    except OSError as err:
        raise DataError(f"cannot load the model at {model_cfg.path!r}: {str(err).splitlines()[0]}",
                        hint="check model.path (offline runs need a local folder)") from None


def load_value_model(path: str, model_cfg, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The base model with a Linear(hidden, 1) value head (`score`), no head dropout; a
    vision-language model: vision_value_model."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    quiet_transformers()
    _check_path(path, "critic.model_path / model.path")
    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    if getattr(config, "vision_config", None) is not None:
        return vision_value_model(path, model_cfg, dtype)
    config.num_labels, config.classifier_dropout = 1, 0.0
    try:
        return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype,
                                                               trust_remote_code=model_cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot load {path!r} as a critic: {str(err).splitlines()[0]}",
                        hint="the critic needs a model class with a token-classification head") from None


def vision_value_model(path: str, model_cfg, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A vision-language critic: the model as the policy loads it (AutoModelForImageTextToText:
    vision tower, M-RoPE, the vision inputs its forward takes) with `lm_head` replaced by a
    Linear(hidden, 1) value head initialised as the token-classification head of a text critic
    (normal(0, initializer_range), bias 0), untied from the embedding. transformers has no
    token-classification class for these models; its output `logits` [b, L, 1] are the values."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
    text = model.config.get_text_config()
    model.config.tie_word_embeddings = text.tie_word_embeddings = False   # never re-tied to the embedding
    head = torch.nn.Linear(text.hidden_size, 1, dtype=dtype)
    torch.nn.init.normal_(head.weight, std=text.initializer_range)
    torch.nn.init.zeros_(head.bias)
    model.lm_head = head
    return model


def lora_config(lora_cfg, model: torch.nn.Module | None = None):
    from peft import LoraConfig

    from rlctl.workers.compute.lora import peft_targets

    return LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                      target_modules=peft_targets(lora_cfg.target_modules, model), task_type="CAUSAL_LM", bias="none")


def apply_lora(model: torch.nn.Module, lora_cfg) -> torch.nn.Module:
    """Wrap with peft adapters; only the adapters train, the base weights stay frozen (a
    vision-language model's "all-linear": the language model's projections, rlctl.workers.compute.lora)."""
    from peft import get_peft_model

    from rlctl.workers.compute.lora import quiet_moe_patterns

    with quiet_moe_patterns():
        return get_peft_model(model, lora_config(lora_cfg, model))


# Several LoRA runs on one base (rlctl.controller.group): the base each process loaded, by
# (model.path, trust_remote_code), alive while a run's worker holds it (ActorRolloutRefWorker.base).
_SHARED_BASES: "weakref.WeakValueDictionary[tuple, torch.nn.Module]" = weakref.WeakValueDictionary()


def shared_base(model_cfg) -> torch.nn.Module:
    """The frozen float32 base at model.path, loaded once per process for every run that shares it."""
    key = (model_cfg.path, model_cfg.trust_remote_code)
    base = _SHARED_BASES.get(key)
    if base is None:
        base = _SHARED_BASES[key] = load_causal_lm(model_cfg)
        base.requires_grad_(False)
    return base


def on_shared_weights(base: torch.nn.Module) -> torch.nn.Module:
    """A new module tree over the same parameter and buffer tensors as `base` (tied weights stay
    tied): peft wraps this tree's layers with one run's adapters, so each run's model is
    the one it would train alone, while the base's memory is held once. A fresh memo per copy:
    deepcopy fills it with every module it copied."""
    import copy
    import itertools

    return copy.deepcopy(base, {id(t): t for t in itertools.chain(base.parameters(), base.buffers())})


def policy_engine(config, total_steps: int, base: torch.nn.Module | None = None):
    """The policy's TrainEngine, the one built for RL's actor and for SFT (an SFT checkpoint is resumed,
    merged and trained on as an actor checkpoint): model.path, LoRA adapters (seeded by run.seed: the
    same init on every rank), AdamW and the schedule over total_steps, split over the ranks by
    actor.expert_parallel_size and actor.ulysses_sequence_parallel_size. `base`: a LoRA run's
    adapters go on a tree sharing that model's weights (shared_base) instead of a copy of its own."""
    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.compute.lora import check_targets
    from rlctl.workers.parallel import fsdp

    torch.manual_seed(config.run.seed)   # loading draws nothing from it: the adapters' init is the same either way
    model = load_causal_lm(config.model) if base is None else on_shared_weights(base)
    if config.model.freeze_vision_tower:
        from rlctl.workers.compute.vision import freeze_vision_tower

        freeze_vision_tower(model)
    if config.model.lora.rank > 0:
        check_targets(model, config.model.lora)   # validate cannot see a hub model's layers
        model = apply_lora(model, config.model.lora)
    return TrainEngine(model, OptimSpec.for_actor(config.actor, total_steps),
                       compute_dtype=fsdp.resolve_dtype(config.model.dtype),
                       gradient_checkpointing=config.model.gradient_checkpointing,
                       expert_parallel_size=config.actor.expert_parallel_size,
                       sequence_parallel_size=config.actor.ulysses_sequence_parallel_size)


def eos_token_ids(path: str, tokenizer) -> list[int]:
    """Stop tokens: the generation config's eos ids (chat models list several), else the tokenizer's."""
    from transformers import GenerationConfig

    ids: list[int] = []
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return [int(i) for i in ids]
