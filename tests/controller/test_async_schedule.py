"""The async source's schedule under random generation delays (no Ray: an in-process rollout
group double whose one thread runs the calls in submission order, as a Ray actor rank does, each
after a random delay, a few ten times longer than the rest; a generation is tagged with the
version the double actually holds when it runs, not the one the schedule expects).

Properties, for random K, strategy, sync_every, batch size and delays, with and without dynamic
sampling: every trained group's staleness is at most K; prompts drawn = trained + dropped +
filtered + in flight after every step; no prompt is trained twice; only informative groups train
under dynamic sampling; "wait" without it drops nothing; what is trained does not depend on the
delays."""

from __future__ import annotations

import dataclasses
import pickle
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from rlctl.config.schema import Config
from rlctl.controller.async_rollout import AsyncRollout, partial_ratio
from rlctl.controller.async_schedule import AsyncSchedule
from rlctl.controller.prompts import PromptLoader, PromptRow, PromptSet
from rlctl.runtime.batch import Batch
from rlctl.runtime.dispatch import Dispatch, split_arguments
from rlctl.workers.rollout.partial import PartialPool

N = 2       # samples per prompt
CHUNK = 3   # partial rollouts: tokens a sample decodes per round


class InOrderGroup:
    """A rollout group double: calls run one at a time in submission order after a random delay."""

    def __init__(self, seed: int, ranks: int = 1):
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.pool = ThreadPoolExecutor(1)
        self.version = 0
        self.world_size = ranks
        self.partial = [None] * ranks   # partial rollouts: each rank's PartialPool

    def _delay(self) -> float:
        with self.lock:
            long_tail = self.rng.random() < 0.1
            return self.rng.uniform(0, 0.002) * (10 if long_tail else 1)

    def submit(self, method: str, *args, **kwargs):
        delay = self._delay()
        future = self.pool.submit(getattr(self, "_" + method), delay, *args, **kwargs)
        return SimpleNamespace(result=future.result)

    def export_weights(self) -> dict:
        return {"w": np.zeros(1, dtype=np.float32)}

    def forget_cache(self) -> None:
        """No engine cache in the double."""

    def _update_weights(self, delay: float, weights: dict, *, version: int) -> int:
        time.sleep(delay)
        self.version = version
        return version

    def _generate_round(self, delay: float, prompts: Batch | None, *, seed: int) -> list[tuple[Batch, dict]]:
        """A partial-rollout round on real PartialPools, one a rank, the prompts split over the ranks
        by the real Dispatch.DP split: up to CHUNK tokens a sample, EOS (0) with probability 1/3 a
        token, one sample in five a long one (EOS 1/30)."""
        time.sleep(delay)
        split = split_arguments(Dispatch.DP, self.world_size, (prompts,), {}, "generate_round")
        return [self._rank_round(rank, args[0], seed, delay) for rank, (args, _) in enumerate(split)]

    def _rank_round(self, rank: int, prompts: Batch | None, seed: int, delay: float) -> tuple[Batch, dict]:
        if self.partial[rank] is None:
            self.partial[rank] = PartialPool(n=N, chunk=CHUNK, width=4, length=12, pad=0, eos_ids=[0])
        pool = self.partial[rank]
        if prompts is not None:
            pool.admit(prompts)
        contexts, budgets = pool.inputs()
        rng = np.random.default_rng([seed, rank])
        tokens = np.ones((len(contexts), CHUNK), dtype=np.int64)
        lengths = np.array(budgets, dtype=np.int64)
        for r, (context, budget) in enumerate(zip(contexts, budgets)):
            stop = 1 / 30 if context[0] % 5 == 0 else 1 / 3   # a long sample: decided by its prompt
            eos = np.flatnonzero(rng.random(budget) < stop)
            if eos.size:
                lengths[r] = eos[0] + 1
                tokens[r, eos[0]] = 0
        pool.advance(tokens, lengths, np.zeros(tokens.shape, dtype=np.float32), self.version)
        rows = pool.pop_finished()
        if len(rows):
            rows["seed"] = np.full(len(rows), seed)
        return rows, {"rollout_idle_s": 0.0, "rollout_busy_s": delay, **pool.meta()}

    def export_pool(self) -> list[dict | None]:
        return [None if p is None else pickle.loads(pickle.dumps(p.state_dict())) for p in self.partial]

    def _load_pool(self, delay: float, states: list[dict | None]) -> None:
        for rank, state in enumerate(states):
            if state is not None:
                self.partial[rank] = PartialPool(n=N, chunk=CHUNK, width=4, length=12, pad=0, eos_ids=[0])
                self.partial[rank].load_state_dict(state)

    def _generate(self, delay: float, prompts: Batch, *, seed: int) -> Batch:
        time.sleep(delay)
        rows = prompts.repeat(N)
        width = prompts["input_ids"].shape[1]
        return Batch({"uid": rows["uid"], "prompts": rows["input_ids"], "input_ids": rows["input_ids"],
                      "attention_mask": rows["attention_mask"], "seed": np.full(len(rows), seed),
                      "policy_version": np.full(len(rows), self.version, dtype=np.int64)},
                     {"rollout_idle_s": 0.0, "rollout_busy_s": delay, "width": width})


