"""One rollout: prompts -> generated responses -> reward scores, as a `Batch`.

Rows are prompt-major (prompt i's n samples are rows i*n .. i*n+n-1) and carry `uid`, the
group id that group estimators and dynamic sampling use. DAPO's dynamic sampling lives here:
it regenerates with fresh prompts until the batch holds `data.batch_size` informative groups or
`max_gen_batches` rounds have run, then proceeds with what it has (and says so in the metrics).
"""

from __future__ import annotations

import time

import numpy as np

from rlctl import algorithms
from rlctl.controller.prompts import PromptRow
from rlctl.runtime.batch import Batch, object_array


def prompt_batch(rows: list[PromptRow], tag: str, pad_token_id: int) -> Batch:
    """The generation input: left-padded prompt ids + mask, plus the per-prompt columns scoring needs."""
    width = max(len(r.prompt_ids) for r in rows)
    input_ids = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r.prompt_ids):] = r.prompt_ids
        attention_mask[i, width - len(r.prompt_ids):] = 1
    return Batch({
        "input_ids": input_ids, "attention_mask": attention_mask,
        "uid": object_array([f"{tag}-{i}" for i in range(len(rows))]),
        "data_source": object_array([r.data_source for r in rows]),
        "ground_truth": object_array([r.ground_truth for r in rows]),
        "extra_info": object_array([r.extra_info for r in rows]),
        "messages": object_array([r.messages for r in rows]),  # the chat prompt: judge and reward model read it
        # vision-language models: each prompt's PIL images (the worker turns them into pixel_values)
        **({"images": object_array([list(r.images) for r in rows])} if rows[0].images is not None else {}),
    })


def generate(actor, rows: list[PromptRow], *, seed: int, tag: str, pad_token_id: int, mode: str = "train") -> Batch:
    """Generate responses on the actor workers: mode "train" (rollout.n samples), "val" (val_n at
    val_temperature) or "greedy" (one argmax response per prompt, ReMax's baseline)."""
    return actor.generate(prompt_batch(rows, tag, pad_token_id), seed=seed, mode=mode)


def score(setup, batch: Batch, components: tuple = ()) -> dict:
    """Score a generated batch the way the run's rollout kind does (rlctl.rollouts: its reward function, its
    own rewards, or both); stores `scores`, `acc`, `response_text`; returns the reward metrics."""
    return setup.actor.rollout.score(batch, setup.reward, setup.tokenizer, components)


def reward_component_keys(config) -> tuple[str, ...]:
    """The reward components the estimator mixes (its params' reward_keys when it reads
    reward_components), which score() stores as reward_component/<name> columns."""
    if "reward_components" not in algorithms.get_estimator(config.algorithm.name).reads:
        return ()
    return algorithms.estimator_params(config.algorithm.name, config.algorithm.params).reward_keys


def rollout(setup, step: int) -> tuple[Batch, dict]:
    """A full training batch (generate + score), with DAPO dynamic sampling when enabled.

    `setup` is the TrainSetup: actor group, prompt loader, reward runner, tokenizer, config.
    """
    config = setup.config
    ds, want = config.algorithm.dynamic_sampling, config.data.batch_size
    kept: list[Batch] = []
    metrics: dict = {}
    have, rounds, reward_s = 0, 0, 0.0
    pushes: dict = {}
    while True:
        rounds += 1
        batch = generate(setup.actor, setup.loader.next_batch(), seed=setup.seed_for(step, rounds),
                         tag=f"{step}.{rounds}", pad_token_id=setup.pad_token_id)
        pushes = weight_sync_metrics(pushes, batch.meta)
        start = time.perf_counter()
        metrics = merge_round(metrics, score(setup, batch, reward_component_keys(config)), rounds)
        reward_s += time.perf_counter() - start
        metrics["timing/reward_s"] = reward_s  # part of timing/gen_s (the rollout phase)
        if not ds.enable:
            return batch, {**metrics, **pushes}
        keep = sampling_filter(batch, ds)
        if keep.num_kept:
            kept.append(batch.select(np.flatnonzero(keep.keep)))
            have += keep.num_kept
        if have >= want or rounds >= ds.max_gen_batches:
            break
    full = training_batch(setup, align_prompt_width(kept, setup.pad_token_id) if kept else [batch],
                          min(have, want) if kept else want)
    metrics.update({"dynamic_sampling/rounds": rounds, "dynamic_sampling/groups": float(min(have, want)),
                    "dynamic_sampling/short": float(have < want), **pushes})
    return full, metrics


