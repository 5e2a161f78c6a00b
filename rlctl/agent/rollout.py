"""Agent programs as the rollout: `AgentPrograms`, the "agent" kind of the rollout table (rlctl.rollouts),
plays rollout.n episodes per prompt through the agent endpoint and returns their sequences as training rows.

Rows: one per sequence of an episode (rlctl.agent.episodes: one when every call continued the last,
more when the agent rewrote its history), each with its episode's reward and the `uid` of the prompt
it came from; agent_episode tells the rows of one episode, so a group estimator counts each of the
rollout.n episodes once (rlctl.algorithms.episodes). An episode that made no call gets one row of
its prompt with an empty (masked) response, so its reward still counts in its group. Columns besides
the single-turn ones: agent_reward [R] (NaN: none), agent_answer [R] (the episode's last completion
text, what reward.function reads), agent_episode [R] (-1 on padding rows), agent_failure [R] (why it
failed: rlctl.agent.failures), agent_info [R] (what the agent returned beside its reward), agent_calls [R]. When rows outnumber rollout.n x prompts, copies of real rows with
response_mask 0 and a uid of their own pad the batch to whole mini-batches on every rank; they add
nothing to a loss and are no sample of any group or mean.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from rlctl.agent.engine import AgentEngine, EngineLimits
from rlctl.agent.episodes import Episode, Sequence, layout
from rlctl.agent.failures import FailureWatch, failure_text
from rlctl.agent.endpoint import AgentServer
from rlctl.agent.runner import AgentRunner
from rlctl.runtime.batch import Batch, object_array

if TYPE_CHECKING:
    from rlctl.rollouts.base import RolloutContext
    from rlctl.runtime.policy import TurnGenerator

CARRIED = ("uid", "data_source", "ground_truth", "extra_info", "messages")


class AgentPrograms:
    """rlctl.rollouts.base.Rollout: the agent endpoint over `group`'s generate_turn, the agents playing
    against it. With an engine that reports its own log-probs (vLLM) the rows carry them."""

    def __init__(self, group: TurnGenerator, ctx: RolloutContext):
        config = ctx.config
        self.group, self.config = group, config
        self.engine_log_probs, self.minibatches, self.pad = ctx.engine_log_probs, ctx.minibatches, ctx.pad_id
        ac, data = config.rollout.agent, config.data
        self.engine = AgentEngine(group, ctx.tokenizer, eos_ids=ctx.eos_ids, pad_id=self.pad, limits=EngineLimits(
            data.max_prompt_length, data.max_response_length, ac.max_calls, ac.max_wait_s))
        self.server = AgentServer(self.engine)
        self.runner = AgentRunner(ac, ctx.base, self.server, self.engine)
        self.failures: FailureWatch | None = None   # the console's failed-episode lines, once a batch is trained

    def close(self) -> None:
        self.server.close()

    def score(self, batch: Batch, reward, tokenizer, components: tuple = ()) -> dict:
        return score_episodes(batch, reward)

    def sample_rows(self, batch: Batch) -> np.ndarray:
        return first_rows(batch)

    @staticmethod
    def record_fields(batch: Batch, r: int) -> dict:
        return episode_record(batch, r)

    def watch(self, step: int, batch: Batch, say) -> None:
        """Each training step's failed episodes with each reason's count; every episode failing in several
        steps in a row stops the run (rlctl.agent.failures.FailureWatch)."""
        self.failures = self.failures or FailureWatch(say)
        self.failures.step(step, batch["agent_failure"][first_rows(batch)])

    @property
    def prompt_tools(self) -> list[dict]:
        return []   # an agent offers its own tools in its requests

    def eval_samples(self, batch: Batch, tokenizer) -> list[tuple[dict, dict]]:
        """Each episode's (reward item: its last answer; record fields: why it failed, its calls, its metrics)."""
        return [({"data_source": batch["data_source"][r], "solution_str": str(batch["agent_answer"][r]),
                  "ground_truth": batch["ground_truth"][r], "extra_info": batch["extra_info"][r], "prompt_str": "",
                  "messages": batch["messages"][r]},
                 {"failure": str(batch["agent_failure"][r]), "calls": int(batch["agent_calls"][r]),
                  "metrics": {**batch["agent_info"][r], "failed": float(bool(batch["agent_failure"][r])),
                              "calls": float(batch["agent_calls"][r])}})
                for r in first_rows(batch)]

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        rc = self.config.rollout
        n = {"train": rc.n, "val": rc.val_n, "greedy": 1}[mode]
        rows = agent_rows(batch)
        episodes = [Episode(index=i * n + s, row=copy.deepcopy(rows[i])) for i in range(len(rows)) for s in range(n)]
        self.engine.begin(seed=seed, mode=mode)
        self.engine.error = None
        self.runner.run(episodes)
        if self.engine.error is not None:   # a rank failed mid-rollout: the step fails as any rollout's would
            raise self.engine.error
        out = episode_batch(batch, episodes, n, width=self.config.data.max_prompt_length,
                            response_width=self.config.data.max_response_length, pad=self.pad,
                            log_probs=self.engine_log_probs)
        if mode == "train" and not self.config.algorithm.dynamic_sampling.enable:   # else join_groups pads
            out = self.whole(out)
        out.meta["agent_reward_mode"] = rc.agent.reward
        out.meta["agent_metrics"] = agent_metrics(episodes)
        return out


    def whole(self, batch: Batch) -> Batch:
        """The batch padded to whole mini-batches on every rank (pad_rows), which sets their count."""
        out = pad_rows(batch, self.group.world_size * self.minibatches)
        out.meta["mini_batches"] = self.minibatches
        return out

    def join_groups(self, rounds: list[Batch], groups: int, world_size: int) -> Batch:
        """Dynamic sampling's kept rounds as one training batch: the first `groups` groups (first_groups),
        padded to whole mini-batches."""
        return self.whole(first_groups(rounds, groups))


