"""`ImplicitPRMWorker`: PRIME's implicit process reward model on one rank (rlctl.algorithms.prime).

Two copies of the policy's starting model (model.path, full fine-tuning even when the actor uses
LoRA): the PRM, trained online with its own AdamW, and its frozen reference. The token reward is
beta (log pi_rm - log pi_ref) of the policy's sampled tokens at the rollout temperature, so the
PRM must share the policy's tokenizer. Placed like the critic (same ranks when resources.colocate);
its checkpoint is the PRM's engine (weights, optimizer, schedule, RNG); the reference is model.path
again on resume.

Batch keys:  compute_rm_scores  in: input_ids, attention_mask, response_mask   out: rm_scores [B, T]
             update_prm         in: input_ids, attention_mask, response_mask, prm_label [B] in [0, 1]
"""

from __future__ import annotations

import torch

from rlctl.runtime import Batch, Dispatch, register
from rlctl.workers.compute.engine import OptimSpec, TrainEngine, trained_role_methods
from rlctl.workers.compute.logprob import batched_response_outputs, response_log_probs
from rlctl.workers.compute.models import load_causal_lm
from rlctl.workers.compute.training import mini_batch_count, run_updates
from rlctl.workers.parallel import fsdp

_KEYS = ["input_ids", "attention_mask", "response_mask", "prm_ref_log_prob", "prm_label"]


class ImplicitPRMWorker:
    """`config`: the run's Config; algorithm.params holds PRIME's (rlctl.algorithms.prime.PrimeParams)."""

    def __init__(self, config, *, total_steps: int = 0):
        from rlctl.algorithms import estimator_params

        self.cfg = config
        self.params = estimator_params(config.algorithm.name, config.algorithm.params)
        self.rank, self.world = fsdp.rank_and_world()
        self.temperature = config.rollout.temperature or 1.0   # the sampling distribution, as the actor's
        dtype = fsdp.resolve_dtype(config.model.dtype)
        spec = OptimSpec(lr=self.params.prm_lr, weight_decay=0.0, grad_clip=self.params.prm_grad_clip,
                         warmup_steps=0, total_steps=total_steps)
        self.prm = TrainEngine(load_causal_lm(config.model), spec, compute_dtype=dtype,
                               gradient_checkpointing=config.model.gradient_checkpointing)
        self.ref = self.prm.frozen_twin(load_causal_lm(config.model))

    def _log_probs(self, engine: TrainEngine, batch: Batch):
        with engine.inference() as module:
            return batched_response_outputs(module, engine.device, batch, self.cfg.actor.micro_batch_size,
                                            temperature=self.temperature)["log_prob"]

    @register(Dispatch.DP)
    def compute_rm_scores(self, batch: Batch) -> Batch:
        """rm_scores [B, T] = beta (log pi_rm - log pi_ref) of the response tokens, 0 on padding."""
        from rlctl.algorithms import prime_process_rewards

        rm, ref = (torch.from_numpy(self._log_probs(e, batch)) for e in (self.prm, self.ref))
        mask = torch.from_numpy(batch["response_mask"])
        scores = prime_process_rewards(rm, ref, mask, self.params.beta_train)
        return Batch({"rm_scores": scores.float().numpy()}, batch.meta)

    @register(Dispatch.DP_TRAIN)
    def update_prm(self, batch: Batch) -> dict[str, float]:
        """One epoch over the actor's mini-batches of BCE(sigmoid(beta sum_t log-ratio), prm_label).
        Metrics: prm/loss (mean BCE before each step), prm/acc (logit > 0 agrees with label > 0.5),
        prm/grad_norm, prm/lr, prm/optimizer_steps, prm/skipped_steps."""
        from rlctl.config.plan import batch_plan

        rows = Batch(dict(batch.tensors), batch.meta)
        rows["prm_ref_log_prob"] = self._log_probs(self.ref, rows)
        mini = mini_batch_count(rows, world=self.world,
                                sequences_per_mini=batch_plan(self.cfg, "actor").sequences_per_mini_batch)
        metrics = run_updates(self.prm, rows, epochs=1, mini_batches=mini,
                              micro_batch_size=self.cfg.actor.micro_batch_size,
                              horizon=self.cfg.data.max_response_length, make_loss=self._loss_fn, keys=_KEYS)
        return {f"prm/{k}": v for k, v in metrics.items()}

    def _loss_fn(self, norm):
        from rlctl.algorithms import prime_prm_loss

        def loss_fn(micro: dict) -> tuple[torch.Tensor, dict]:
            mask = micro["response_mask"]
            rm = response_log_probs(self.prm.module, micro["input_ids"], micro["attention_mask"], mask.shape[1],
                                    temperature=self.temperature)["log_prob"]
            bce, logits = prime_prm_loss(rm, micro["prm_ref_log_prob"], mask, micro["prm_label"],
                                         self.params.beta_train)
            counted = (mask != 0).any(-1)          # the rows LossNorm.seqs counts over the mini-batch
            loss = torch.where(counted, bce, torch.zeros_like(bce)).sum() / norm.seqs * norm.dp_size
            agree = ((logits > 0) == (micro["prm_label"] > 0.5)).to(torch.float64).mean()
            return loss, {"acc": float(agree)}

        return loss_fn

    flops_profile, save_checkpoint, load_checkpoint = trained_role_methods("prm")
