"""`CriticWorker`: the value model V(s) on one rank (PPO / GAE runs only).

The critic is the base model with a Linear(hidden, 1) head (transformers' token-classification
class, head dropout off; a vision-language model: its own class with a 1-wide head,
rlctl.workers.compute.models.vision_value_model), trained in full (LoRA applies to the actor only). Its value for
response token j is the head's output at the token before it, the state the policy acted in,
aligned like the actor's log-probs. A vision-language batch's images and M-RoPE positions
(rlctl.workers.compute.vision) reach its forward exactly as they reach the actor's.

Batch keys:  compute_values  in: input_ids, attention_mask, response_mask   out: values [B, T]
             update_critic   in: input_ids, attention_mask, response_mask, values, returns
"""

from __future__ import annotations

import torch

from rlctl.config.plan import batch_plan
from rlctl.runtime import Batch, Dispatch, register
from rlctl.workers.compute.engine import OptimSpec, TrainEngine, trained_role_methods
from rlctl.workers.compute.logprob import batched_response_outputs, response_values
from rlctl.workers.compute.models import load_value_model
from rlctl.workers.compute.training import mini_batch_count, run_updates
from rlctl.workers.compute.vision import has_vision_tower, tower_always_runs
from rlctl.workers.parallel import fsdp

_MODEL_KEYS = ["input_ids", "attention_mask"]


class CriticWorker:
    """The critic on one rank; `config` is the run's Config (critic.model_path or model.path)."""

    def __init__(self, config, *, total_steps: int = 0):
        self.cfg = config
        self.rank, self.world = fsdp.rank_and_world()
        torch.manual_seed(config.run.seed + 1)  # the value head's init, the same on every rank
        model = load_value_model(config.critic.model_path or config.model.path, config.model)
        self.critic = TrainEngine(model, OptimSpec.for_critic(config.critic, total_steps),
                                  compute_dtype=fsdp.resolve_dtype(config.model.dtype),
                                  gradient_checkpointing=config.model.gradient_checkpointing,
                                  sequence_parallel_size=config.critic.ulysses_sequence_parallel_size,
                                  parallel_key="critic")
        # vision model over > 1 rank: a micro-batch without images still runs the vision tower
        self.vision_sync = self.world > 1 and has_vision_tower(self.critic.module)

    @register(Dispatch.DP)
    def compute_values(self, batch: Batch) -> Batch:
        rows, start, stop = self.critic.group_rows(batch)   # sp > 1: the sp group's rows; ours at start
        budget = self.cfg.critic.micro_batch_max_tokens * self.critic.sp_size   # sp ranks split each
        with self.critic.inference() as module:
            out = batched_response_outputs(module, self.critic.device, rows, self.cfg.critic.micro_batch_size,
                                           max_tokens=budget, sp=self.critic.sp,
                                           forward=lambda *args, **kw: {"values": response_values(*args, **kw)})
        return Batch({key: value[start:stop] for key, value in out.items()}, batch.meta)

    @register(Dispatch.DP_TRAIN)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        cc = self.cfg.critic
        mini = mini_batch_count(batch, world=self.world,
                                sequences_per_mini=batch_plan(self.cfg, "critic").sequences_per_mini_batch)
        keys = _MODEL_KEYS + ["response_mask", "values", "returns"]
        rows, _, _ = self.critic.group_rows(batch, mini)   # sp > 1: the sp group's rows, mini-batch-wise
        metrics = run_updates(self.critic, rows, epochs=cc.ppo_epochs, mini_batches=mini,
                              micro_batch_size=cc.micro_batch_size, horizon=self.cfg.data.max_response_length,
                              make_loss=self._value_loss_fn, keys=keys, max_tokens=cc.micro_batch_max_tokens)
        return {f"critic/{k}": v for k, v in metrics.items()}

    def _value_loss_fn(self, norm):
        from rlctl.algorithms import value_loss

        cc = self.cfg.critic

        def loss_fn(micro: dict) -> tuple[torch.Tensor, dict]:
            mask = micro["response_mask"]
            with tower_always_runs(self.critic.module, micro, self.vision_sync):
                vpreds = response_values(self.critic.module, micro["input_ids"], micro["attention_mask"],
                                         mask.shape[1], vision=micro.get("vision"), sp=self.critic.sp)
            loss, metrics = value_loss(vpreds=vpreds, returns=micro["returns"], values=micro["values"],
                                       response_mask=mask, value_clip=cc.value_clip,
                                       loss_agg_mode=cc.loss_agg_mode, norm=norm)
            return loss, {**metrics, "vf_loss": float(loss.detach())}

        return loss_fn

    flops_profile, save_checkpoint, load_checkpoint = trained_role_methods("critic")