def weight_sync_metrics(so_far: dict, meta: dict) -> dict:
    """perf/weight_sync_s and perf/weight_sync_mb: what the weight pushes before this step's
    generations took (the actor's generate reports its push in the batch's meta); perf/compile_s: the
    seconds its hf engine spent compiling decode steps (rollout.compile, once per run)."""
    out = dict(so_far)
    for key in ("weight_sync_s", "weight_sync_mb", "compile_s"):
        if key in meta:
            out[f"perf/{key}"] = out.get(f"perf/{key}", 0.0) + float(meta[key])
    return out


def push_metrics(timing: dict, weights: dict) -> dict:
    """perf/weight_sync_s and perf/weight_sync_mb of a push to the separate rollout group: the export
    (gathers, LoRA merged or the adapter alone) and the object-store put, as timed under
    timing/sync_weights_s; the rollout ranks load it while the trainer goes on."""
    from rlctl.workers.rollout.adapter_sync import push_mb

    return {"perf/weight_sync_s": timing["timing/sync_weights_s"], "perf/weight_sync_mb": push_mb(weights)}


def training_batch(setup, rounds: list[Batch], groups: int) -> Batch:
    """Dynamic sampling's kept rounds as the step's batch: its first `groups` groups, joined the way the
    run's rollout kind makes groups (rlctl.rollouts.base.Rollout.join_groups)."""
    return setup.actor.rollout.join_groups(rounds, groups, setup.actor.world_size)


def sampling_filter(batch: Batch, ds) -> algorithms.GroupFilter:
    """Which groups of a scored batch dynamic sampling keeps (`ds`: algorithm.dynamic_sampling):
    those whose metric varies, or with filter_accuracy those whose mean acc lies in the band; with
    filter_truncate, none with a response that ran out of data.max_response_length before an EOS."""
    metric = batch["acc"] if ds.metric == "acc" else batch["scores"]
    band = (ds.accuracy_lower_bound, ds.accuracy_upper_bound) if ds.filter_accuracy else None
    return algorithms.filter_groups(batch["uid"].tolist(), metric, band=band,
                                    truncated=batch["truncated"] if ds.filter_truncate else None,
                                    episode_ids=batch["agent_episode"] if "agent_episode" in batch else None)


def align_prompt_width(batches: list[Batch], pad_token_id: int) -> list[Batch]:
    """Left-pad each batch's prompt part to the widest, so rounds of generation can be joined.

    prompts [B, P] and the prompt part of input_ids / attention_mask [B, P+T] grow on the left;
    responses keep their fixed width T (max_response_length).
    """
    width = max(b["prompts"].shape[1] for b in batches)
    out = []
    for b in batches:
        extra = width - b["prompts"].shape[1]
        if extra:
            b = Batch(dict(b.tensors), b.meta)
            for key, fill in (("prompts", pad_token_id), ("input_ids", pad_token_id), ("attention_mask", 0)):
                b[key] = np.pad(b[key], ((0, 0), (extra, 0)), constant_values=fill)
            if "position_ids" in b:   # vision models: [B, 3, P+T]
                b["position_ids"] = np.pad(b["position_ids"], ((0, 0), (0, 0), (extra, 0)))
        out.append(b)
    return out


def merge_round(acc: dict, new: dict, rounds: int) -> dict:
    """Average reward metrics over generation rounds (one round when sampling is static)."""
    if rounds == 1:
        return dict(new)
    return {k: (acc.get(k, v) * (rounds - 1) + v) / rounds for k, v in new.items()}


def engine_copy_drift(generations: list[Batch]) -> dict:
    """rollout/engine_diff_mean and _max over the generations that arrived from a rollout group
    whose engine keeps its own weights (vLLM): its log-probs of the tokens it sampled against its
    rank's float32 copy's, both after the same push (rlctl.workers.roles.rollout_worker.engine_copy_drift_rows:
    per-row columns of a whole batch, a partial round's meta). Unlike rollout/logprob_diff_*, this
    stays at kernel noise however stale the batch is, so rollout.max_logprob_diff applies in
    one_step_off and async too. {} for the hf engine."""
    total, tokens, most = 0.0, 0, 0.0
    for g in generations:
        if "engine_diff_sum" in g:
            total += float(g["engine_diff_sum"].sum())
            tokens += int(g["response_length"].sum())
            most = max(most, float(g["engine_diff_max"].max()))
        elif g.meta.get("engine_diff_tokens"):
            total, tokens = total + g.meta["engine_diff_sum"], tokens + g.meta["engine_diff_tokens"]
            most = max(most, g.meta["engine_diff_max"])
    return {"rollout/engine_diff_mean": total / tokens, "rollout/engine_diff_max": most} if tokens else {}
