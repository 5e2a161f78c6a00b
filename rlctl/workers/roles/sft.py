"""`SFTWorker`: supervised fine-tuning on one rank of the policy's worker group.

The same TrainEngine as the RL actor (FSDP2 over the group, AdamW, LR schedule, clipping, LoRA),
the same checkpoint format (so `rlctl merge` / `serve` / `resume` treat an SFT run like an RL
run), and one optimizer step per training step.

Batch keys (B rows, right-padded to L):
    input_ids       int64   [B, L]
    attention_mask  int64   [B, L]   1 on real tokens
    loss_mask       float32 [B, L]   1 where the token is a target (rlctl.data.sft)

Loss: the mean negative log-likelihood over every target token of the step's whole batch (all
ranks): each micro-batch adds sum(nll) / N_global x D, D = data-parallel ranks (FSDP averages
gradients over ranks), so W ranks take the step one rank would, and how rows are cut into
micro-batches changes nothing but float rounding.

Sequence parallelism (actor.ulysses_sequence_parallel_size = S > 1, rlctl.workers.parallel.ulysses; the
policy engine's sp group): the S ranks of a group pool their shards and each runs its 1/S of every
packed micro-batch; the NLL of all the group's targets is gathered on each, and D = W / S (the S
ranks' gradients sum to S x the group's, ulysses.gather_rows), so the step is the same as without
it.

Mixture-of-experts policies: actor.expert_parallel_size splits the experts as in RL (the engine's
all-to-all dispatch; every rank runs the same number of micro-batches, _micro_batches), and the
loss adds the router's load-balancing loss as the actor's update does (rlctl.workers.parallel.moe_aux), each
micro-batch's term weighted by its share of the step's target tokens (x D), as its NLL is.
"""

from __future__ import annotations

import numpy as np
import torch

from rlctl.runtime import Batch, Dispatch, register
from rlctl.algorithms import LossNorm
from rlctl.workers.compute.engine import trained_role_methods
from rlctl.workers.compute.logprob import make_layout, use_packing
from rlctl.workers.compute.micro_batches import plan_micro_batches, synced_plan
from rlctl.workers.compute.models import policy_engine
from rlctl.workers.compute.vocab_logprob import token_log_probs
from rlctl.workers.parallel import fsdp, moe_aux, ulysses

_KEYS = ["input_ids", "attention_mask", "loss_mask"]