def first_groups(rounds: list[Batch], groups: int) -> Batch:
    """The rows of the first `groups` groups of `rounds` (each group its episodes, whatever number of rows
    they became), episode ids renumbered so that no two rounds share one."""
    parts, offset = [], 0
    for batch in rounds:
        part = Batch(dict(batch.tensors), batch.meta)
        part["agent_episode"] = batch["agent_episode"] + offset
        offset += int(batch["agent_episode"].max(initial=-1)) + 1
        parts.append(part)
    joined = Batch.concat(parts)
    wanted = list(dict.fromkeys(joined["uid"].tolist()))[:groups]
    return joined.select(np.flatnonzero(np.isin(joined["uid"], wanted)))


def agent_rows(batch: Batch) -> list[dict]:
    """Each prompt's parquet row as the agent gets it: data_source, prompt (the chat messages),
    reward_model {style, ground_truth}, extra_info."""
    return [{"data_source": ds, "prompt": [dict(m) for m in msgs], "reward_model": {"style": "rule", "ground_truth": gt},
             "extra_info": dict(ei or {})}
            for ds, msgs, gt, ei in zip(batch["data_source"], batch["messages"], batch["ground_truth"],
                                        batch["extra_info"])]


def episode_batch(prompts: Batch, episodes: list[Episode], n: int, *, width: int, response_width: int, pad: int,
                  log_probs: bool) -> Batch:
    """The episodes' sequences as rows (prompt part left-padded to `width`, responses right-padded to
    `response_width`), each carrying its prompt's columns and its episode's reward."""
    placed = []   # (episode, sequence)
    for ep in episodes:
        prompt_row = ep.index // n
        seqs = ep.sequences or [Sequence(prompt_ids=_prompt_ids(prompts, prompt_row), response_ids=[pad],
                                         response_mask=[0], log_probs=[0.0])]
        placed += [(ep, s) for s in seqs]
    rows = len(placed)
    out = {"prompts": np.full((rows, width), pad, np.int64), "responses": np.full((rows, response_width), pad, np.int64),
           "response_mask": np.zeros((rows, response_width), np.float32),
           "prompt_mask": np.zeros((rows, width), np.int64), "response_length": np.zeros(rows, np.int64),
           "rollout_log_prob": np.zeros((rows, response_width), np.float32)}
    for r, (ep, seq) in enumerate(placed):
        head, tail, mask, lps = layout(seq, width)
        out["prompts"][r, width - len(head):], out["prompt_mask"][r, width - len(head):] = head, 1
        out["responses"][r, :len(tail)], out["response_mask"][r, :len(tail)] = tail, mask
        out["rollout_log_prob"][r, :len(tail)], out["response_length"][r] = lps, len(tail)
    attention = np.arange(response_width)[None, :] < out["response_length"][:, None]
    source = [ep.index // n for ep, _ in placed]
    columns = {k: prompts[k][source] for k in CARRIED if k in prompts}
    columns.update({
        "prompts": out["prompts"], "responses": out["responses"], "response_mask": out["response_mask"],
        "response_length": out["response_length"],
        "truncated": np.array([bool(ep.calls) and ep.calls[-1].finish == "length" for ep, _ in placed]),
        "input_ids": np.concatenate([out["prompts"], out["responses"]], axis=1),
        "attention_mask": np.concatenate([out["prompt_mask"], attention.astype(np.int64)], axis=1),
        "agent_reward": np.array([np.nan if ep.reward is None or ep.failure else ep.reward for ep, _ in placed],
                                 np.float32),
        "agent_answer": object_array([ep.answer for ep, _ in placed]),
        "agent_episode": np.array([ep.index for ep, _ in placed], np.int64),
        "agent_failure": object_array([failure_text(ep.failure, ep.refused) for ep, _ in placed]),
        "agent_info": object_array([dict(ep.metrics) for ep, _ in placed]),
        "agent_calls": np.array([len(ep.calls) for ep, _ in placed], np.int64),
    })
    if log_probs:
        columns["rollout_log_prob"] = out["rollout_log_prob"]
    return Batch(columns, prompts.meta)


def _prompt_ids(prompts: Batch, row: int) -> list[int]:
    return prompts["input_ids"][row][prompts["attention_mask"][row] != 0].tolist()


def pad_rows(batch: Batch, multiple: int) -> Batch:
    """Up to a multiple of `multiple` rows with copies of the first rows, response_mask 0, uids of their own."""
    extra = -len(batch) % multiple
    if not extra:
        return batch
    fill = batch.select([i % len(batch) for i in range(extra)])
    fill["response_mask"] = np.zeros_like(fill["response_mask"])
    fill["uid"] = object_array([f"agent-pad-{i}" for i in range(extra)])
    fill["agent_episode"] = np.full(extra, -1, np.int64)
    return Batch.concat([batch, fill])


def agent_metrics(episodes: list[Episode]) -> dict:
    """agent/calls (mean per episode), agent/failed (share of episodes), agent/merged (share of the calls
    after an episode's first that continued its previous call), agent/sequences (rows per episode),
    and the mean of every numeric key the agents returned beside their reward."""
    later = [c for ep in episodes for c in ep.calls[1:]]
    out = {"agent/calls": float(np.mean([len(ep.calls) for ep in episodes])),
           "agent/failed": float(np.mean([bool(ep.failure) for ep in episodes])),
           "agent/merged": float(np.mean([c.merged for c in later])) if later else 1.0,
           "agent/sequences": float(np.mean([max(1, len(ep.sequences)) for ep in episodes]))}
    keys = sorted({k for ep in episodes for k in ep.metrics})
    for key in keys:
        values = [ep.metrics[key] for ep in episodes if key in ep.metrics]
        out[f"agent/{key}"] = float(np.mean(values))
    return out


def score_episodes(batch: Batch, reward_runner) -> dict:
    """`scores` [R] from the episodes' rewards, by rollout.agent.reward: "agent" (the agent's own; a
    failed episode 0), "scorer" (reward.function or the row's built-in on the last answer, once per
    episode) or "sum". Also acc, response_text (the answer) and the agent/* metrics."""
    mode = batch.meta["agent_reward_mode"]
    agent = np.nan_to_num(batch["agent_reward"].astype(np.float64), nan=0.0)
    answers = [str(a) for a in batch["agent_answer"]]
    metrics = dict(batch.meta.get("agent_metrics", {}))
    acc = None
    if mode in ("scorer", "sum"):
        first, of_row = _episodes_of(batch)
        items = [{"data_source": batch["data_source"][r], "solution_str": answers[r],
                  "ground_truth": batch["ground_truth"][r], "extra_info": batch["extra_info"][r], "prompt_str": "",
                  "messages": batch["messages"][r]} for r in first]
        result = reward_runner.score(items)
        scored = np.where(batch["agent_failure"].astype(bool), 0.0, result.scores[of_row])
        scores = scored if mode == "scorer" else agent + scored
        acc = result.extras.get("acc")
        acc = acc[of_row] if acc is not None else None
        metrics.update(result.metrics)
    else:
        scores = agent
    batch["scores"] = scores.astype(np.float32)
    batch["acc"] = (np.nan_to_num(acc, nan=0.0) if acc is not None else (scores > 0)).astype(np.float32)
    batch["response_text"] = object_array(answers)
    return metrics


def episode_record(batch: Batch, r: int) -> dict:
    """A row's fields in the rollouts dump: the episode it belongs to, and why that failed."""
    out = {"agent_episode": int(batch["agent_episode"][r])}
    if batch["agent_failure"][r]:
        out["agent_failure"] = str(batch["agent_failure"][r])
    return out


def first_rows(batch: Batch) -> np.ndarray:
    """Each episode's first row, in row order (padding rows are no episode's)."""
    return _episodes_of(batch)[0]


def _episodes_of(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(each episode's first row [E], in row order; each row's episode among them [R]: a padding row,
    which no mean or group counts, takes the first episode's)."""
    ids = batch["agent_episode"]
    real = np.flatnonzero(ids >= 0)
    _, first, inverse = np.unique(ids[real], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    of_row = np.zeros(len(ids), dtype=np.int64)
    of_row[real] = rank[inverse]
    return real[first[order]], of_row
