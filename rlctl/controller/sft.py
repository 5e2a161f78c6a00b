"""The SFT loop (run.kind = "sft"): the RL run's folder, checkpoints, logs and display, no rollouts.

    for step:  batch = next examples  ->  actor.train_step(batch)  ->  log / validate / save

`build_sft_setup` builds what `rlctl train` / `resume` need, like `build_setup` does for RL: the
tokenized samples (rlctl.data.sft), a seeded resumable loader (epoch e = a permutation seeded by
(seed, e)), the SFTWorker group (FSDP2 over resources.workers ranks), the metrics logger, the
live display and the checkpoint manager. Checkpoints are written by the same code as RL's
(rlctl.controller.checkpointing), so merge, serve, eval and resume need nothing SFT-specific.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlctl.config.loader import LoadedConfig, config_to_dict
from rlctl.config.schema import Config
from rlctl.controller import checkpointing
from rlctl.controller.session import RunSession
from rlctl.controller.timing import phase
from rlctl.controller.trainer import Trainer
from rlctl.errors import DataError

if TYPE_CHECKING:
    from rlctl.controller.signals import StopFlag


@dataclass
class SFTSetup:
    """What one SFT run holds: the run folder and its writers (`session`, as RL's) and SFT's own data
    and worker group. Its session checkpoints the actor and the loader only: no critic, no KL
    controller, no rollout in flight."""

    session: RunSession
    tokenizer: object
    pad_token_id: int
    loader: object            # rlctl.controller.prompts.PromptLoader over SFTSample rows
    val_samples: list
    total_steps: int
    actor: object             # RoleHandle of SFTWorker

    @property
    def config(self) -> Config:
        return self.session.config

    def log_step(self, step: int, metrics: dict) -> None:
        self.session.logger.log(step, metrics)
        self.session.log_progress(step, metrics)


def load_samples(config: Config, notices: list):
    """Tokenizer, training samples and validation samples."""
    from rlctl.data.sft import build_samples
    from rlctl.models.loading import policy_tokenizer

    tokenizer = policy_tokenizer(config.model)
    train = build_samples([Path(p) for p in config.data.train_files], tokenizer, config.sft)
    for what, count in (("truncated to sft.max_length", train.truncated),
                        ("dropped: no target token", train.no_target)):
        if count:
            notices.append(f"{count} training sample(s) {what}")
    val = build_samples([Path(p) for p in config.data.val_files], tokenizer, config.sft).samples \
        if config.data.val_files else []
    return tokenizer, train, val


def build_sft_setup(loaded: LoadedConfig, run_dir: Path, stack: ExitStack, *, address: str = "",
                    start_step: int = 0) -> SFTSetup:
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.metrics_log import MetricsLogger
    from rlctl.controller.paths import resolve_paths
    from rlctl.controller.prompts import PromptLoader, PromptSet

    config = resolve_paths(loaded.config, loaded.base_dir)
    notices: list[str] = []
    tokenizer, train, val = load_samples(config, notices)
    if len(train.samples) < config.data.batch_size:
        raise DataError(f"{len(train.samples)} SFT samples but data.batch_size = {config.data.batch_size}",
                        hint="lower data.batch_size or add training rows.")
    loader = PromptLoader(PromptSet(rows=train.samples), config.data.batch_size, seed=config.run.seed,
                          shuffle=config.data.shuffle)
    total = config.run.total_steps or loader.steps_per_epoch * config.run.total_epochs
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    logger = stack.enter_context(MetricsLogger(run_dir, config.run.loggers, config.run.name, config_to_dict(config),
                                               start_step=start_step))
    actor = start_sft_workers(config, total, stack, address)
    display = stack.enter_context(LiveDisplay(total, start_step=start_step, title=config.run.name))
    session = RunSession(config=config, config_dir=loaded.base_dir, run_dir=run_dir, logger=logger, display=display,
                         checkpoints=CheckpointManager.for_run(run_dir, config.run.keep_last), roles={"actor": actor},
                         stateful={"loader": loader}, notices=notices)
    return SFTSetup(session=session, tokenizer=tokenizer, pad_token_id=int(pad), loader=loader, val_samples=val,
                    total_steps=total, actor=actor)


def start_sft_workers(config: Config, total_steps: int, stack: ExitStack, address: str):
    """Embedded Ray (or the cluster at `address`) and the SFTWorker group on resources.workers ranks."""
    from rlctl.runtime.ray_env import ray_session
    from rlctl.runtime.resource_pool import ResourcePool
    from rlctl.runtime.worker_group import WorkerGroup
    from rlctl.workers.roles.sft import SFTWorker

    stack.enter_context(ray_session(address))
    group = WorkerGroup(ResourcePool(config.resources, name="actor"),
                        {"actor": (SFTWorker, {"config": config, "total_steps": total_steps})}, name="actor")
    stack.callback(group.shutdown)
    return group.role("actor")


class SFTTrainer(Trainer):
    """The RL trainer's best-checkpoint rule (run.best_metric) and non-finite step count (exit 5),
    with SFT's step, validation and perf/mfu; self.flops: (ModelShape, peak FLOP/s) once fit starts."""

    def fit(self, stop: StopFlag) -> None:
        from rlctl.data.sft import collate

        setup, config = self.setup, self.config
        self.flops = self.measure_flops()
        state = setup.session.state
        if config.run.val_before_train and setup.val_samples and state.step == 0:
            setup.session.logger.log(0, self.validate(0))
        for step in range(state.step + 1, setup.total_steps + 1):
            start = time.perf_counter()
            batch = collate(setup.loader.next_batch(), setup.pad_token_id)
            metrics = setup.actor.train_step(batch)
            state.step = step
            step_s = time.perf_counter() - start
            tokens = float(batch["attention_mask"].sum())
            metrics.update({"train/tokens": tokens, "train/loss_tokens": float((batch["loss_mask"][:, 1:] > 0).sum()),
                            "train/padding_ratio": 1.0 - tokens / batch["attention_mask"].size,
                            "timing/step_s": step_s, "perf/tokens_per_s": tokens / step_s,
                            "data/epoch": float(setup.loader.epoch), **self.perf(batch, step_s)})
            new_best, timing = False, {}
            val_due = config.run.val_every and step % config.run.val_every == 0
            if setup.val_samples and (step == setup.total_steps or val_due):
                with phase(timing, "val"):
                    metrics.update(self.validate(step))
                metrics.update(timing)
                new_best = self.track_best(step, metrics)
            self.check_numerics(metrics, step)
            setup.log_step(step, metrics)
            if step == setup.total_steps or (config.run.save_every and step % config.run.save_every == 0) or new_best:
                checkpointing.save(setup.session, step)
            stop.check()

    def measure_flops(self) -> tuple | None:
        """(model shape, summed matmul peak of the ranks) for perf/mfu; None when the model's config
        lacks the sizes the count needs (rlctl.utils.flops, as for RL)."""
        from rlctl.utils.flops import ModelShape

        profiles = self.setup.actor.flops_profile()
        try:
            return ModelShape.from_hf_config(profiles[0]["model_config"]), sum(p["peak_flops"] for p in profiles)
        except (KeyError, TypeError, ValueError):
            return None

    def perf(self, batch, step_s: float) -> dict:
        """perf/mfu: one forward + backward over the batch's real tokens (2 forward-equivalents for the
        backward, fewer with LoRA's frozen weights) over what the ranks could do in step_s."""
        from rlctl.utils.flops import forward_flops, mfu, training_forward_equivalents

        if self.flops is None:
            return {}
        shape, peak = self.flops
        tokens = float(batch["attention_mask"].sum())
        flops = training_forward_equivalents(epochs=1, frozen_weights=self.config.model.lora.rank > 0) * \
            forward_flops(shape, prompt_tokens=0.0, response_tokens=tokens, rows=len(batch), group_size=1)
        return {"perf/mfu": mfu(flops, step_s, peak), "perf/peak_flops": peak}

    def validate(self, step: int) -> dict:
        """val/loss: token-mean NLL of the target tokens of data.val_files (and val/perplexity)."""
        from rlctl.data.sft import collate

        setup = self.setup
        nll, count = 0.0, 0.0
        size = max(self.config.data.val_batch_size, setup.actor.world_size)
        for i in range(0, len(setup.val_samples), size):
            part = setup.val_samples[i:i + size]
            if len(part) < setup.actor.world_size:   # a tail smaller than the group: pad with earlier rows
                part = part + setup.val_samples[:setup.actor.world_size - len(part)]
                keep = len(setup.val_samples) - i
            else:
                keep = len(part)
            out = setup.actor.eval_nll(collate(part, setup.pad_token_id))
            nll += float(out["nll_sum"][:keep].sum())
            count += float(out["targets"][:keep].sum())
        loss = nll / max(count, 1.0)
        perplexity = float(np.exp(min(loss, 50.0)))
        setup.session.display.print(f"validation at step {step}: loss {loss:.4f}  perplexity {perplexity:.2f}")
        return {"val/loss": loss, "val/perplexity": perplexity}
