"""`TeacherWorker`: a frozen teacher model scoring the student's own sampled tokens (distill.*).

Like the reference model, but another model: it reads the student's token ids unchanged (the two
share a tokenizer; validate checks it) and is scored at temperature 1, whatever the rollout's.

Batch keys:  compute_teacher_log_prob  in:  input_ids, attention_mask [B, P+T], response_mask [B, T]
                                       out: teacher_log_prob [B, T] (the sampled tokens),
                                            teacher_topk_ids [B, T, K], teacher_topk_log_prob [B, T, K]
                                            (the teacher's K most likely next tokens, K = distill.topk),
                                            in_teacher_topk [B, T] (the sampled token is one of them)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from rlctl.runtime import Batch, Dispatch, register
from rlctl.workers.compute.engine import sequence_group
from rlctl.workers.compute.logprob import batched_response_outputs, logits_and_rows, scatter_rows
from rlctl.workers.compute.models import load_causal_lm
from rlctl.workers.parallel import fsdp, ulysses


class TeacherWorker:
    """Inference only: the teacher loaded whole on every rank, never trained."""

    def __init__(self, config, *, path: str):
        model_cfg = dataclasses.replace(config.model, path=path)
        self.model = load_causal_lm(model_cfg, fsdp.resolve_dtype(config.model.dtype))
        self.device = fsdp.device()
        self.model = self.model.to(self.device).eval().requires_grad_(False)
        self.topk = min(config.distill.topk, self.model.config.vocab_size)
        self.micro_batch_size = config.actor.micro_batch_size
        # the student's sp size (the teacher pass is the reference pass of another model): each rank
        # of an sp group runs its slice of the packed rows, as the actor does (a frozen model outside
        # an engine: its group is built as the engine builds one)
        self.sp = sequence_group(config.actor.ulysses_sequence_parallel_size, self.model,
                                 "actor.ulysses_sequence_parallel_size")

    @register(Dispatch.DP)
    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        width = batch["response_mask"].shape[1]
        rows, start, stop = ulysses.group_rows(batch, self.sp)   # sp > 1: the sp group's rows; ours at start
        if len(rows) == 0:   # a rank's share of a teacher routed fewer rows than the group has ranks
            return Batch(empty_teacher_outputs(0, width, self.topk), batch.meta)
        with torch.no_grad():
            out = batched_response_outputs(self.model, self.device, rows, self.micro_batch_size,
                                           forward=teacher_outputs, k=self.topk, sp=self.sp)
        return Batch({key: value[start:stop] for key, value in out.items()}, batch.meta)


def teacher_outputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, *,
                    k: int, sp: ulysses.SPGroup | None = None) -> dict[str, torch.Tensor]:
    """The teacher's log-prob of each response token and its top-k next tokens, at temperature 1
    (under sequence parallelism, `sp`, each rank those of its slice, gathered on every rank)."""
    logits, layout, rows = logits_and_rows(model, input_ids, attention_mask, response_width, sp=sp)
    log_probs = torch.log_softmax(logits.float(), -1)                      # [m, V]
    sampled = log_probs.gather(-1, rows.local(layout.targets)[:, None].long())   # [m, 1]
    top, ids = log_probs.topk(k, -1)                                       # [m, K]
    sampled, top, ids = rows.gather(sampled), rows.gather(top), rows.gather(ids)   # [M, ...]
    valid = layout.response_valid
    return {"teacher_log_prob": scatter_rows(sampled, valid)[..., 0],
            "teacher_topk_ids": scatter_rows(ids, valid),
            "teacher_topk_log_prob": scatter_rows(top, valid),
            "in_teacher_topk": scatter_rows((ids == layout.targets[:, None]).any(-1, keepdim=True), valid)[..., 0]}


def empty_teacher_outputs(rows: int, width: int, k: int) -> dict[str, np.ndarray]:
    """The teacher's columns for `rows` rows that no teacher scored (zeros)."""
    return {"teacher_log_prob": np.zeros((rows, width), np.float32),
            "teacher_topk_ids": np.zeros((rows, width, k), np.int64),
            "teacher_topk_log_prob": np.zeros((rows, width, k), np.float32),
            "in_teacher_topk": np.zeros((rows, width), bool)}
