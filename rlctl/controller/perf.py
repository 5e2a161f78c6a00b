"""`perf/mfu`: the model FLOPs a step needs over what its workers' devices could do in that time.

    flops = StepFlops.measure(setup)          # once per session: each rank times a matmul (cached)
    metrics.update(flops.metrics(batch, step_s))

The count (rlctl.utils.flops, shared with bench/rlctl_bench.py) is in forward-equivalents of the
step's batch: generation 1, old log-probs 1 (when recomputed), reference 1 (when a KL term needs
it), each actor epoch 3 (forward + backward; 2 with LoRA, whose frozen weights need no weight
gradients); a critic adds its values pass 1 and 3 per epoch. The peak is the sum of every rank's
measured `torch.mm` FLOP/s in the dtype it computes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlctl.utils.flops import ModelShape, forward_flops, mfu, training_forward_equivalents

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup


@dataclass(frozen=True)
class StepFlops:
    actor: ModelShape
    actor_passes: float         # forward-equivalents of the policy over the batch per step
    critic: ModelShape | None
    critic_passes: float
    peak_flops: float           # FLOP/s of all the ranks together
    group_size: int

    @classmethod
    def measure(cls, setup: TrainSetup) -> "StepFlops | None":
        """Ask every rank for its matmul peak and model config; None when the model's config lacks
        the sizes the count needs (perf/mfu is then not logged)."""
        config = setup.config
        actor = setup.actor.flops_profile()
        critic = setup.critic.flops_profile() if setup.critic is not None else None
        try:
            actor_shape = ModelShape.from_hf_config(actor[0]["model_config"])
            critic_shape = ModelShape.from_hf_config(critic[0]["model_config"], lm_head=False) if critic else None
        except (KeyError, TypeError, ValueError):
            return None
        peak = sum(p["peak_flops"] for p in actor)
        if critic and not config.resources.colocate:   # its own ranks and devices
            peak += sum(p["peak_flops"] for p in critic)
        passes = (1.0 + float(setup.recompute_old_log_prob) + float(setup.needs.reference)
                  + training_forward_equivalents(epochs=config.actor.ppo_epochs,
                                                 frozen_weights=config.model.lora.rank > 0))
        critic_passes = 1.0 + training_forward_equivalents(epochs=config.critic.ppo_epochs) if critic else 0.0
        return cls(actor=actor_shape, actor_passes=passes, critic=critic_shape, critic_passes=critic_passes,
                   peak_flops=peak, group_size=config.rollout.n)

    def step_flops(self, *, prompt_tokens: float, response_tokens: float, rows: int) -> float:
        tokens = {"prompt_tokens": prompt_tokens, "response_tokens": response_tokens, "rows": rows,
                  "group_size": self.group_size}
        total = self.actor_passes * forward_flops(self.actor, **tokens)
        if self.critic is not None:
            total += self.critic_passes * forward_flops(self.critic, **tokens)
        return total

    def metrics(self, batch, step_s: float) -> dict:
        """perf/mfu (a fraction) and perf/peak_flops (FLOP/s) for a trained batch."""
        response = float(batch["response_mask"].sum())
        prompt = float(batch["attention_mask"].sum()) - response
        flops = self.step_flops(prompt_tokens=prompt, response_tokens=response, rows=len(batch))
        return {"perf/mfu": mfu(flops, step_s, self.peak_flops), "perf/peak_flops": self.peak_flops}
