#!/usr/bin/env python3
"""Step time and trainer idle share under a long generation tail: sync, one_step_off, async.

  .venv/bin/python bench/async_bench.py [--steps 60] [--batch-size 16 --n 8] [--sample-ms 20]
        [--tail-prob 0.001 --tail-factor 10] [--train-ms 40] [--sample-tokens 20 --chunk-tokens 20]
        [--seed 0] [--json out.json]

A simulation, not a training run: generation and training are sleeps, so the figures are the
schedule's, free of this shared machine's noise. What is rlctl's real code: the async source
(rlctl.controller.async_rollout.AsyncRollout with rlctl.controller.async_schedule) decides when to
generate, push and drop, and buffers and takes the groups, against a rollout group stand-in
whose one thread runs the calls in submission order, as a Ray actor rank does.

The long tail: each of a batch's batch_size x n samples takes --sample-ms, except that with
probability --tail-prob it is --tail-factor times longer. A batch generates as long as its
longest sample (the hf engine decodes the batch until every sample has stopped), so a single
long sample holds the whole batch. Training a batch takes --train-ms.

  sync          generate, then train, every step (rollout.mode = "sync")
  one_step_off  async with max_staleness 1, sync_every 1, "wait" (proven equal to one_step_off
                bit for bit in tests/controller/test_async.py)
  async K=2/4   max_staleness 2 / 4, "wait"; async K=4 drop: the "drop" strategy
  ... partial   rollout.partial_rollout = true: generation in rounds of --chunk-tokens tokens on
                rlctl's real PartialPool (rlctl.workers.rollout.partial); a sample is
                --sample-tokens tokens long (a long one --tail-factor times that) and a round
                lasts as long as its longest decode, so a long sample no longer holds its batch

Per mode: median and mean step time (wall between two steps' ends), the trainer's idle share
(time waiting for a batch / total), the rollout group's idle share (time with no call to run),
mean staleness (of each row's oldest token), groups dropped, and the share of trained rows whose
tokens span more than one version (async/partial_ratio).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = {"sync": None,
         "one_step_off": dict(max_staleness=1, staleness_strategy="wait", sync_every=1),
         "async K=2": dict(max_staleness=2, staleness_strategy="wait", sync_every=1),
         "async K=4": dict(max_staleness=4, staleness_strategy="wait", sync_every=1),
         "async K=4 drop": dict(max_staleness=4, staleness_strategy="drop", sync_every=1),
         "async K=2 partial": dict(max_staleness=2, staleness_strategy="wait", sync_every=1, partial_rollout=True),
         "async K=4 partial": dict(max_staleness=4, staleness_strategy="wait", sync_every=1, partial_rollout=True),
         "async K=4 part. drop": dict(max_staleness=4, staleness_strategy="drop", sync_every=1, partial_rollout=True)}


class TimedGroup:
    """The rollout group stand-in: one thread, calls in submission order, generation sleeps."""

    def __init__(self, gen_time, n: int, a=None):
        self.gen_time, self.n, self.version, self.a, self.partial = gen_time, n, 0, a, None
        self.pool, self.lock = ThreadPoolExecutor(1), threading.Lock()
        self.last_end, self.busy = time.perf_counter(), 0.0

    def submit(self, method: str, *args, **kwargs):
        return SimpleNamespace(result=self.pool.submit(getattr(self, "_" + method), *args, **kwargs).result)

    def _update_weights(self, weights, *, version):
        self.version = version
        return version

    def _generate(self, prompts, *, seed):
        start = time.perf_counter()
        time.sleep(self.gen_time(seed))
        rows = prompts.repeat(self.n)
        idle, self.last_end = start - self.last_end, time.perf_counter()
        with self.lock:
            self.busy += self.last_end - start
        from rlctl.runtime.batch import Batch

        return Batch({"uid": rows["uid"], "prompts": rows["input_ids"], "input_ids": rows["input_ids"],
                      "attention_mask": rows["attention_mask"],
                      "policy_version": np.full(len(rows), self.version, dtype=np.int64)},
                     {"rollout_idle_s": idle, "rollout_busy_s": self.last_end - start})


    def _generate_round(self, prompts, *, seed):
        """A partial-rollout round on rlctl's real PartialPool: every unfinished sample decodes up
        to --chunk-tokens tokens; the round lasts as long as its longest decode. A sample's length
        (--sample-tokens, or --tail-factor times that with --tail-prob) is drawn when it starts and
        written as its first token, so later rounds know when it ends."""
        from rlctl.workers.rollout.partial import PartialPool

        a, start = self.a, time.perf_counter()
        if self.partial is None:
            self.partial = PartialPool(n=self.n, chunk=a.chunk_tokens, width=3, pad=0, eos_ids=[0],
                                       length=int(a.sample_tokens * a.tail_factor))
        if prompts is not None:
            self.partial.admit(prompts)
        contexts, budgets = self.partial.inputs()
        rng, steps = random.Random(seed), 0
        tokens = np.full((len(contexts), max(budgets, default=1)), 5, dtype=np.int64)
        lengths = np.zeros(len(contexts), dtype=np.int64)
        for r, (context, budget) in enumerate(zip(contexts, budgets)):
            done = len(context) - 3
            target = context[3] if done else int(a.sample_tokens * (a.tail_factor if rng.random() < a.tail_prob else 1))
            lengths[r] = min(budget, target - done)
            if not done:
                tokens[r, 0] = target
            if done + lengths[r] == target:
                tokens[r, lengths[r] - 1] = 0   # EOS
            steps = max(steps, int(lengths[r]))
        time.sleep(steps * a.sample_ms / 1000 / a.sample_tokens)
        self.partial.advance(tokens, lengths, np.zeros(tokens.shape, dtype=np.float32), self.version)
        rows = self.partial.pop_finished()
        idle, self.last_end = start - self.last_end, time.perf_counter()
        with self.lock:
            self.busy += self.last_end - start
        rows.meta.update(rollout_idle_s=idle, rollout_busy_s=self.last_end - start, **self.partial.meta())
        return rows


def batch_time(a):
    """Seconds a generation batch takes: its longest sample (a seeded draw per batch)."""
    def gen_time(seed: int) -> float:
        rng = random.Random(seed)
        samples = a.batch_size * a.n
        tail = any(rng.random() < a.tail_prob for _ in range(samples))
        return a.sample_ms / 1000 * (a.tail_factor if tail else 1)
    return gen_time


def run_async(a, settings: dict) -> dict:
    from rlctl.config.schema import Config
    from rlctl.controller.async_rollout import AsyncRollout, partial_ratio
    from rlctl.controller.prompts import PromptLoader, PromptRow, PromptSet

    config = Config()
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, mode="async", n=a.n,
                                                                      partial_chunk=a.chunk_tokens, **settings),
                                 data=dataclasses.replace(config.data, batch_size=a.batch_size,
                                                          max_response_length=int(a.sample_tokens * a.tail_factor)))
    rows = [PromptRow(prompt_ids=[1, 2, 3], data_source="t", ground_truth="", extra_info={}, messages=[])
            for _ in range(a.batch_size * 8)]
    setup = SimpleNamespace(config=config, total_steps=a.steps, pad_token_id=0,
                            loader=PromptLoader(PromptSet(rows=rows), a.batch_size, seed=a.seed),
                            seed_for=lambda index, round_: a.seed * 100003 + index,
                            actor=SimpleNamespace(export_weights=dict, world_size=1),
                            session=SimpleNamespace(state=SimpleNamespace(step=0)))
    group = TimedGroup(batch_time(a), a.n, a)
    source = AsyncRollout(setup, SimpleNamespace(rollout=group))
    begin = time.perf_counter()
    source.start(1)
    ends, waited, staleness, dropped, partial = [], 0.0, [], 0, []
    for step in range(1, a.steps + 1):
        start = time.perf_counter()
        batch, lost, _ = source.take(step)
        waited += time.perf_counter() - start
        dropped += lost
        staleness.append(float(((step - 1) - batch["policy_version"]).mean()))
        partial.append(partial_ratio(batch))
        time.sleep(a.train_ms / 1000)
        source.after_update(step)
        ends.append(time.perf_counter())
    total = ends[-1] - begin
    return summary(begin, ends, waited, total, 1 - group.busy / total, statistics.mean(staleness), dropped,
                   statistics.mean(partial))


def run_sync(a) -> dict:
    gen_time = batch_time(a)
    begin = time.perf_counter()
    ends, waited, busy = [], 0.0, 0.0
    for step in range(1, a.steps + 1):
        start = time.perf_counter()
        time.sleep(gen_time(a.seed * 100003 + step))
        waited += time.perf_counter() - start
        busy += time.perf_counter() - start
        time.sleep(a.train_ms / 1000)
        ends.append(time.perf_counter())
    total = ends[-1] - begin
    return summary(begin, ends, waited, total, 1 - busy / total, 0.0, 0)


def summary(begin, ends, waited, total, rollout_idle, staleness, dropped, partial=0.0) -> dict:
    steps = np.diff([begin] + ends)
    return {"step_s_median": float(np.median(steps)), "step_s_mean": float(steps.mean()),
            "trainer_idle": waited / total, "rollout_idle": rollout_idle, "staleness_mean": staleness,
            "dropped_groups": dropped, "partial_ratio": partial, "total_s": total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--sample-ms", type=float, default=20.0, help="a normal sample's (and batch's) generation time")
    p.add_argument("--tail-prob", type=float, default=0.001, help="chance that a sample is a long one")
    p.add_argument("--tail-factor", type=float, default=10.0, help="how much longer a long sample is")
    p.add_argument("--train-ms", type=float, default=40.0)
    p.add_argument("--sample-tokens", type=int, default=20, help="partial rollouts: a normal sample's tokens")
    p.add_argument("--chunk-tokens", type=int, default=20, help="partial rollouts: rollout.partial_chunk")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    tails = sum(batch_time(a)(a.seed * 100003 + i) > a.sample_ms / 1000 for i in range(1, a.steps + 1))
    print(f"{a.steps} steps, {a.batch_size} x {a.n} samples a batch, sample {a.sample_ms:g} ms, "
          f"{a.tail_prob:g} of samples {a.tail_factor:g}x longer ({tails} of the first {a.steps} batches hold one), "
          f"train {a.train_ms:g} ms a step")
    results = {name: run_sync(a) if settings is None else run_async(a, settings) for name, settings in MODES.items()}
    base = results["sync"]["step_s_mean"]
    print(f"{'mode':<20}{'step ms (median)':>17}{'step ms (mean)':>15}{'speed-up':>9}{'trainer idle':>13}"
          f"{'rollout idle':>13}{'staleness':>10}{'dropped':>8}{'partial':>8}")
    for name, r in results.items():
        print(f"{name:<20}{r['step_s_median'] * 1000:>17.1f}{r['step_s_mean'] * 1000:>15.1f}"
              f"{base / r['step_s_mean']:>8.2f}x{r['trainer_idle']:>12.0%}{r['rollout_idle']:>13.0%}"
              f"{r['staleness_mean']:>10.2f}{r['dropped_groups']:>8d}{r['partial_ratio']:>8.1%}")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