def source(k: int, strategy: str, sync_every: int, group_size: int, steps: int, delay_seed: int,
           sampling: bool = False, partial: bool = False, ranks: int = 1):
    config = Config()
    ds = dataclasses.replace(config.algorithm.dynamic_sampling, enable=sampling, metric="acc", max_gen_batches=3)
    config = dataclasses.replace(config, rollout=dataclasses.replace(
        config.rollout, mode="async", n=N, max_staleness=k, staleness_strategy=strategy, sync_every=sync_every,
        partial_rollout=partial, partial_chunk=CHUNK),
        data=dataclasses.replace(config.data, batch_size=group_size),
        algorithm=dataclasses.replace(config.algorithm, dynamic_sampling=ds))
    rows = [PromptRow(prompt_ids=[i % 7 + 1] * (1 + i % 3), data_source="t", ground_truth="", extra_info={},
                      messages=[]) for i in range(50)]
    loader = PromptLoader(PromptSet(rows=rows), group_size, seed=0)
    drawn = [0]
    take = loader.next_batch

    def counted():
        drawn[0] += group_size
        return take()

    loader.next_batch = counted
    setup = SimpleNamespace(config=config, total_steps=steps, loader=loader, pad_token_id=0,
                            seed_for=lambda index, round_: index * 1000 + round_,
                            actor=SimpleNamespace(export_weights=lambda: {"w": np.zeros(1, dtype=np.float32)},
                                                  world_size=2),
                            session=SimpleNamespace(state=SimpleNamespace(step=0)))
    src = AsyncRollout(setup, SimpleNamespace(rollout=InOrderGroup(delay_seed, ranks)))
    src.score_batch = informative_half   # dynamic sampling's scores: no reward, no tokenizer
    return src, drawn


