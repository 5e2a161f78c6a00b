"""The training engine: a transformers model under FSDP2 with AdamW, LR schedule and clipping.

One engine per trained model (the actor's policy, the critic). The engine owns what every
trainer needs and nothing algorithm-specific: the loss is a function handed to
`train_mini_batch`, which runs gradient accumulation over micro-batches, clips the global
gradient norm and skips the optimizer step when that norm is not finite (weights unchanged).

It also owns how the model's work is split over the ranks beyond data parallelism
(docs/parallelism.md): expert parallelism (MoE expert banks split over groups of ranks,
rlctl.workers.parallel.expert_parallel) and sequence parallelism (`sp`: a packed micro-batch split along
the sequence over groups of ranks, rlctl.workers.parallel.ulysses). Both groups are built here; the sp
group is handed to each pass that runs the model (`sp=engine.sp`, `engine.group_rows`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from rlctl.workers.compute import shared_prompt
from rlctl.workers.compute.checkpoint_io import load_engine, save_engine
from rlctl.workers.parallel import fsdp, ulysses


@dataclass(frozen=True)
class OptimSpec:
    """AdamW + schedule settings, from [actor] or [critic]."""

    lr: float
    weight_decay: float
    grad_clip: float
    warmup_steps: int
    total_steps: int
    schedule: str = "constant"      # "constant" | "cosine" after warm-up
    min_lr_ratio: float = 0.0       # cosine floor as a fraction of lr
    state_dtype: str = "float32"    # AdamW's moments: "float32" (torch's fused AdamW) | "bfloat16" (BF16StateAdamW)

    @classmethod
    def for_actor(cls, actor, total_steps: int) -> "OptimSpec":
        return cls(lr=actor.lr, weight_decay=actor.weight_decay, grad_clip=actor.grad_clip,
                   warmup_steps=actor.warmup_steps, total_steps=total_steps, schedule=actor.lr_schedule,
                   min_lr_ratio=actor.min_lr_ratio, state_dtype=actor.optimizer_state_dtype)

    @classmethod
    def for_critic(cls, critic, total_steps: int) -> "OptimSpec":
        return cls(lr=critic.lr, weight_decay=critic.weight_decay, grad_clip=critic.grad_clip,
                   warmup_steps=critic.warmup_steps, total_steps=total_steps)


def lr_factor(step: int, spec: OptimSpec) -> float:
    """LR multiplier at training step `step` (0-based).

    Warm-up ramps linearly to 1 over warmup_steps ((step+1)/warmup, so no step runs at lr 0);
    then constant, or cosine from 1 down to min_lr_ratio at total_steps.
    """
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.schedule != "cosine" or spec.total_steps <= spec.warmup_steps:
        return 1.0
    progress = min(1.0, (step - spec.warmup_steps) / (spec.total_steps - spec.warmup_steps))
    return spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def checkpointing_kwargs(model: torch.nn.Module) -> dict:
    """torch.utils.checkpoint arguments: layers that ran shared-prompt or Ulysses attention
    recompute with it in backward (rlctl.workers.compute.shared_prompt, rlctl.workers.parallel.ulysses)."""
    kwargs = shared_prompt.checkpoint_kwargs(model)
    kwargs["context_fn"] = ulysses.recompute_with_routing(kwargs["context_fn"], model)
    return kwargs


def sequence_group(size: int, model: torch.nn.Module, key: str) -> ulysses.SPGroup | None:
    """This rank's sequence-parallel group of `size` consecutive ranks for `model` (None when 1),
    after the checks validate makes (rlctl.workers.parallel.ulysses_checks), repeated for a model that was
    not on disk then; `key` names the config key in errors. The engine's, and a frozen model's
    outside an engine (a distillation teacher, at the student's size)."""
    return ulysses.build_group(size, model, fsdp.rank_and_world()[1], key)


def hold_frozen(model: torch.nn.Module, dtype: torch.dtype, *, one_rank: bool) -> None:
    """A frozen model (a reference) held in `dtype` where the run computes in it. On one rank its passes then
    run under autocast as the trained policy's do, on the same numbers: its matrices in `dtype` are what
    autocast casts the policy's float32 masters to, and the input embeddings and the vectors (norm
    weights, biases) stay float32, so the residual stream is float32 as the policy's is. At equal weights
    the two give the same log-probs (a step-0 KL of 0, where a pure-bf16 pass is off by its rounding); the
    copy takes half a float32 one's bytes but for the embeddings. With > 1 rank FSDP's mixed
    precision runs the policy in pure `dtype` and needs one dtype per shard: all of it in `dtype`."""
    if dtype == torch.float32 or not one_rank:
        model.to(dtype)
        return
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()}
    for param in model.parameters():
        if param.dim() >= 2 and id(param) not in embeddings:
            param.data = param.data.to(dtype)


