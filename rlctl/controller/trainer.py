"""The RL training loop: one plain-Python controller driving the worker groups.

Every recipe runs through `Trainer.fit`. What an algorithm needs (a critic, a reference model,
a greedy baseline) comes from its registry declaration (`algorithms.algorithm_needs`), so the
loop never asks which algorithm it is running. Each step is one call per worker method:

    rollout (generate + reward) -> [greedy baseline] -> [old log-probs] -> [ref log-probs]
    -> [teacher log-probs] -> [implicit PRM: update + process rewards] -> [values]
    -> advantages -> [critic update] -> actor update -> log / validate / save
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from rlctl.controller import checkpointing, prime, rollout, selfplay
from rlctl.controller.advantage import apply_rollout_correction, compute_advantages, policy_filtration
from rlctl.controller.setup import TrainSetup
from rlctl.controller.timing import phase
from rlctl.errors import NumericalError
from rlctl.runtime.balance import balanced

if TYPE_CHECKING:
    from rlctl.controller.signals import StopFlag

MAX_BAD_STEPS = 3  # non-finite loss/grad steps in a row before the run stops (exit 5)
# rollout.max_logprob_diff = 0: the limit by model.dtype, far above the kernel noise between an engine
# and the trainer on the same weights (float32 ~1e-6 per token, bf16 ~1e-3: docs/benchmarks.md) and
# far below what a missed weight push gives (tenths of a nat).
LOGPROB_DIFF_LIMITS = {"float32": 1e-3, "bfloat16": 0.05, "float16": 0.05}
# what the engine's log-probs of its samples are compared with, by drift metric (check_drift)
DRIFT_AGAINST = {"rollout/logprob_diff_mean": "trainer's", "rollout/engine_diff_mean": "rollout rank's copy's"}


class Trainer:
    def __init__(self, setup: TrainSetup):
        self.setup = setup
        self.config = setup.config
        self.bad_steps = 0
        self.flops = None   # rlctl.controller.perf.StepFlops, measured when fit starts
        self.agent_failures = None   # rlctl.agent.failures.FailureWatch, with agent programs

    def fit(self, stop: StopFlag) -> None:
        from rlctl.controller.perf import StepFlops

        setup, config = self.setup, self.config
        self.flops = StepFlops.measure(setup)
        if config.run.val_before_train and setup.val_rows and setup.session.state.step == 0:
            setup.session.logger.log(0, self.validate(0))
        selfplay.check_resume_step(setup.session.state.step, config.algorithm.ref_update_every)
        setup.rollouts.start(setup.session.state.step + 1)
        try:
            self.steps(stop)
        finally:
            setup.rollouts.close()

    def steps(self, stop: StopFlag) -> None:
        setup, config = self.setup, self.config
        for step in range(setup.session.state.step + 1, setup.total_steps + 1):
            timing, start = {}, time.perf_counter()
            with phase(timing, "gen"):
                batch, metrics = setup.rollouts.next(step)
            self.tell_rollout(step, batch, metrics)
            if setup.needs.greedy_baseline:
                with phase(timing, "greedy_baseline"):
                    self.add_greedy_baseline(batch, step)
            if setup.needs.real_response:   # SPIN: the reference answers, paired with the generations
                batch, more = selfplay.add_real_responses(batch, setup)
                metrics.update(more)
            batch = self.log_probs(batch, step, metrics, timing)
            if setup.prm is not None:   # PRIME: the implicit PRM learns from the outcomes and scores the tokens
                with phase(timing, "prm"):
                    batch, more = prime.process_rewards(with_mini_batches(batch, "actor", config, setup.prm),
                                                        config, setup.prm)
                metrics.update(more)
            if setup.needs.critic:
                with phase(timing, "values"):
                    values = setup.critic.compute_values(balanced(batch, config.critic.micro_batch_max_tokens))
                    batch = batch.union(values)
            with phase(timing, "adv"):
                metrics.update(compute_advantages(batch, config, setup.kl_ctrl))
            if config.algorithm.use_pf_ppo:   # PF-PPO: train on each prompt's samples resampled by score
                batch, more = policy_filtration(batch, config, setup.seed_for(step, -1))
                metrics.update(more)
            if setup.needs.critic:
                with phase(timing, "update_critic"):
                    metrics.update(setup.critic.update_critic(with_mini_batches(batch, "critic", config,
                                                                                setup.critic)))
            if step > config.critic.pretrain_steps:   # value pretraining: the first steps train the critic only
                with phase(timing, "update_actor"):
                    metrics.update(setup.actor.update_actor(with_mini_batches(batch, "actor", config, setup.actor)))
            if "actor/drift_tokens" in metrics:   # no old_log_prob pass: the update measured the engine's drift
                metrics.update(update_drift(metrics))
                if setup.rollouts.on_policy:   # before anything of this step is saved
                    self.check_drift(step, metrics)
            timing.update(setup.rollouts.after_update(step))
            setup.session.state.step = step
            metrics.update(self.step_metrics(batch, time.perf_counter() - start))
            metrics.setdefault("actor/kl", kl_metric(metrics))
            new_best = False
            val_due = config.run.val_every and step % config.run.val_every == 0
            if setup.val_rows and (step == setup.total_steps or val_due):
                with phase(timing, "val"):
                    metrics.update(self.validate(step))
                new_best = self.track_best(step, metrics)
            metrics.update(timing)
            self.check_numerics(metrics, step)
            setup.log_step(step, metrics, batch)
            if step == setup.total_steps or (config.run.save_every and step % config.run.save_every == 0) or new_best:
                checkpointing.save(setup.session, step)
            stop.check()

    def tell_rollout(self, step: int, batch, metrics: dict) -> None:
        """The console's lines about a rollout: dynamic sampling short of informative groups; failed agent
        episodes with each reason's count (every episode failing in several steps in a row stops the run)."""
        display = self.setup.display
        if metrics.get("dynamic_sampling/short"):
            groups, rounds = int(metrics["dynamic_sampling/groups"]), int(metrics["dynamic_sampling/rounds"])
            display.print(f"step {step}: dynamic sampling found {groups} of {self.config.data.batch_size} "
                          f"informative groups in {rounds} rounds (algorithm.dynamic_sampling.max_gen_batches); "
                          "training on those")
        if "agent_failure" in batch:
            from rlctl.agent.failures import FailureWatch

            self.agent_failures = self.agent_failures or FailureWatch(display.print)
            self.agent_failures.step(step, batch["agent_failure"][rollout.episode_rows(batch)])

    def log_probs(self, batch, step: int, metrics: dict, timing: dict):
        """old_log_prob (recomputed, or the rollout's in bypass mode), ref_log_prob (the opponent first
        refreshed when a self-play iteration starts) and the teachers' log-probs, as the run needs."""
        setup, config = self.setup, self.config
        budget = config.actor.micro_batch_max_tokens   # > 0: the rows spread over the workers by tokens
        if config.algorithm.rollout_correction.bypass_mode:   # verl's bypass: no recompute pass,
            batch["old_log_prob"] = batch["rollout_log_prob"]  # correction runs inside the loss
        elif setup.recompute_old_log_prob:
            with phase(timing, "old_log_prob"):
                batch = batch.union(setup.actor.compute_log_prob(balanced(batch, budget)))
            if "rollout_log_prob" in batch:
                metrics.update(rollout_drift(batch))
                if setup.rollouts.on_policy:   # an off-policy source drifts by design
                    self.check_drift(step, metrics)
            metrics.update(apply_rollout_correction(batch, config))
        if "rollout/engine_diff_mean" in metrics:   # an off-policy source's engine against its rank's copy
            self.check_drift(step, metrics, "rollout/engine_diff_mean")
        if setup.needs.reference:
            with phase(timing, "ref"):
                if selfplay.refresh_due(step, config.algorithm.ref_update_every):
                    setup.actor.sync_reference()
                batch = batch.union(setup.actor.compute_ref_log_prob(balanced(batch, budget)))
            metrics.update(selfplay.spin_margin(batch))
        if setup.teachers is not None:
            with phase(timing, "teacher"):
                batch = setup.teachers.score(batch, metrics)
        return batch

    def check_drift(self, step: int, metrics: dict, key: str = "rollout/logprob_diff_mean") -> None:
        """An engine with its own weights must generate with the pushed ones: its log-probs of its own
        samples may differ by kernel and dtype noise only (rollout.max_logprob_diff) from the trainer's
        (key rollout/logprob_diff_mean, on-policy) or, in a separate rollout group, from its rank's
        float32 copy's, which holds the same push (rollout/engine_diff_mean)."""
        drift = metrics.get(key, 0.0)
        limit, dtype = logprob_diff_limit(self.config)
        if drift > limit:
            engine, other = self.config.rollout.engine, DRIFT_AGAINST[key]
            raise NumericalError(f"step {step}: the {engine} engine's log-probs of its samples differ from the "
                                 f"{other} by {drift:.3g} nats per token on average (max "
                                 f"{metrics.get(key.replace('_mean', '_max'), drift):.3g}), over "
                                 f"rollout.max_logprob_diff = {limit:g} ({dtype}): it is not generating with the "
                                 "pushed weights",
                                 hint="a weight push failed or was incomplete; resume from the last checkpoint, "
                                      "or raise rollout.max_logprob_diff if the engine's kernels are that noisy")

    def add_greedy_baseline(self, batch, step: int) -> None:
        """ReMax: score one greedy response per prompt; its score is each sample's baseline."""
        setup, n = self.setup, self.config.rollout.n
        rows = setup.rows_of(batch, n)
        greedy = rollout.generate(setup.actor, rows, seed=setup.seed_for(step, 0), tag=f"{step}.greedy",
                                  pad_token_id=setup.pad_token_id, mode="greedy")
        rollout.score(greedy, setup.reward, setup.tokenizer)
        batch["reward_baselines"] = np.repeat(greedy["scores"], n)

    def track_best(self, step: int, metrics: dict) -> bool:
        """run.best_metric: a validation that beats the best so far makes this step the best one
        (the loop then saves it; BEST.json names it once saved). True when it did."""
        run = self.config.run
        value = metrics.get(run.best_metric) if run.best_metric else None
        if value is None or value != value:   # off, not logged, or NaN: never a best
            return False
        state = self.setup.session.state
        best = state.best
        if best is not None and not (value > best["value"] if run.best_mode == "max" else value < best["value"]):
            return False
        state.best = {"step": step, "metric": run.best_metric, "mode": run.best_mode, "value": float(value)}
        return True

    def validate(self, step: int) -> dict:
        """Greedy (val_temperature) generation on data.val_files; reward and accuracy per data source."""
        setup, config = self.setup, self.config
        parts = []
        for i in range(0, len(setup.val_rows), config.data.val_batch_size):
            rows = setup.val_rows[i:i + config.data.val_batch_size]
            part = rollout.generate(setup.actor, rows, seed=setup.seed_for(step, -1 - i), tag=f"val{step}.{i}",
                                    pad_token_id=setup.pad_token_id, mode="val")
            rollout.score(part, setup.reward, setup.tokenizer)
            part = part.select(rollout.episode_rows(part))   # one row per sample (agent episode)
            parts.append(part.select_keys([k for k in ("data_source", "scores", "acc", "response_length", "uid")
                                           if k in part]))
        out = validation_metrics(parts)
        setup.display.print(validation_line(step, out))
        return out

    def step_metrics(self, batch, step_s: float) -> dict:
        trained, batch = batch, selfplay.generated_rows(batch)   # the policy's own samples (not SPIN's answers)
        mask = batch["response_mask"]
        lengths = batch["response_length"].astype(np.float64)
        generated = float(mask.sum())
        prompt_tokens = float(batch["attention_mask"][:, :batch["prompts"].shape[1]].sum())
        return {
            **reward_metrics(batch),
            "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
            "response_length/clip_ratio": float((lengths >= self.config.data.max_response_length).mean()),
            "prompt_length/mean": prompt_tokens / len(batch),
            "timing/step_s": step_s, "perf/tokens_per_s": generated / step_s,
            "perf/total_tokens_per_s": float(batch["attention_mask"].sum()) / step_s,
            "data/epoch": float(self.setup.loader.epoch), "data/sequences": float(len(batch)),
            **(self.flops.metrics(trained, step_s) if self.flops is not None else {}),
        }

    def check_numerics(self, metrics: dict, step: int) -> None:
        """A skipped (non-finite) update is counted; several in a row stop the run (exit 5)."""
        skipped = metrics.get("actor/skipped_steps", 0) + metrics.get("critic/skipped_steps", 0)
        self.bad_steps = self.bad_steps + 1 if skipped else 0
        if self.bad_steps >= MAX_BAD_STEPS:
            raise NumericalError(f"non-finite loss or gradients in {self.bad_steps} steps in a row (last: step "
                                 f"{step}); the weights were left unchanged",
                                 hint="lower actor.lr, set actor.grad_clip, or use model.dtype = \"float32\".")


