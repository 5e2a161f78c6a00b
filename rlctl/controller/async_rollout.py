"""Asynchronous rollouts with bounded staleness (rollout.mode = "async").

A separate rollout group (rlctl.workers.roles.rollout_worker, as in one_step_off) generates batch after
batch with the weights it was last pushed, without waiting for the trainer; finished batches
queue in a buffer and the trainer takes data.batch_size groups from its head as soon as they
are there. When to generate, push and drop is rlctl.controller.async_schedule's (counts only):

    rollout group:  gen 1 (v0) | gen 2 (v0) | gen 3 (v0) | load v1 | gen 4 (v1) | ...   (K = 2)
    actor group:               | train 1    | train 2    | train 3   ...
                                 ^ push v1 after update 1 (every rollout.sync_every updates)

Every row carries `policy_version` (the update count of the weights that generated it) and
`rollout_log_prob` (their log-probs); the trainer recomputes old_log_prob (the proximal policy
of decoupled_ppo, the reference of rollout correction) and logs rollout/kl between the two.
A group more than rollout.max_staleness updates stale when its step comes is dropped
(async/dropped) and refilled with the next prompts.

Resume is exact: a checkpoint holds every batch generated or generating (the save waits for them),
the schedule's counts, the prompt loader's position (trainer_state.json), and, between two
pushes, the weights the rollout group holds; seeds are a pure function of (run.seed, batch
index). Multi-turn batches run through rlctl.controller.async_turns.

With rollout.partial_rollout each generation call is one round (rlctl.workers.rollout.partial):
it admits a batch of prompts (or none: a round that only continues the unfinished samples, sent
when the trainer needs groups and nothing else is generating) and returns the groups that
finished; unfinished samples stay on their rollout rank across pushes, with per-token versions,
and the buffer hands out the groups with the oldest tokens first. With several rollout ranks a
round is data-parallel (the prompts split over them, a pool per rank) and `merge_rounds` joins
the ranks' parts. The checkpoint also holds every rank's pool.
With dynamic sampling each round's finished groups are scored and filtered as they arrive, and
algorithm.dynamic_sampling.max_gen_batches counts the rounds that admitted a batch.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlctl.controller import rollout
from rlctl.controller.async_schedule import AsyncSchedule
from rlctl.controller.timing import phase
from rlctl.rollouts.table import kind_of
from rlctl.runtime.batch import Batch

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup
    from rlctl.workers.roles.groups import Workers

STATE_FILE = "async_rollout.pkl"


class AsyncRollout:
    """The rollout source of async mode (rlctl.controller.rollout_source.RolloutSource)."""

    on_policy = False   # batches come from weights up to rollout.max_staleness updates old

    def __init__(self, setup: TrainSetup, workers: Workers):
        ro = setup.config.rollout
        self.setup, self.group, self.n = setup, workers.rollout, ro.n
        self.multi_turn = not kind_of(setup.config).one_call   # the tool loop: a batch is many calls
        if self.multi_turn:   # they queue on one thread (rlctl.controller.async_turns)
            from rlctl.controller.async_turns import TurnQueue

            self.group = TurnQueue(setup, workers.rollout)
        self.plan = AsyncSchedule(max_staleness=ro.max_staleness, strategy=ro.staleness_strategy,
                                  sync_every=ro.sync_every, total_steps=setup.total_steps,
                                  group_size=setup.config.data.batch_size)
        self.inflight: deque = deque()    # PendingCall or Batch per generation call, in submission order
        self.ready: list[Batch] = []      # finished, not yet trained groups (at most one part batch)
        self.push = None                  # the last weight push (PendingCall)
        self.restored: dict | None = None
        self.last_return = time.perf_counter()
        self.sampling = setup.config.algorithm.dynamic_sampling   # DAPO: groups filtered as they arrive
        self.scored: dict = {}   # dynamic sampling: the reward metrics of the generations scored this step
        self.scored_count = 0    # dynamic sampling: arrivals scored this step (each non-empty one)
        self.partial = ro.partial_rollout   # generation in rounds; unfinished samples stay on the rollout ranks
        self.rounds = 0                     # partial: rounds issued (each one's seed)
        self.pool_rows = 0                  # partial: unfinished samples on the ranks after the last arrived round
        self.pool_oldest = None             # partial: their oldest token's version (None: none)
        self.admitted: deque = deque()      # partial: rows each round in flight admits
        # partial: rounds after each push beyond fill's, so that a sample of data.max_response_length
        # tokens needs at most K versions: ceil(ceil(T / chunk) / K) rounds a push in all
        rounds = -(-setup.config.data.max_response_length // ro.partial_chunk)
        if kind_of(setup.config).round_of == "turn":   # a round is one turn of each conversation
            rounds = ro.multi_turn.max_turns
        self.extra_rounds = -(-rounds // ro.max_staleness) - 1 if self.partial else 0

    def start(self, first_step: int) -> None:
        """Push the weights the rollout group generates with, take back what a checkpoint saved,
        and fill the pipeline."""
        saved, self.restored = self.restored, None
        weights = None
        if saved is not None:
            self.plan.load_state_dict(saved["schedule"])
            self.ready = [Batch(t, m) for t, m in saved["ready"]]   # arrived (scored, filtered): as they were
            self.inflight = deque(Batch(t, m) for t, m in saved["inflight"])
            weights = saved["rollout_weights"]
            if saved.get("partial"):   # the unfinished samples go back to the rollout ranks first
                part = saved["partial"]
                self.group.submit("load_pool", self.rank_pools(part["pool"]))
                self.rounds, self.pool_rows, self.admitted = part["rounds"], part["pool_rows"], deque(part["admitted"])
                self.pool_oldest = part["pool_oldest"]
        else:
            done = (first_step - 1) * self.plan.group_size
            self.plan.issued = self.plan.taken = done
            self.plan.pushed = first_step - 1
        if weights is None:   # the rollout group holds the actor's current weights
            weights = self.setup.actor.export_weights()
        self.push = self.group.submit("update_weights", weights, version=self.plan.pushed)
        self.last_return = time.perf_counter()
        self.fill()

    def rank_pools(self, pools):
        """The saved unfinished samples, one part per rollout rank as `load_pool` takes them (a
        checkpoint of one rank before pools were per rank holds one dict; multi-turn: one blob)."""
        if self.multi_turn:
            return pools
        pools = [pools] if not isinstance(pools, list) else pools
        if len(pools) != self.group.world_size:
            from rlctl.errors import CheckpointError

            raise CheckpointError(f"the checkpoint holds the unfinished samples of {len(pools)} rollout rank(s), this "
                                  f"run has {self.group.world_size}", hint="resume with the checkpoint's "
                                  f"resources.rollout_workers = {len(pools)}")
        return pools

    def fill(self) -> None:
        """Issue generation calls while the schedule allows (each: the next G prompts)."""
        while self.plan.may_issue():
            self.issue()

    def issue(self) -> None:
        """One generation call of the next G prompts."""
        setup = self.setup
        index = self.plan.issued // self.plan.group_size + 1   # equals the step when nothing was dropped
        prompts = rollout.prompt_batch(setup.loader.next_batch(), f"{index}.1", setup.pad_token_id)
        self.generate(prompts, index)
        self.plan.issued += self.plan.group_size

    def generate(self, prompts: Batch | None, index: int) -> None:
        """Send one generation call: the whole batch, or with partial rollouts one round that admits
        `prompts` (None: only continues the unfinished samples)."""
        if not self.partial:
            self.inflight.append(self.group.submit("generate", prompts, seed=self.setup.seed_for(index, 1)))
            return
        self.rounds += 1
        self.inflight.append(self.group.submit("generate_round", prompts, seed=self.setup.seed_for(self.rounds, 2)))
        self.admitted.append(0 if prompts is None else len(prompts) * self.n)

    def after_update(self, step: int) -> dict:
        timing: dict = {}
        if self.plan.push_due(step):
            with phase(timing, "sync_weights"):
                weights = self.setup.actor.export_weights()
                self.push = self.group.submit("update_weights", weights, version=step)
                self.plan.pushed = step
            timing.update(rollout.push_metrics(timing, weights))
            self.fill()
            for _ in range(self.extra_rounds if self.pool_rows else 0):
                self.generate(None, 0)   # partial: continue the long samples while the trainer trains
        return timing

    def next(self, step: int) -> tuple[Batch, dict]:
        """Batch `step`: data.batch_size groups from the buffer's head, stale ones dropped; scored."""
        start = time.perf_counter()
        batch, dropped, gens = self.take(step)
        waited = time.perf_counter() - start
        self.push.result()   # a failed push surfaces here
        now = time.perf_counter()
        cycle, self.last_return = max(now - self.last_return, 1e-9), now
        if self.sampling.enable:   # scored as each batch arrived, to filter its groups
            metrics = dict(self.scored)
        else:
            metrics = self.score_batch(batch)
            metrics["timing/reward_s"] = time.perf_counter() - now
        staleness = self.plan.staleness(step, batch["policy_version"]).astype(np.float64)
        idle = sum(g.meta.get("rollout_idle_s", 0.0) for g in gens)
        busy = sum(g.meta.get("rollout_busy_s", 0.0) for g in gens)
        metrics.update({"timing/gen_wait_s": waited, "rollout/policy_version": float(batch["policy_version"].min()),
                        "rollout/staleness": float(staleness.max()),
                        "async/staleness_mean": float(staleness.mean()), "async/staleness_max": float(staleness.max()),
                        "async/dropped": float(dropped),
                        "async/partial_ratio": partial_ratio(batch),
                        "async/idle_trainer": min(1.0, waited / cycle),
                        "async/idle_rollout": idle / (idle + busy) if idle + busy > 0 else 0.0,
                        **rollout.engine_copy_drift(gens)})
        return batch, metrics

    def score_batch(self, batch: Batch) -> dict:
        setup = self.setup
        return rollout.score(setup, batch, rollout.reward_component_keys(setup.config))

    def take(self, step: int) -> tuple[Batch, int, list[Batch]]:
        """G groups for `step` from the buffer, in order, dropping those too stale for it (and
        refilling); returns (batch, groups dropped, the generations that finished meanwhile).
        With dynamic sampling, fewer when algorithm.dynamic_sampling.max_gen_batches ran out."""
        plan, n, parts, dropped, gens = self.plan, self.n, [], 0, []
        need, self.scored, self.scored_count = plan.group_size, {}, 0
        while self.partial and plan.strategy == "wait" and self.pool_oldest is not None \
                and step < plan.total_steps and plan.too_stale(step + 1, self.pool_oldest):
            self.arrive(step, gens)   # "wait": a sample that would be too stale after this step finishes now
        while need:
            if not self.ready:
                done = self.generations(gens)
                if self.sampling.enable and done >= self.sampling.max_gen_batches and parts:
                    break   # train on what is informative so far, as sync's dynamic sampling does
                admits = not self.partial or bool(self.inflight and self.admitted[0])
                last = self.sampling.enable and done + 1 >= self.sampling.max_gen_batches and admits
                self.arrive(step, gens, keep=need if last and not parts else 0)   # nothing informative: as sync
                continue
            head = self.ready.pop(0)
            group_version = head["policy_version"].reshape(-1, n).min(axis=1)
            fresh = ~plan.too_stale(step, group_version)
            if not fresh.all():
                dropped += int((~fresh).sum())
                plan.dropped += int((~fresh).sum())
                head = head.select(np.flatnonzero(np.repeat(fresh, n))) if fresh.any() else None
                self.fill()   # refill right away
            if head is None:
                continue
            groups = len(head) // n
            if groups > need:   # the rest stays at the buffer's head for the next step
                self.ready.insert(0, head.slice(need * n, len(head)))
                head = head.slice(0, need * n)
            parts.append(head)
            plan.taken += min(groups, need)
            need -= min(groups, need)
        batch = parts[0] if len(parts) == 1 else Batch.concat(rollout.align_prompt_width(parts,
                                                                                         self.setup.pad_token_id))
        batch = self.even_rows(batch)
        self.fill()
        if self.sampling.enable:
            got = len(batch) // n
            self.scored.update({"dynamic_sampling/rounds": float(self.generations(gens)),
                                "dynamic_sampling/groups": float(got),
                                "dynamic_sampling/short": float(got < plan.group_size)})
        return batch, dropped, gens

    def generations(self, gens: list[Batch]) -> int:
        """What algorithm.dynamic_sampling.max_gen_batches counts of the step's arrivals: each
        generation, or with partial rollouts each round that admitted a batch of prompts."""
        return sum(bool(g.meta.get("admitted")) for g in gens) if self.partial else len(gens)

    def arrive(self, step: int, gens: list[Batch], keep: int = 0) -> None:
        """The next finished generation into the buffer (waiting for it); with dynamic sampling
        scored first, its uninformative groups filtered out (counted, refilled) except up to `keep`
        groups (the step's last allowed generation, and nothing informative yet: sync trains on it
        too; `keep` is the groups the step still needs, so none is left over for the next step)."""
        if not self.inflight and self.partial and self.plan.pending > 0 and self.pool_rows > 0:
            self.generate(None, 0)   # the groups still due are unfinished samples: one more round for them
        if not self.inflight and self.sampling.enable and self.plan.pending == 0:
            # "wait" holds a batch whose last group would be too stale at its step, counting G groups a
            # step; dynamic sampling filtered this step short, so it needs one now (a group left for a
            # step too late for it is dropped as stale, as in "drop")
            self.issue()
        if not self.inflight:
            raise RuntimeError(f"async rollout: nothing generating for step {step} "
                               f"(schedule {self.plan.state_dict()}): a bug in the schedule")
        batch = self.arrived(self.inflight.popleft())
        gens.append(batch)
        if self.partial:   # a round: the groups that finished in it, however many
            batch.meta["admitted"] = self.admitted.popleft()
            self.pool_rows, self.pool_oldest = int(batch.meta["pool_rows"]), batch.meta["pool_oldest"]
            batch = self.informative(batch, keep) if self.sampling.enable and len(batch) else batch
            if batch is not None and len(batch):   # oldest first: a long sample that finished late trains
                self.ready = [oldest_first(self.ready + [batch], self.n, self.setup.pad_token_id)]
            if self.sampling.enable:
                self.fill()   # the filtered groups refilled
            return
        if not self.sampling.enable:
            self.ready.append(batch)
            return
        batch = self.informative(batch, keep)
        if batch is not None:
            self.ready.append(batch)
        self.fill()

    def arrived(self, call) -> Batch:
        """A generation call's batch (waiting for it); a partial round's (rows, meta) parts from
        the rollout ranks merged into one."""
        batch = call if isinstance(call, Batch) else call.result()
        return merge_rounds(batch, self.setup.pad_token_id) if isinstance(batch, list) else batch

    def informative(self, batch: Batch, keep: int) -> Batch | None:
        """Dynamic sampling: `batch` scored and its uninformative groups filtered out (counted in
        plan.filtered), but the first uninformative ones kept while fewer than `keep` groups are;
        None when no group is left."""
        start = time.perf_counter()
        new = self.score_batch(batch)
        self.scored_count += 1   # reward metrics averaged over the arrivals scored this step
        reward_s = self.scored.get("timing/reward_s", 0.0) + time.perf_counter() - start
        self.scored = rollout.merge_round(self.scored, new, self.scored_count)
        self.scored["timing/reward_s"] = reward_s
        informative = rollout.sampling_filter(batch, self.sampling).keep.reshape(-1, self.n)[:, 0]
        extra = np.flatnonzero(~informative)[:max(0, keep - int(informative.sum()))]
        informative[extra] = True   # the last allowed generation: topped up to what the step needs
        self.plan.filtered += int((~informative).sum())
        return batch.select(np.flatnonzero(np.repeat(informative, self.n))) if informative.any() else None

    def even_rows(self, batch: Batch) -> Batch:
        """A short (dynamic-sampling) batch trimmed to whole groups every actor rank can split
        evenly; the groups trimmed go back to the buffer's head for the next step."""
        world, n = self.setup.actor.world_size, self.n
        groups = len(batch) // n
        keep = groups
        while keep > 1 and (keep * n) % world:
            keep -= 1
        if keep == groups:
            return batch
        self.ready.insert(0, batch.slice(keep * n, len(batch)))
        self.plan.taken -= groups - keep
        return batch.slice(0, keep * n)

    def in_flight_rows(self) -> int:
        """Rows generating or buffered (the property test's in-flight count, from the data itself)."""
        if self.partial:   # buffered + unfinished on the rank + admitted by rounds not arrived yet
            return sum(len(b) for b in self.ready) + self.pool_rows + sum(self.admitted)
        return sum(len(b) for b in self.ready) + len(self.inflight) * self.plan.group_size * self.n

    def close(self) -> None:
        """Generations still running end with the rollout group; a multi-turn queue stops its thread."""
        if self.multi_turn:
            self.group.close()

    def save(self, folder: Path) -> None:
        """Every batch generating or buffered (waiting for them), the counts, and the rollout
        group's weights when they are older than the actor's (between two pushes)."""
        self.inflight = deque(self.arrived(c) for c in self.inflight)
        self.group.forget_cache()   # what generates next starts cold, as after a resume
        between = self.plan.pushed < self.setup.session.state.step
        state = {"schedule": self.plan.state_dict(), "ready": [(b.tensors, b.meta) for b in self.ready],
                 "inflight": [(b.tensors, b.meta) for b in self.inflight],
                 "rollout_weights": self.group.export_weights() if between else None,
                 "partial": None if not self.partial else {
                     "pool": self.group.export_pool(), "rounds": self.rounds, "pool_rows": self.pool_rows,
                     "pool_oldest": self.pool_oldest,
                     "admitted": list(self.admitted)}}
        with open(folder / STATE_FILE, "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, folder: Path) -> None:
        """Take back what `save` wrote; `start` continues from it."""
        path = folder / STATE_FILE
        if not path.is_file():
            return
        with open(path, "rb") as f:
            saved = pickle.load(f)
        if not isinstance(saved, dict) or not {"schedule", "ready", "inflight", "rollout_weights"} <= set(saved):
            from rlctl.errors import CheckpointError

            raise CheckpointError(f"{path} does not hold an async rollout state",
                                  hint="resume from another checkpoint step")
        self.restored = saved


def partial_ratio(batch: Batch) -> float:
    """Share of rows whose response tokens come from more than one weight version (token_version
    [B, T], -1 on padding; 0 without partial rollouts)."""
    if "token_version" not in batch:
        return 0.0
    versions = batch["token_version"]
    newest = versions.max(axis=1)
    oldest = np.where(versions >= 0, versions, newest[:, None]).min(axis=1)
    return float((newest > oldest).mean())


def oldest_first(batches: list[Batch], n: int, pad_token_id: int) -> Batch:
    """The buffered groups as one batch, ordered by their oldest token's version (stable: in
    arrival order among equals)."""
    batch = batches[0] if len(batches) == 1 else Batch.concat(rollout.align_prompt_width(batches, pad_token_id))
    order = np.argsort(batch["policy_version"].reshape(-1, n).min(axis=1), kind="stable")
    return batch.select((order[:, None] * n + np.arange(n)).reshape(-1))


def merge_rounds(parts: list[tuple[Batch, dict]], pad_token_id: int) -> Batch:
    """One round over several rollout ranks (RolloutWorker.generate_round, Dispatch.DP: the new
    prompts split over the ranks, each rank with a pool of its own) as one arrival: the finished
    groups in rank order, meta summed over the ranks (pool_rows, idle/busy seconds, the engine
    drift's sums), pool_oldest and engine_diff_max their min / max."""
    full = [rows for rows, _ in parts if len(rows)]
    batch = full[0] if len(full) == 1 else Batch.concat(rollout.align_prompt_width(full, pad_token_id)) if full else Batch()
    metas = [meta for _, meta in parts]
    meta = {key: sum(m.get(key, 0) for m in metas)
            for key in ("pool_rows", "rollout_idle_s", "rollout_busy_s", "engine_diff_sum", "engine_diff_tokens")}
    oldest = [m["pool_oldest"] for m in metas if m["pool_oldest"] is not None]
    meta["pool_oldest"] = min(oldest) if oldest else None
    meta["engine_diff_max"] = max(m.get("engine_diff_max", 0.0) for m in metas)
    batch.meta = {**batch.meta, **meta}
    return batch