# A loss function gets one micro-batch (tensors on the device) and returns the micro-batch's share
# of the mini-batch loss (already normalised by mini-batch counts) and float metrics.
LossFn = Callable[[dict], "tuple[torch.Tensor, dict[str, float]]"]


class TrainEngine:
    """Wraps `model` (sharded when the group has > 1 rank) with its optimizer and scheduler.

    compute_dtype: the dtype forward/backward run in; parameters stay float32 masters when
    trained (FSDP all-gathers them in compute_dtype; one rank uses autocast). optim=None makes a
    frozen engine (a reference model) whose parameters are kept in compute_dtype.
    expert_parallel_size, sequence_parallel_size: the [actor] / [critic] keys (`parallel_key`
    names the table in errors); 1 = off.
    """

    def __init__(self, model: torch.nn.Module, optim: OptimSpec | None, *, compute_dtype: torch.dtype,
                 gradient_checkpointing: bool = False, expert_parallel_size: int = 1,
                 sequence_parallel_size: int = 1, parallel_key: str = "actor"):
        self.rank, self.world_size = fsdp.rank_and_world()
        self.compute_dtype, self.optim_spec = compute_dtype, optim
        self.device = fsdp.device()
        if optim is None:
            model.requires_grad_(False)
            hold_frozen(model, compute_dtype, one_rank=self.world_size == 1)
        elif gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs(model))
        # expert parallelism (MoE): this rank's share of the expert banks, left out of FSDP
        self.expert_groups, self.expert_params = None, []
        if expert_parallel_size > 1:
            from rlctl.workers.parallel import expert_parallel

            self.expert_groups = expert_parallel.new_groups(expert_parallel_size)
            self.expert_params = expert_parallel.split_experts(model, self.expert_groups)
        if self.world_size > 1:
            trained_in_low_precision = optim is not None and compute_dtype != torch.float32
            fsdp.shard(model, param_dtype=compute_dtype if trained_in_low_precision else None,
                       ignored=set(self.expert_params) or None)
        self.module = model.to(self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.dense_params = [p for p in self.params if not any(p is e for e in self.expert_params)]
        self.optimizer = self.scheduler = None
        self.train_steps = 0   # scheduler steps taken = training steps done
        # changes whenever the weights may have (an update, a checkpoint load): a rollout engine
        # with its own copy of the weights reloads them when this moved on
        self.weights_version = 0
        if optim is not None:
            # fused: one kernel over all parameters (CPU too): faster than the default foreach AdamW
            # step on CPU, the same update up to float rounding, the same state_dict. It runs per
            # parameter group and cannot mix DTensors with the plain expert banks: those get their own.
            groups = [{"params": self.dense_params}] + ([{"params": self.expert_params}] if self.expert_params else [])
            if optim.state_dtype == "bfloat16":   # half the moments' memory (rlctl.workers.compute.bf16_adamw)
                from rlctl.workers.compute.bf16_adamw import BF16StateAdamW

                self.optimizer = BF16StateAdamW(groups, lr=optim.lr, weight_decay=optim.weight_decay)
            else:
                self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, weight_decay=optim.weight_decay, fused=True)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, optim))
        model.train(optim is not None)
        # sequence parallelism (Ulysses): this rank's group of ranks that split each packed micro-batch
        self.sp = sequence_group(sequence_parallel_size, model, f"{parallel_key}.ulysses_sequence_parallel_size")

    @property
    def sp_size(self) -> int:
        """Ranks that split each sequence (1: sequence parallelism is off)."""
        return self.sp.size if self.sp is not None else 1

    def group_rows(self, batch, mini_batches: int = 1):
        """(rows, start, stop): the rows this rank's passes run on (sp > 1: its sp group's, the same on
        each of the group's ranks, mini-batch by mini-batch) and where its own shard sits in them."""
        return ulysses.group_rows(batch, self.sp, mini_batches)

    def frozen_twin(self, model: torch.nn.Module) -> "TrainEngine":
        """A frozen engine (a reference model) over `model`, in this engine's dtype, that runs its passes
        on this engine's sp group: the two are used on the same rows."""
        twin = TrainEngine(model, None, compute_dtype=self.compute_dtype)
        twin.sp = self.sp
        return twin

    # --- contexts ----------------------------------------------------------------------------
    def autocast(self):
        """One rank in bf16/fp16: autocast (FSDP applies its own mixed precision with > 1 rank), for a
        frozen engine too (hold_frozen)."""
        if self.world_size > 1 or self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @contextlib.contextmanager
    def inference(self) -> Iterator[torch.nn.Module]:
        """Eval mode, no grad, whole weights (no collectives per forward), restored afterwards."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), fsdp.whole_weights(self.module), self.autocast():
                yield self.module
        finally:
            self.module.train(was_training)

    # --- training ------------------------------------------------------------------------------
    def train_mini_batch(self, micro_batches: list[dict], loss_fn: LossFn) -> dict:
        """Accumulate gradients over `micro_batches`, clip, and take one optimizer step.

        Returns loss (sum of the micro-batch losses on this rank), grad_norm (global, before
        clipping), skipped (1.0 when the norm was not finite: no step, weights unchanged) and the
        per-micro-batch metric dicts under "micro".
        """
        if self.optimizer is None:
            raise RuntimeError("this engine is frozen (no optimizer); it cannot train")
        self.optimizer.zero_grad(set_to_none=True)
        self.weights_version += 1
        loss_sum, micro_metrics = 0.0, []
        for micro in micro_batches:
            with self.autocast():
                loss, metrics = loss_fn(micro)
            loss.backward()
            loss_sum += float(loss.detach())
            micro_metrics.append(metrics)
        grad_norm = self._grad_norm()
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss_sum, "grad_norm": grad_norm, "skipped": float(skipped), "micro": micro_metrics}

    def _grad_norm(self) -> float:
        """The global gradient norm, clipped; expert banks summed over their replicas first."""
        if self.expert_groups is None:
            return fsdp.total_grad_norm(self.params, self.optim_spec.grad_clip)
        from rlctl.workers.parallel import expert_parallel

        expert_parallel.reduce_expert_grads(self.expert_params, self.expert_groups)
        return fsdp.total_grad_norm(self.dense_params, self.optim_spec.grad_clip, extra=self.expert_params,
                                    extra_sq=expert_parallel.expert_grad_sq(self.expert_params, self.expert_groups))

    def end_train_step(self) -> None:
        """Advance the LR schedule: once per training step, however many optimizer steps it took."""
        self.scheduler.step()
        self.train_steps += 1

    def flops_profile(self) -> dict:
        """For perf/mfu: this rank's matmul peak (FLOP/s, in the compute dtype, measured once per
        process) and the model's transformers config (its text part for multimodal models)."""
        from rlctl.utils.flops import matmul_peak

        config = getattr(self.module, "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            config = config.get_text_config()
        return {"peak_flops": matmul_peak(str(self.device), str(self.compute_dtype).removeprefix("torch.")),
                "model_config": config.to_dict() if config is not None else {}}

    # --- checkpoints -----------------------------------------------------------------------------
    # The workers' save_checkpoint / load_checkpoint RPCs are these two calls on the engine they
    # train (trained_role_methods), so every trained role keeps one checkpoint format.
    def save(self, path: str) -> None:
        """Trained params + optimizer + schedule + RNG, sharded per rank, under `path` (every rank calls)."""
        save_engine(self, path)

    def load(self, path: str) -> dict:
        """Restore what `save` wrote (any number of ranks); returns its engine.json."""
        meta = load_engine(self, path)
        self.weights_version += 1
        return meta

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer else 0.0

    def set_train_steps(self, steps: int) -> None:
        """Put the schedule at `steps` training steps done (after loading a checkpoint)."""
        self.train_steps = steps
        self.scheduler.last_epoch = steps
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * lr_factor(steps, self.optim_spec)
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]


def trained_role_methods(engine: str):
    """The three worker methods of a trained role, written once for every role: its FLOPs profile
    (perf/mfu), and its checkpoint save and load, each a call on the TrainEngine in the worker's
    attribute `engine`. A role's class lists them in its body:

        flops_profile, save_checkpoint, load_checkpoint = trained_role_methods("critic")
    """
    from rlctl.runtime import Dispatch, register

    @register(Dispatch.ALL)
    def flops_profile(self) -> dict:
        """This rank's matmul peak and the trained model's config (rlctl.utils.flops; perf/mfu)."""
        return getattr(self, engine).flops_profile()

    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str) -> None:
        """Model (trained params) + optimizer + schedule + RNG, sharded per rank, under `path`."""
        getattr(self, engine).save(path)

    @register(Dispatch.RANK0)
    def load_checkpoint(self, path: str) -> dict:
        """Restore what save_checkpoint wrote (any number of ranks); returns its engine.json."""
        return getattr(self, engine).load(path)

    return flops_profile, save_checkpoint, load_checkpoint