def informative_half(batch: Batch) -> dict:
    """Scores as a reward would: a group is informative (its acc varies) when its seed says so
    (a partial round that finished no group has nothing to score)."""
    if not len(batch):
        return {}
    rng = np.random.default_rng(int(batch["seed"][0]))
    varies = np.repeat(rng.random(len(batch) // N) < 0.5, N)
    batch["acc"] = np.where(varies, np.tile([0.0, 1.0], len(batch) // N), 1.0)
    return {"reward/mean": float(batch["acc"].mean())}


def run(k, strategy, sync_every, group_size, steps, delay_seed, sampling=False, partial=False, ranks=1):
    src, drawn = source(k, strategy, sync_every, group_size, steps, delay_seed, sampling, partial, ranks)
    src.start(1)
    trained, total_dropped, versions = [], 0, []
    for step in range(1, steps + 1):
        batch, dropped, gens = src.take(step)
        total_dropped += dropped
        if sampling:   # only informative groups (unless 3 generations found none: then the third, as sync);
            informative = all(len(set(g)) == 2 for g in batch["acc"].reshape(-1, N).tolist())
            assert informative or src.generations(gens) >= 3   # fewer groups (an even number of rows) when short
            assert 0 < len(batch) <= group_size * N and len(batch) % 2 == 0
        else:
            assert len(batch) == group_size * N
        staleness = (step - 1) - batch["policy_version"]
        assert staleness.min() >= 0 and staleness.max() <= k, (step, batch["policy_version"])
        if partial:   # every trained token, not only each sample's oldest one
            tokens = batch["token_version"][batch["response_mask"] > 0]
            assert ((step - 1) - tokens).max() <= k and tokens.min() >= 0
            versions += [tuple(v[v >= 0].tolist()) for v in batch["token_version"]]
        trained += batch["uid"][::N].tolist()
        src.setup.session.state.step = step
        src.after_update(step)
        in_flight, filtered = src.in_flight_rows() // N, src.plan.filtered
        assert drawn[0] == len(trained) + total_dropped + filtered + in_flight, (step, drawn[0], len(trained))
    assert len(set(trained)) == len(trained)            # no prompt trained twice
    if strategy == "wait" and not sampling and not partial:
        assert total_dropped == 0   # (a sample continued over many rounds can outlive K under "wait" too)
    return (trained, total_dropped, versions) if partial else (trained, total_dropped)


@pytest.mark.parametrize("case", range(12))
def test_staleness_bound_and_prompt_accounting_under_random_delays(case):
    rng = random.Random(case)
    k = rng.randint(1, 4)
    strategy = rng.choice(["wait", "drop"])
    sync_every = rng.randint(1, k + 1)
    group_size = rng.choice([2, 3])
    sampling = case % 3 == 2   # dynamic sampling on: groups are also filtered, and refilled
    first = run(k, strategy, sync_every, group_size, steps=10, delay_seed=case, sampling=sampling)
    assert run(k, strategy, sync_every, group_size, steps=10, delay_seed=case + 100, sampling=sampling) == first


def test_drop_with_sparse_pushes_drops_and_refills():
    """K = 1, a push every 2 updates, "drop": the batches generated between pushes get too stale."""
    trained, dropped = run(1, "drop", 2, 2, steps=8, delay_seed=0)
    assert dropped > 0 and len(trained) == 16


def test_wait_with_dynamic_sampling_issues_when_filtering_starves_a_step():
    """K = 1, a push every 2 updates, "wait": step 2's batch was filtered short and "wait" holds the
    next batch (its last group would be too stale for step 3); the step gets it all the same."""
    for partial in (False, True):
        trained = run(1, "wait", 2, 2, steps=6, delay_seed=0, sampling=True, partial=partial)[0]
        assert len(trained) >= 6


def test_wait_issues_one_step_offs_order():
    """K = 1, sync_every = 1, "wait": batch k + 1 is issued right after update k - 1's push."""
    plan = AsyncSchedule(max_staleness=1, strategy="wait", sync_every=1, total_steps=5, group_size=4)
    issued = []
    for step in range(1, 6):
        while plan.may_issue():
            plan.issued += 4
            issued.append((step, plan.issued // 4, plan.pushed))
        plan.taken += 4
        if plan.push_due(step):
            plan.pushed = step
    assert issued == [(1, 1, 0), (1, 2, 0), (2, 3, 1), (3, 4, 2), (4, 5, 3)]


@pytest.mark.parametrize("strategy,sync_every,sampling,partial,ranks", [
    ("drop", 2, False, False, 1), ("wait", 2, True, False, 1), ("wait", 1, False, True, 1), ("drop", 2, False, True, 1),
    ("drop", 2, True, True, 1), ("wait", 1, False, True, 2), ("drop", 2, True, True, 2)])
def test_save_and_restore_mid_run_continues_as_the_uninterrupted_run(tmp_path, strategy, sync_every, sampling,
                                                                     partial, ranks):
    """What a checkpoint holds (buffered and generating batches, counts, the rollout group's copy
    between pushes, each rollout rank's unfinished samples) plus the loader's position give the
    same trained groups as never stopping."""
    def steps(src, first, last, out):
        for step in range(first, last + 1):
            batch, _, _ = src.take(step)
            out.append((step, batch["uid"].tolist(), batch["policy_version"].tolist(),
                        batch["token_version"].tolist() if partial else None))
            src.setup.session.state.step = step
            src.after_update(step)
        return out

    full, _ = source(2, strategy, sync_every, 2, 8, 0, sampling, partial, ranks)
    full.start(1)
    expected = steps(full, 1, 8, [])
    first, _ = source(2, strategy, sync_every, 2, 8, 1, sampling, partial, ranks)
    first.start(1)
    got = steps(first, 1, 3, [])
    first.save(tmp_path)
    if ranks > 1 and not sampling:   # this save catches both ranks with unfinished samples
        pools = pickle.loads((tmp_path / "async_rollout.pkl").read_bytes())["partial"]["pool"]
        assert len(pools) == ranks and all(p["samples"] for p in pools), pools
    loader_state = first.setup.loader.state_dict()
    again, _ = source(2, strategy, sync_every, 2, 8, 2, sampling, partial, ranks)
    again.setup.loader.load_state_dict(loader_state)
    again.setup.session.state.step = 3
    again.restore(tmp_path)
    again.start(4)
    assert steps(again, 4, 8, got) == expected


@pytest.mark.parametrize("case", range(8))
def test_partial_rollouts_keep_every_trained_token_within_the_bound(case):
    """Partial rollouts: samples continue over rounds and pushes; the bound holds per token, the
    accounting includes the unfinished samples on the rank(s), and the delays change nothing; with
    dynamic sampling (odd cases) only informative groups train and filtered ones are counted."""
    rng = random.Random(1000 + case)
    k = rng.randint(1, 4)
    strategy = rng.choice(["wait", "drop"])
    sync_every = rng.randint(1, k + 1)
    group_size = rng.choice([2, 3])
    sampling = case % 2 == 1   # dynamic sampling too: each round's finished groups filtered, and refilled
    ranks = 1 + case // 4      # cases 4-7: two rollout ranks, each with a pool of its own
    first = run(k, strategy, sync_every, group_size, steps=10, delay_seed=case, sampling=sampling, partial=True,
                ranks=ranks)
    assert run(k, strategy, sync_every, group_size, steps=10, delay_seed=case + 100, sampling=sampling,
               partial=True, ranks=ranks) == first


def test_partial_rollouts_train_samples_that_straddle_a_push():
    """K = 2, a push every update: samples cut by a push are trained, tokens of both versions."""
    trained, dropped, versions = run(2, "wait", 1, 2, steps=10, delay_seed=0, partial=True)
    spanning = [v for v in versions if len(set(v)) > 1]
    assert len(spanning) >= 3 and len(trained) == 20, versions
    assert all(list(v) == sorted(v) for v in versions)   # a sample's versions only grow along its tokens
    batch = Batch({"token_version": np.array([[0, 0, 1, -1], [1, 1, -1, -1]])})
    assert partial_ratio(batch) == 0.5 and partial_ratio(Batch({"x": np.zeros(2)})) == 0.0
