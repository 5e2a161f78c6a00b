"""Real training checkpoints for the merge tests, built once per session.

Each run: ActorRolloutRefWorker(s) on a tiny model take one optimizer step (lr 1e-2, so the
weights move visibly) on a fixed batch, then save through CheckpointManager.save exactly as the
trainer does (actor/ via save_checkpoint, config.resolved.toml, trainer_state.json, the resume
fingerprint in the manifest). The live workers' log-probs of a probe batch are kept, so merged
folders are checked against the weights the workers held, not only against the checkpoint.

    full-tied-1w     full fine-tuning, tied embeddings,    1 worker  (in this process)
    lora-untied-1w   LoRA r=8 alpha=16, untied embeddings, 1 worker  (in this process)
    full-untied-2w   full fine-tuning, untied,  2 Ray workers, FSDP2 over gloo
    lora-tied-2w     LoRA r=8 alpha=16, tied,   2 Ray workers (co-located in the same group)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROMPT, RESPONSE = 6, 4


@dataclass(frozen=True)
class TrainedRun:
    run_dir: Path
    model_dir: Path
    lora: bool
    workers: int
    probe: dict               # input_ids, attention_mask, response_mask (numpy) of 4 rows
    live_log_prob: np.ndarray  # [4, RESPONSE] the workers' log-probs of the probe after the step
    base_log_prob: np.ndarray  # [4, RESPONSE] the untrained model's


def run_config(model_dir: Path, *, lora: bool, workers: int):
    from rlctl.config.schema import (ActorConfig, Config, DataConfig, LoraConfig, ModelConfig, ResourcesConfig,
                                     RolloutConfig, RunConfig)

    return Config(run=RunConfig(name="ck", seed=3),
                  model=ModelConfig(path=str(model_dir), lora=LoraConfig(rank=8 if lora else 0, alpha=16.0)),
                  data=DataConfig(train_files=("data/train.parquet",), batch_size=2, max_prompt_length=PROMPT,
                                  max_response_length=RESPONSE),
                  actor=ActorConfig(lr=1e-2, micro_batch_size=2, grad_clip=0.0), rollout=RolloutConfig(n=2),
                  resources=ResourcesConfig(workers=workers))


def fixed_batch(seed: int):
    from rlctl.runtime import Batch

    rng = np.random.default_rng(seed)
    rows = 4
    mask = np.ones((rows, PROMPT + RESPONSE), dtype=np.int64)
    mask[1, :2] = 0                          # a left-padded prompt
    mask[2, PROMPT + 2:] = 0                 # a short response
    response_mask = mask[:, PROMPT:].astype(np.float32)
    return Batch({"input_ids": rng.integers(0, 256, size=(rows, PROMPT + RESPONSE)), "attention_mask": mask,
                  "response_mask": response_mask,
                  "advantages": rng.standard_normal((rows, RESPONSE)).astype(np.float32) * response_mask})


def save_run(run_dir: Path, config, save_actor) -> None:
    """The trainer's save, with this run's actor writer."""
    import tomlkit

    from rlctl.checkpoint.compat import run_fingerprint
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.config.loader import config_to_dict

    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    (run_dir / "data" / "train.parquet").write_bytes(b"PAR1 stand-in training rows PAR1")
    config_dict = config_to_dict(config)

    def write(tmp: Path) -> None:
        save_actor(str(tmp / "actor"))
        (tmp / "config.resolved.toml").write_text(tomlkit.dumps(config_dict))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": 1}))

    manager = CheckpointManager(run_dir / "checkpoints", keep_last=2, notify=lambda m: None)
    manager.save(1, write, meta={"fingerprint": run_fingerprint(config_dict, run_dir)})


def train_in_process(run_dir: Path, model_dir: Path, *, lora: bool) -> TrainedRun:
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    config = run_config(model_dir, lora=lora, workers=1)
    worker = ActorRolloutRefWorker(config, total_steps=4)
    probe = fixed_batch(1).select_keys(["input_ids", "attention_mask", "response_mask"])
    base = worker.compute_log_prob(probe)["old_log_prob"]
    worker.update_actor(fixed_batch(0))
    live = worker.compute_log_prob(probe)["old_log_prob"]
    save_run(run_dir, config, worker.save_checkpoint)
    return TrainedRun(run_dir, model_dir, lora, 1, dict(probe.tensors), live, base)


def train_on_ray(root: Path, cases: dict[str, tuple[Path, bool]]) -> dict[str, TrainedRun]:
    """One 2-rank group hosting every case as a co-located role: one Ray start for all of them."""
    import ray

    from rlctl.config.schema import ResourcesConfig
    from rlctl.runtime.ray_env import ray_session
    from rlctl.runtime.resource_pool import ResourcePool
    from rlctl.runtime.worker_group import WorkerGroup
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    configs = {name: run_config(model, lora=lora, workers=2) for name, (model, lora) in cases.items()}
    probe = fixed_batch(1).select_keys(["input_ids", "attention_mask", "response_mask"])
    out = {}
    with ray_session(num_cpus=2):
        roles = {name: (ActorRolloutRefWorker, {"config": cfg, "total_steps": 4}) for name, cfg in configs.items()}
        with WorkerGroup(ResourcePool(ResourcesConfig(workers=2)), roles, name="ckpt") as group:
            for name, (model, lora) in cases.items():
                actor = group.role(name)
                base = actor.compute_log_prob(probe)["old_log_prob"]
                actor.update_actor(fixed_batch(0))
                live = actor.compute_log_prob(probe)["old_log_prob"]
                save_run(root / name, configs[name], actor.save_checkpoint)
                out[name] = TrainedRun(root / name, model, lora, 2, dict(probe.tensors), live, base)
    assert not ray.is_initialized()
    return out