def reward_metrics(batch) -> dict:
    """reward/mean, reward/std and reward/acc over the rollout's samples: an agent episode counts once,
    however many rows it became (rlctl.controller.rollout.episode_rows)."""
    samples = rollout.episode_rows(batch)
    scores = batch["scores"][samples]
    return {"reward/mean": float(scores.mean()), "reward/std": float(scores.std()),
            "reward/acc": float(batch["acc"][samples].mean())}


def with_mini_batches(batch, role: str, config, group):
    """The batch with meta["mini_batches"] set, so W workers take exactly one worker's optimizer steps.

    Mini-batches hold the batch plan's sequences (role.mini_batch_size prompts x rollout.n); a short
    (dynamic-sampling) batch gets fewer, and the count always divides the rows evenly over the workers.
    """
    from rlctl.config.plan import batch_plan, mini_batch_count
    from rlctl.runtime.batch import Batch

    per_mini = batch_plan(config, role).sequences_per_mini_batch
    if "real_response" in batch:   # SPIN: each generation travels with its reference-answer twin
        per_mini *= 2
    # an agent rollout's rows outnumber its episodes when some split; it set the plan's count itself
    count = mini_batch_count(len(batch), world=group.world_size, sequences_per_mini=per_mini,
                             preset=int(batch.meta.get("mini_batches", 0)))
    # a token budget: each mini-batch's rows spread over the workers by tokens (rlctl.runtime.balance)
    return balanced(Batch(batch.tensors, {**batch.meta, "mini_batches": count}),
                    getattr(config, role).micro_batch_max_tokens)


