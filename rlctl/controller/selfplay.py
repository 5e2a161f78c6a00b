"""Self-play on the controller: SPIN's reference answers beside the policy's generations, and the
opponent's refresh every `algorithm.ref_update_every` steps (rlctl.algorithms.selfplay has the math).

SPIN (needs.real_response): each generated row gets a twin with the same prompt whose response is
the row's reference answer, `extra_info.answer` (what `rlctl data prep --sft` trains on), then the
end-of-turn token. The pair shares a fresh group id (`uid` = prompt uid + sample index), the twin is
flagged `real_response`, and both are scored by the reward so the twins' scores can be compared.
"""

from __future__ import annotations

import numpy as np

from rlctl.errors import CheckpointError, DataError
from rlctl.runtime.batch import Batch, object_array

ROW_KEYS = ("prompts", "data_source", "ground_truth", "extra_info", "messages", "uid")   # what a twin keeps


def answer_tokens(answers: list, tokenizer, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(responses [B, width] padded, response_mask [B, width], truncated [B]) of `answers` + end of turn."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    responses = np.full((len(answers), width), pad, dtype=np.int64)
    mask = np.zeros((len(answers), width), dtype=np.float32)
    truncated = np.zeros(len(answers), dtype=bool)
    for i, text in enumerate(answers):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        truncated[i] = len(ids) > width
        ids = ids[:width]
        responses[i, :len(ids)], mask[i, :len(ids)] = ids, 1.0
    return responses, mask, truncated


def reference_answers(extra_info) -> list[str]:
    """Each row's `extra_info.answer`; a row without one is a data error (SPIN has nothing to play for)."""
    out = []
    for info in extra_info:
        answer = (info or {}).get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise DataError("algorithm.name = \"spin\" needs each training row's reference answer in "
                            "extra_info.answer, and a row has none",
                            hint="prepare the data with `rlctl data prep` (it keeps the answer), or add the "
                                 "answer your SFT data trains on to extra_info.answer")
        out.append(answer)
    return out


def add_real_responses(batch: Batch, setup) -> tuple[Batch, dict]:
    """The generations plus one reference-answer twin each, scored; returns (batch, spin/* metrics)."""
    from rlctl.controller.rollout import score

    width = batch["responses"].shape[1]
    responses, mask, truncated = answer_tokens(reference_answers(batch["extra_info"]), setup.tokenizer, width)
    pair = object_array([f"{uid}#{k}" for k, uid in enumerate(batch["uid"])])
    prompt_mask = batch["attention_mask"][:, :batch["prompts"].shape[1]]
    twins = Batch({**{k: batch[k] for k in ROW_KEYS if k in batch}, "uid": pair,
                   "responses": responses, "response_mask": mask, "truncated": truncated,
                   "response_length": mask.sum(-1).astype(np.int64),
                   "input_ids": np.concatenate([batch["prompts"], responses], axis=1),
                   "attention_mask": np.concatenate([prompt_mask, mask.astype(prompt_mask.dtype)], axis=1)},
                  batch.meta)
    score(setup, twins)
    generated = Batch({k: v for k, v in batch.tensors.items() if k != "rollout_log_prob"}, batch.meta)
    generated["uid"] = pair
    generated["real_response"] = np.zeros(len(batch), dtype=bool)
    twins["real_response"] = np.ones(len(batch), dtype=bool)
    keep = [k for k in generated.tensors if k in twins.tensors]   # engine extras (versions, ...) stay behind
    generated, twins = (Batch({k: b[k] for k in keep}, batch.meta) for b in (generated, twins))
    same = np.array([a == b for a, b in zip(batch["response_text"], twins["response_text"])])
    metrics = {"spin/real_reward": float(twins["scores"].mean()), "spin/real_truncated": float(truncated.mean()),
               "spin/same_as_real": float(same.mean())}
    return Batch.concat([generated, twins]), metrics


def generated_rows(batch: Batch) -> Batch:
    """The policy's own rows (SPIN's reference-answer twins left out): what the step metrics describe."""
    if "real_response" not in batch:
        return batch
    return batch.select(np.flatnonzero(~batch["real_response"].astype(bool)))


def spin_margin(batch: Batch) -> dict:
    """spin/margin: mean over pairs of [log pi(y) - log pi(y')] - [log pi_t(y) - log pi_t(y')] before the
    update (the quantity SPIN's loss pushes up); spin/real_log_prob, spin/generated_log_prob: the
    policy's mean sequence log-probs of the reference answers and of its own generations."""
    if "real_response" not in batch or "ref_log_prob" not in batch:
        return {}
    real = batch["real_response"].astype(bool)
    mask = batch["response_mask"]
    seq = (batch["old_log_prob"] * mask).sum(-1)
    ratio = seq - (batch["ref_log_prob"] * mask).sum(-1)
    order = {uid: i for i, uid in enumerate(batch["uid"][~real])}
    chosen = np.array([order[uid] for uid in batch["uid"][real]])
    return {"spin/margin": float((ratio[real] - ratio[~real][chosen]).mean()),
            "spin/real_log_prob": float(seq[real].mean()), "spin/generated_log_prob": float(seq[~real].mean())}


def refresh_due(step: int, every: int) -> bool:
    """algorithm.ref_update_every: the opponent becomes the current policy before steps every+1, 2 every+1, ..."""
    return bool(every) and step > 1 and (step - 1) % every == 0


def check_resume_step(step: int, every: int) -> None:
    """Resuming inside an iteration would need the opponent's weights, which checkpoints do not hold:
    only a step at an iteration's end (a multiple of ref_update_every) restores the opponent exactly."""
    if every and step >= every and step % every:
        raise CheckpointError(f"step {step} is inside a self-play iteration (algorithm.ref_update_every = {every}): "
                              "its opponent, the policy at step "
                              f"{step - step % every}, is not in the checkpoint",
                              hint=f"resume from a step that is a multiple of {every} (`rlctl resume RUN --step N`); "
                                   "run.save_every must be a multiple of algorithm.ref_update_every")
