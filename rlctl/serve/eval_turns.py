"""`rlctl eval` of a run whose rollout drives the model turn by turn (the tool loop, agent programs):
the training rollout on held-out rows, built the same way (rlctl.rollouts.base.build_rollout).

The model is loaded in this process (the hf engine behind `LocalTurns`, below) and is the rollout's
turn generator: prompts rendered as training renders them (with the tools' schemas the rollout
offers), a chunk of prompts generated together, each sample turned into what eval scores and
records by the rollout itself (`eval_samples`: the reward item and the record's fields, e.g. the
conversation, its turns and tool calls, or an agent episode's failure and calls). A kind that brings
its own reward (agent programs; `rlctl eval --agent` takes the agent's) is scored by the rollout.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlctl.runtime.batch import Batch

CHUNK = 64   # prompts generated together


def evaluate_rollout(folder: Path, rows: list[dict], opts, temperature: float, max_new: int, config, base: Path):
    """([prompt][sample] (reward item, record fields) for eval._score, or None; (scores, correct, metrics,
    records) as eval._score returns them when the rollout scored itself, or None)."""
    from rlctl.controller.prompts import render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.errors import UsageError
    from rlctl.models.vision import is_vision_model
    from rlctl.rollouts.base import RolloutContext, build_rollout
    from rlctl.rollouts.table import kind_of
    from rlctl.serve.source import context_room, load_model
    from rlctl.workers.compute.models import eos_token_ids

    kind = kind_of(config)
    if is_vision_model(folder):   # training is built (sync, hf); eval's prompts do not carry their images yet
        raise UsageError(f"rlctl eval of {kind.title} with a vision-language model is not built yet (its prompts "
                         "would reach the model without their images)",
                         hint="use the run's validation metrics (run.val_every, data.val_files): validation "
                              "runs the training rollout with the images")
    model, tokenizer = load_model(folder, opts.dtype, chat_template=opts.chat_template)
    eos = eos_token_ids(str(folder), tokenizer)
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, n=opts.n, val_n=opts.n),
                                 data=dataclasses.replace(config.data, max_response_length=max_new))
    turns = LocalTurns(model, pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
                       eos_token_ids=eos, temperature=temperature, top_p=opts.top_p, tokenizer=tokenizer)
    rollout = build_rollout(turns, RolloutContext(config, tokenizer, base, eos))
    try:
        prompts = render_prompts(rows, tokenizer, 1 << 30, "error", tools=rollout.prompt_tools).rows
        context_room(folder, [p.prompt_ids for p in prompts])   # as single-turn eval checks them
        batches = [rollout.generate(prompt_batch(prompts[i:i + CHUNK], f"eval{i}", turns.pad_token_id),
                                    seed=opts.seed + i, mode="val") for i in range(0, len(prompts), CHUNK)]
    finally:
        rollout.close()
    samples = [s for batch in batches for s in rollout.eval_samples(batch, tokenizer)]
    grouped = [samples[i:i + opts.n] for i in range(0, len(samples), opts.n)]
    if not kind.own_reward(config):
        return grouped, None
    return grouped, _self_scored(rows, grouped, [(b, rollout.score(b, None, tokenizer)) for b in batches], rollout)


def _self_scored(rows: list[dict], grouped: list, scored: list, rollout):
    """(scores, correct, metrics, records) [prompt][sample] of a rollout that scored its own samples."""
    flat = [(float(b["scores"][r]), bool(b["acc"][r] > 0)) for b, _ in scored for r in rollout.sample_rows(b)]
    scores, correct, metrics, records, k = [], [], [], [], 0
    for i, (row, row_samples) in enumerate(zip(rows, grouped)):
        scores.append([]), correct.append([]), metrics.append([])
        for j, (item, fields) in enumerate(row_samples):
            score, ok = flat[k]
            sample_metrics = fields.pop("metrics", {})
            scores[-1].append(score), correct[-1].append(ok), metrics[-1].append(sample_metrics)
            records.append({"index": i, "sample": j, "data_source": row["data_source"], "prompt": row["prompt"],
                            "response": item["solution_str"], "ground_truth": item["ground_truth"],
                            "score": score, "correct": ok, "metrics": sample_metrics, **fields})
            k += 1
    return scores, correct, metrics, records


class LocalTurns:
    """`generate_turn` on a model in this process (rlctl eval): the hf engine, one rank; a
    rlctl.runtime.policy.TurnGenerator for a turn-by-turn rollout.

    Sampling settings are fixed here (the eval's temperature and top_p), whatever the mode."""

    world_size = 1

    def __init__(self, model, *, pad_token_id: int, eos_token_ids: list[int], temperature: float,
                 top_p: float = 1.0, tokenizer=None):
        from rlctl.workers.rollout.hf import HFRolloutEngine

        self.engine = HFRolloutEngine(model, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids,
                                      tokenizer=tokenizer)
        self.temperature, self.top_p, self.pad_token_id = temperature, top_p, pad_token_id

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