def rollout_drift(batch) -> dict:
    """How far a GPU engine's log-probs of its sampled tokens are from the trainer's (same weights,
    other kernels and dtype): a large or growing value means the engine is not generating with
    the trained weights; in one_step_off mode, how far the policy moved in one update. Means and
    max over response tokens, as log-probs and as probabilities, and the sampled KL."""
    mask = batch["response_mask"] > 0
    if not mask.any():
        return {}
    old, engine = batch["old_log_prob"][mask].astype(np.float64), batch["rollout_log_prob"][mask].astype(np.float64)
    diff = np.abs(old - engine)
    return drift_metrics(abs_sum=float(diff.sum()), abs_max=float(diff.max()),
                         prob_sum=float(np.abs(np.exp(old) - np.exp(engine)).sum()),
                         kl_sum=float((engine - old).sum()), tokens=float(diff.size))


def drift_metrics(*, abs_sum: float, abs_max: float, prob_sum: float, kl_sum: float, tokens: float) -> dict:
    """The rollout/* drift metrics from sums over `tokens` response tokens (rollout_drift's, or the
    actor update's: update_drift); `rollout/kl` is the k1 estimate of KL(rollout || trainer)."""
    return {"rollout/logprob_diff_mean": abs_sum / tokens, "rollout/logprob_diff_max": abs_max,
            "rollout/prob_diff_mean": prob_sum / tokens, "rollout/kl": kl_sum / tokens}