def target_nll(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               loss_mask: torch.Tensor, *, pack: bool = False,
               sp: ulysses.SPGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-log p(token) of every target token [K] (row-major) and the row each belongs to [K].

    Rows are right-padded; token t is predicted by the output at t - 1. pack=True runs the rows as
    one packed row (flash attention: varlen by position_ids), else trimmed to the longest row.
    Under sequence parallelism (`sp`, the engine's group) the packed row is split over the sp
    group's ranks and every rank gets all K values."""
    nll, rows_of, _ = target_nll_and_aux(module, input_ids, attention_mask, loss_mask, pack=pack, sp=sp)
    return nll, rows_of


def target_nll_and_aux(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       loss_mask: torch.Tensor, *, pack: bool = False, moe_aux_loss: bool = False,
                       sp: ulysses.SPGroup | None = None):
    """target_nll's (nll [K], rows [K]) and, with moe_aux_loss, the MoE router's load-balancing loss
    over the tokens the forward ran (prompts and targets, never padding; a scalar), else None."""
    layout = make_layout(input_ids, attention_mask, input_ids.shape[1] - 1,
                         layout="pack" if pack or sp is not None else "trim")
    keep = loss_mask[:, 1:][layout.response_valid] > 0                      # [M] real tokens -> targets
    rows_of = layout.response_valid.nonzero()[:, 0][keep]
    pred_row, pred_col, targets = layout.pred_row[keep], layout.pred_col[keep], layout.targets[keep]
    if sp is not None:   # the aux loss is refused with sequence parallelism (moe_aux.sp_refusal)
        return _split_nll(module, sp, layout, pred_col, targets), rows_of, None
    first, last = int(pred_col.min()), int(pred_col.max())
    more = {"output_router_logits": True} if moe_aux_loss else {}
    out = layout.forward(module, logits_to_keep=torch.arange(first, last + 1, device=input_ids.device), **more)
    logits = out.logits[pred_row, pred_col - first]                          # [K, V], the model's dtype
    return -token_log_probs(logits, targets)[0], rows_of, getattr(out, "aux_loss", None) if moe_aux_loss else None


def _split_nll(module, sp: ulysses.SPGroup, layout, pred_col: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log p of the K targets [K] on every rank of `sp`, each rank running its slice of the packed
    row (pred_col: the targets' predictor columns, sorted as the pack layout makes them)."""
    out, part = ulysses.sliced_forward(module, sp, layout.input_ids, layout.position_ids, pred_col)
    mine = targets[part.bounds[sp.rank]:part.bounds[sp.rank + 1]]
    return ulysses.gather_rows(-token_log_probs(out.logits[0], mine)[0], sp, part.bounds)


class SFTWorker:
    """The policy on one rank, trained on labelled tokens. `config`: rlctl Config (kind = "sft")."""

    def __init__(self, config, *, total_steps: int = 0):
        self.cfg = config
        self.rank, self.world = fsdp.rank_and_world()
        self.actor = policy_engine(config, total_steps)   # the actor's: checkpoints are the actor's
        self.pack = use_packing(self.actor.module)
        self.moe_aux_coef = moe_aux.resolve_coef(self.actor.module, config.actor.moe_aux_loss_coef,
                                                 self.actor.sp_size)   # 0: dense, or off

    def _micro_batches(self, shard: Batch) -> list[dict]:
        groups = synced_plan(shard["attention_mask"].sum(1), max_tokens=self.cfg.sft.micro_batch_max_tokens,
                             max_rows=self.cfg.actor.micro_batch_size)   # the same number of passes on every rank
        return [self._trimmed(shard, group) for group in groups]

    def _trimmed(self, shard: Batch, rows) -> dict:
        """Those rows, cut to their longest, as tensors on this rank's device."""
        part = shard.select(rows)
        width = int(part["attention_mask"].sum(1).max())
        return Batch({k: part[k][:, :width] for k in _KEYS}).to_torch(self.actor.device, keys=_KEYS)

    @register(Dispatch.DP_TRAIN)
    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on the step's batch. Metrics (the same on every rank): train/loss
        (token-mean NLL of the batch before the step), actor/grad_norm, actor/lr, actor/skipped_steps;
        an MoE policy's actor/moe_aux_loss (the target-token-weighted mean of its aux loss, before the
        coefficient; the loss minimised is train/loss + coef x that)."""
        targets = float((batch["loss_mask"][:, 1:] > 0).sum())
        total = fsdp.all_reduce_sum([targets])[0]   # each rank's own shard: every target counted once
        dp = self.world // self.actor.sp_size
        scale, norm = dp / max(total, 1.0), LossNorm(tokens=max(total, 1.0), dp_size=dp)

        def loss_fn(micro: dict):
            nll, _, aux = target_nll_and_aux(self.actor.module, micro["input_ids"], micro["attention_mask"],
                                             micro["loss_mask"], pack=self.pack, moe_aux_loss=self.moe_aux_coef > 0,
                                             sp=self.actor.sp)
            loss, metrics = nll.sum() * scale, {}
            metrics["nll"] = float(loss.detach())
            targets = micro["loss_mask"][:, 1:]   # its targets' share of the step's, as moe_aux weighs the actor's
            loss = moe_aux.add_aux_loss(loss, metrics, {moe_aux.METRIC: aux}, targets, norm, self.moe_aux_coef)
            return loss, metrics

        rows, _, _ = self.actor.group_rows(batch)   # sp > 1: the sp group's rows, the same on its ranks
        out = self.actor.train_mini_batch(self._micro_batches(rows), loss_fn)
        lr = self.actor.lr()
        self.actor.end_train_step()
        sums = [sum(m.get(key, 0.0) for m in out["micro"]) for key in ("nll", moe_aux.METRIC)]
        loss, aux = (value / self.world for value in fsdp.all_reduce_sum(sums))
        metrics = {"train/loss": loss, "actor/grad_norm": out["grad_norm"], "actor/lr": lr,
                   "actor/skipped_steps": out["skipped"]}
        return metrics | ({f"actor/{moe_aux.METRIC}": aux} if self.moe_aux_coef > 0 else {})

    @register(Dispatch.DP)
    def eval_nll(self, batch: Batch) -> Batch:
        """Per-row summed NLL of the target tokens and their count: nll_sum, targets [B] float64. Micro-batches
        as in training (sft.micro_batch_max_tokens); whole weights, so ranks may run different counts
        (the ranks of an sp group run the same ones: they hold the same rows)."""
        rows, start, stop = self.actor.group_rows(batch)   # sp > 1: the group's rows; ours at start
        sums = np.zeros(len(rows), dtype=np.float64)
        groups = plan_micro_batches(rows["attention_mask"].sum(1), max_tokens=self.cfg.sft.micro_batch_max_tokens,
                                    max_rows=self.cfg.actor.micro_batch_size)
        with self.actor.inference() as module:
            for group in groups:
                t = self._trimmed(rows, group)
                nll, of = target_nll(module, t["input_ids"], t["attention_mask"], t["loss_mask"], pack=self.pack,
                                     sp=self.actor.sp)
                np.add.at(sums, np.asarray(group)[of.cpu().numpy()], nll.double().cpu().numpy())
        counts = (batch["loss_mask"][:, 1:] > 0).sum(1).astype(np.float64)
        return Batch({"nll_sum": sums[start:stop], "targets": counts})

    # the actor's checkpoint format: an SFT run resumes, merges and serves as an RL run does
    flops_profile, save_checkpoint, load_checkpoint = trained_role_methods("actor")
