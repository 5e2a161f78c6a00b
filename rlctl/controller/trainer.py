"""The RL training loop: one plain-Python controller driving the worker groups.

Every recipe runs through `Trainer.fit`. What an algorithm needs (a critic, a reference model,
a greedy baseline) comes from its registry declaration (`algorithms.run_needs`), so the loop never
asks which algorithm it is running: it runs the passes the needed columns name, one call each
(rlctl.controller.passes.PASSES, in order):

    rollout (generate + reward) -> [greedy baseline] -> [reference answers] -> [old log-probs]
    -> [rollout correction] -> [ref log-probs] -> [teacher log-probs] -> [implicit PRM: update +
    process rewards] -> [values] -> advantages -> [critic update] -> actor update -> log / validate / save
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from rlctl.controller import checkpointing, rollout, selfplay
from rlctl.controller.advantage import compute_advantages, policy_filtration
from rlctl.controller.drift import check_drift, update_drift
from rlctl.controller.passes import run_passes, with_mini_batches
from rlctl.controller.setup import TrainSetup
from rlctl.controller.timing import phase
from rlctl.errors import NumericalError

if TYPE_CHECKING:
    from rlctl.controller.signals import StopFlag

MAX_BAD_STEPS = 3  # non-finite loss/grad steps in a row before the run stops (exit 5)


class Trainer:
    def __init__(self, setup: TrainSetup):
        self.setup = setup
        self.config = setup.config
        self.bad_steps = 0
        self.flops = None   # rlctl.controller.perf.StepFlops, measured when fit starts
        self.passes = []   # the run's passes (rlctl.controller.passes), from begin()

    def fit(self, stop: StopFlag) -> None:
        self.begin()
        try:
            for step in range(self.setup.session.state.step + 1, self.setup.total_steps + 1):
                self.step(step)
                stop.check()
        finally:
            self.setup.rollouts.close()

    def begin(self) -> None:
        """Before the first step of this session: FLOPs, validation at step 0, the rollout source started
        (fit's; several runs on one base call it, `step` and `rollouts.close` for each run in turn)."""
        from rlctl.controller.perf import StepFlops

        setup, config = self.setup, self.config
        self.flops = StepFlops.measure(setup)
        if config.run.val_before_train and setup.val_rows and setup.session.state.step == 0:
            setup.session.logger.log(0, self.validate(0))
        selfplay.check_resume_step(setup.session.state.step, config.algorithm.ref_update_every)
        setup.rollouts.start(setup.session.state.step + 1)
        self.passes = run_passes(setup)

    def step(self, step: int) -> None:
        """One training step: rollout, the passes, advantages, updates, log, validate, save."""
        setup, config, passes = self.setup, self.config, self.passes
        timing, start = {}, time.perf_counter()
        with phase(timing, "gen"):
            batch, metrics = setup.rollouts.next(step)
        self.tell_rollout(step, batch, metrics)
        if "rollout/engine_diff_mean" in metrics:   # an off-policy source's engine against its rank's copy
            check_drift(config, step, metrics, "rollout/engine_diff_mean")
        for p in passes:   # the passes that fill the columns the run needs, in order
            batch = p.fill(setup, batch, step, metrics, timing)
        with phase(timing, "adv"):
            metrics.update(compute_advantages(batch, config, setup.kl_ctrl))
        if config.algorithm.use_pf_ppo:   # PF-PPO: train on each prompt's samples resampled by score
            batch, more = policy_filtration(batch, config, setup.seed_for(step, -1))
            metrics.update(more)
        for p in passes:   # a pass whose role learns from the advantages (the critic)
            if p.train is not None:
                p.train(setup, batch, metrics, timing)
        if step > config.critic.pretrain_steps:   # value pretraining: the first steps train the critic only
            with phase(timing, "update_actor"):
                metrics.update(setup.actor.update_actor(with_mini_batches(batch, "actor", config, setup.actor)))
        if "actor/drift_tokens" in metrics:   # no old_log_prob pass: the update measured the engine's drift
            metrics.update(update_drift(metrics))
            if setup.rollouts.on_policy:   # before anything of this step is saved
                check_drift(config, step, metrics)
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

    def tell_rollout(self, step: int, batch, metrics: dict) -> None:
        """The console's lines about a rollout: dynamic sampling short of informative groups; the rollout
        kind's own (rlctl.rollouts.base.Rollout.watch: e.g. failed agent episodes, which may stop the run)."""
        display = self.setup.display
        if metrics.get("dynamic_sampling/short"):
            groups, rounds = int(metrics["dynamic_sampling/groups"]), int(metrics["dynamic_sampling/rounds"])
            display.print(f"step {step}: dynamic sampling found {groups} of {self.config.data.batch_size} "
                          f"informative groups in {rounds} rounds (algorithm.dynamic_sampling.max_gen_batches); "
                          "training on those")
        self.setup.actor.rollout.watch(step, batch, display.print)

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
        parts, lengths = [], []
        for i in range(0, len(setup.val_rows), config.data.val_batch_size):
            rows = setup.val_rows[i:i + config.data.val_batch_size]
            part = rollout.generate(setup.actor, rows, seed=setup.seed_for(step, -1 - i), tag=f"val{step}.{i}",
                                    pad_token_id=setup.pad_token_id, mode="val")
            rollout.score(setup, part)
            lengths.append(part["response_length"])
            part = part.select(setup.actor.rollout.sample_rows(part))   # one row per sample (an agent's episode)
            parts.append(part.select_keys([k for k in ("data_source", "scores", "acc", "response_length", "uid")
                                           if k in part]))
        out = validation_metrics(parts)
        out["val/response_length/mean"] = float(np.concatenate(lengths).mean())   # per row, as in training
        setup.display.print(validation_line(step, out))
        return out

    def step_metrics(self, batch, step_s: float) -> dict:
        trained, batch = batch, selfplay.generated_rows(batch)   # the policy's own samples (not SPIN's answers)
        mask = batch["response_mask"]
        lengths = batch["response_length"].astype(np.float64)
        generated = float(mask.sum())
        prompt_tokens = float(batch["attention_mask"][:, :batch["prompts"].shape[1]].sum())
        return {
            **reward_metrics(batch, self.setup.actor.rollout.sample_rows(batch)),
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


def reward_metrics(batch, samples) -> dict:
    """reward/mean, reward/std and reward/acc over the rollout's samples (`samples`: their rows, one each,
    rlctl.rollouts.base.Rollout.sample_rows: an agent episode counts once, however many rows it became)."""
    scores = batch["scores"][samples]
    return {"reward/mean": float(scores.mean()), "reward/std": float(scores.std()),
            "reward/acc": float(batch["acc"][samples].mean())}


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