def update_drift(metrics: dict) -> dict:
    """rollout_drift's metrics from the sums the actor's update reported (actor/drift_*, popped from
    `metrics`): on-policy with one optimizer step the trainer's log-probs come from the update's own
    forward, before its optimizer step, instead of a separate old_log_prob pass."""
    sums = {k: metrics.pop(f"actor/drift_{k}") for k in ("abs_sum", "prob_sum", "kl_sum", "tokens", "abs_max")}
    return drift_metrics(**sums) if sums["tokens"] > 0 else {}


def logprob_diff_limit(config) -> tuple[float, str]:
    """rollout.max_logprob_diff, or its default for model.dtype ("auto": float32 on CPU, bfloat16 on
    GPUs, as rlctl.workers.parallel.fsdp.resolve_dtype); and the dtype it was chosen for. With top-p / top-k on
    there is no default (vLLM's log-probs are then of the filtered distribution, the trainer's not)."""
    dtype = config.model.dtype
    if dtype == "auto":
        dtype = "float32" if config.resources.gpus_per_node == 0 else "bfloat16"
    if config.rollout.max_logprob_diff > 0:
        return config.rollout.max_logprob_diff, dtype
    if config.rollout.top_p < 1 or config.rollout.top_k > 0:   # the engine's log-probs are of the filtered,
        return float("inf"), dtype                              # renormalised distribution: no default
    return LOGPROB_DIFF_LIMITS.get(dtype, LOGPROB_DIFF_LIMITS["bfloat16"]), dtype


