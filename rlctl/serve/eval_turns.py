"""`rlctl eval` of a multi-turn run: the training loop's tools, interaction and reward on held-out rows.

The model is loaded in this process (the hf engine behind `LocalTurns`, below) and driven by the
same tool loop as training, built the same way (rlctl.rollouts.base.build_rollout): prompts rendered
with the tools' schemas, all conversations of a chunk batched per turn, tools and the interaction
between turns, the reward called with the whole conversation in `extra_info`. Each record carries the conversation, its turns and tool calls.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlctl.runtime.batch import Batch

CHUNK = 64   # prompts generated together


def evaluate_multi_turn(folder: Path, rows: list[dict], opts, temperature: float, max_new: int, config,
                        run_dir: Path):
    """[prompt][sample] (reward item, record fields), for eval._score: the reward reads the prompt as
    training decodes it and the whole conversation in `extra_info`; the record keeps the conversation."""
    from rlctl.controller.prompts import render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.multiturn.rollout import reward_extra_info
    from rlctl.rollouts.base import RolloutContext, build_rollout
    from rlctl.rollouts.single import decode_prompts, decode_responses
    from rlctl.serve.source import context_room, load_model
    from rlctl.errors import UsageError
    from rlctl.models.vision import is_vision_model
    from rlctl.workers.compute.models import eos_token_ids

    if is_vision_model(folder):   # training is built (sync, hf); eval's prompts do not carry their images yet
        raise UsageError("rlctl eval of a multi-turn run of a vision-language model is not built yet (its prompts "
                         "would reach the model without their images)",
                         hint="use the run's validation metrics (run.val_every, data.val_files): validation "
                              "runs the multi-turn loop with the images")
    model, tokenizer = load_model(folder, opts.dtype, chat_template=opts.chat_template)
    eos = eos_token_ids(str(folder), tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, n=opts.n),
                                 data=dataclasses.replace(config.data, max_response_length=max_new))
    turns = LocalTurns(model, pad_token_id=pad, eos_token_ids=eos, temperature=temperature, top_p=opts.top_p)
    actor = build_rollout(turns, RolloutContext(config, tokenizer, run_dir, eos))
    try:
        prompts = render_prompts(rows, tokenizer, 1 << 30, "error", tools=actor.runner.schemas).rows
        context_room(folder, [p.prompt_ids for p in prompts])   # as single-turn eval checks them
        batches = [actor.generate(prompt_batch(prompts[i:i + CHUNK], f"eval{i}", pad), seed=opts.seed + i)
                   for i in range(0, len(prompts), CHUNK)]
    finally:
        actor.close()
    items = []
    for batch in batches:
        for text, ds, gt, ei, conv, info, prompt, prompt_str in zip(
                decode_responses(batch, tokenizer), batch["data_source"], batch["ground_truth"],
                batch["extra_info"], batch["conversation"], batch["multi_turn"], batch["messages"],
                decode_prompts(batch, tokenizer)):
            items.append(({"data_source": ds, "solution_str": text, "ground_truth": gt, "prompt_str": prompt_str,
                           "extra_info": reward_extra_info(ei, conv, info), "messages": prompt},
                          {"finish_reason": info["finish"], "messages": conv, "num_turns": info["num_turns"],
                           "tool_calls": info["tool_calls"], "turn_scores": info["turn_scores"]}))
    return [items[i:i + opts.n] for i in range(0, len(items), opts.n)]


class LocalTurns:
    """`generate_turn` on a model in this process (rlctl eval): the hf engine, one rank; a
    rlctl.runtime.policy.TurnGenerator for the multi-turn driver.

    Sampling settings are fixed here (the eval's temperature and top_p), whatever the mode."""

    world_size = 1

    def __init__(self, model, *, pad_token_id: int, eos_token_ids: list[int], temperature: float,
                 top_p: float = 1.0, tokenizer=None):
        from rlctl.workers.rollout.hf import HFRolloutEngine

        self.engine = HFRolloutEngine(model, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids,
                                      tokenizer=tokenizer)
        self.temperature, self.top_p = temperature, top_p

    def generate_turn(self, batch: Batch, *, seed: int, mode: str = "train", n: int = 1, width: int = 0,
                      log_probs: bool = False) -> Batch:
        import torch

        from rlctl.workers.compute.vision import VISION_KEYS, pad_turn_positions
        from rlctl.workers.rollout.grammar import grammar_args
        from rlctl.workers.rollout.hf import kept_kv_args

        prompts = [row[m != 0].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]
        images = {"images": {k: list(batch[k]) for k in VISION_KEYS}} if VISION_KEYS[0] in batch else {}
        limits = [int(x) for x in batch["max_new_tokens"]]
        generator = torch.Generator(device=next(self.engine.model.parameters()).device).manual_seed(seed)
        out = self.engine.generate(prompts, n=n, max_new_tokens=max(limits), temperature=self.temperature,
                                   top_p=self.top_p, generator=generator, greedy=self.temperature == 0,
                                   limits=limits, log_probs=log_probs, **kept_kv_args(batch), **grammar_args(batch),
                                   **images)
        return Batch(pad_turn_positions(out, batch["input_ids"].shape[1]))