def kl_metric(metrics: dict) -> float:
    """`actor/kl` when the actor did not report it: KL to the reference when there is one (as a loss
    or in the reward), else between the rollout policy and the updated one (`actor/ppo_kl`)."""
    for key in ("actor/kl_loss", "actor/reward_kl", "actor/ppo_kl"):
        if key in metrics:
            return float(metrics[key])
    return 0.0


def validation_line(step: int, val: dict) -> str:
    """One line for the display: overall reward / accuracy / length, and accuracy per data source
    when there are several."""
    line = (f"validation at step {step}: reward {val['val/reward/mean']:.3f}  acc {val['val/acc']:.3f}  "
            f"len {val['val/response_length/mean']:.1f}")
    sources = [k[len("val/"):-len("/acc")] for k in val if k.endswith("/acc") and k != "val/acc"]
    if len(sources) > 1:
        line += "  (" + ", ".join(f"{ds} acc {val[f'val/{ds}/acc']:.3f}" for ds in sources) + ")"
    return line


def validation_metrics(parts) -> dict:
    """The metrics config.metrics.validation_metric_names lists, from the validation batches."""
    from rlctl.config.metrics import VAL_METRIC_COLUMNS, VAL_METRICS_PER_SOURCE
    from rlctl.runtime.batch import Batch

    batch = Batch.concat(parts)
    out = {f"val/{name}": float(batch[column].mean()) for name, column in VAL_METRIC_COLUMNS.items()}
    sources = batch["data_source"]
    for ds in sorted(set(sources.tolist())):
        rows = sources == ds
        out.update({f"val/{ds}/{name}": float(batch[VAL_METRIC_COLUMNS[name]][rows].mean())
                    for name in VAL_METRICS_PER_SOURCE})
    out.update(pass_at_k_metrics(batch))
    return out


def pass_at_k_metrics(batch) -> dict:
    """With rollout.val_n = n > 1 (each prompt's n samples share a `uid`): pass@k of `acc`, overall
    and per data source, averaged over prompts (val/acc is then mean@n)."""
    from rlctl.config.metrics import pass_at_k, pass_ks

    if "uid" not in batch:
        return {}
    groups: dict = {}
    for uid, ds, right in zip(batch["uid"].tolist(), batch["data_source"].tolist(), batch["acc"].tolist()):
        groups.setdefault(uid, (ds, []))[1].append(right > 0.5)
    n = min(len(r) for _, r in groups.values())
    if n < 2:
        return {}
    out = {}
    for prefix, members in (("", list(groups.values())),
                            *((f"{ds}/", [g for g in groups.values() if g[0] == ds])
                              for ds in sorted({g[0] for g in groups.values()}))):
        for k in pass_ks(n):
            out[f"val/{prefix}acc/pass@{k}"] = sum(pass_at_k(len(r), sum(r), k) for _, r in members) / len(members)
    return out
