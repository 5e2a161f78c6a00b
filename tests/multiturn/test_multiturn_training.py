"""Multi-turn RL end to end on real Ray actors: a tiny model that calls the calculator, trained with GRPO.

Checks what the trainer consumed, from run.log_rollouts: tools ran (their answers are in the
conversation), the response mask is 1 exactly on the model's turns, every sample decodes to its
messages, the reward saw verl's multi-turn extra_info; and a resumed run reproduces the
uninterrupted one (metrics and logged rollouts). The same holds on the separate rollout group of
one_step_off and async (K = 2; K = 1 equals one_step_off). A PPO run shows the critic on the same samples,
a PRIME run its implicit PRM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.parquet_rows import write_rows
from support.tool_model import REWARD
from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training
from rlctl.project import write_project

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


COMMON = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "rollout.n=2",
          "actor.mini_batch_size=4", "actor.micro_batch_size=4", "data.max_prompt_length=1024",
          "data.max_response_length=200", "data.val_files=[]", 'data.train_files=["data/train.parquet"]',
          "model.dtype=float32", "model.gradient_checkpointing=false", "reward.function=reward.py:compute_score",
          "reward.workers=1", "actor.lr=1e-4", "rollout.temperature=0.3", "run.log_rollouts=true",
          "rollout.multi_turn.enable=true", 'rollout.multi_turn.tools=["calculator"]', "rollout.multi_turn.max_turns=3"]


def project(folder: Path, model: Path, recipe: str) -> Path:
    write_project(folder, recipe, str(model))
    (folder / "reward.py").write_text(REWARD)
    write_rows(folder / "data" / "train.parquet", [
        {"data_source": "calc", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
         "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": i}} for i in range(8)])
    return folder


def records(run: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def metric_rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing/", "perf/", "async/idle_"))}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def calculator_renderer(model_dir: Path):
    """(the chat renderer with the calculator's schema, the EOS ids) for check_record."""
    from transformers import AutoTokenizer
    from transformers.utils import get_json_schema

    from rlctl.multiturn.builtin_tools import calculator
    from rlctl.multiturn.conversation import ChatRenderer

    tok = AutoTokenizer.from_pretrained(model_dir)
    eos_ids = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    return ChatRenderer(tok, [get_json_schema(calculator)]), eos_ids


def check_record(record: dict, renderer, eos_ids) -> None:
    from rlctl.multiturn.conversation import check_transcript

    ids, mask = record["response_ids"], record["response_mask"]
    assert check_transcript(renderer, record["prompt_ids"], ids, record["messages"], eos_ids) is None
    runs, start = [], 0   # maximal runs of equal mask values
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], renderer.decode(ids[start:i])))
            start = i
    model_runs = [text for m, text in runs if m == 1]
    assert len(model_runs) == record["num_turns"] and runs[0][0] == 1
    for m, text in runs:
        if m == 0:   # template glue and tool answers only, ending in the next generation prompt
            assert text.startswith("\n<|im_start|>") and text.endswith("<|im_start|>assistant\n"), text
        else:
            assert "<tool_response>" not in text and "<|im_start|>" not in text, text


@pytest.mark.slow
def checked_records(run: Path, model_dir: Path) -> dict[int, list[dict]]:
    """The logged rollouts of steps 1-4, every one passing check_record."""
    renderer, eos_ids = calculator_renderer(model_dir)
    logged = {step: records(run, step) for step in (1, 2, 3, 4)}
    for recs in logged.values():
        for rec in recs:
            check_record(rec, renderer, eos_ids)
    return logged


def calculator_answers(logged: dict[int, list[dict]]) -> int:
    """How many tool messages carry the calculator's answer "4" (2 + 2) across the logged steps."""
    return sum(m["role"] == "tool" and m["content"] == "4" for recs in logged.values() for rec in recs
               for m in rec["messages"])


def resume_repeats_steps_3_and_4(run: Path, full: list[dict], logged: dict[int, list[dict]]) -> None:
    """Resume the finished 4-step run from its step-2 checkpoint: metrics and rollouts repeat exactly."""
    resume_training(run, step=2, address=None)
    assert metric_rows(run) == full
    for step in (3, 4):
        assert records(run, step) == logged[step]


def test_grpo_with_the_calculator_tool_logs_exact_rollouts_and_resumes_exactly(tmp_path, tool_model_dir,
                                                                                ray_cluster):
    proj = project(tmp_path / "p", tool_model_dir, "grpo-gsm8k")
    start_training(load_config(proj / "rlctl.toml", COMMON + ["run.total_steps=4", "run.save_every=2",
                                                             "run.keep_last=0"]), address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    full = metric_rows(run)
    assert [r["step"] for r in full] == [1, 2, 3, 4]
    assert full[0]["multi_turn/tool_calls/mean"] > 0.5 and full[0]["reward/mean"] > 0
    logged = checked_records(run, tool_model_dir)
    assert all(len(recs) == 8 for recs in logged.values())
    assert all(rec["score"] in (0.0, 1.0) for recs in logged.values() for rec in recs)
    assert calculator_answers(logged) >= 8, "the calculator ran and its answers reached the conversations"

    resume_repeats_steps_3_and_4(run, full, logged)


@pytest.mark.slow
def test_one_step_off_runs_the_turn_loop_on_the_rollout_group_and_resumes_exactly(tmp_path, tool_model_dir,
                                                                                  ray_cluster):
    """rollout.mode = "one_step_off" with the calculator: the turn loop drives the separate rollout group
    (from a thread, while the actor trains), every batch after the first is one update stale, the
    rollouts keep their exact transcripts, and the batch in flight at a checkpoint makes resume exact."""
    proj = project(tmp_path / "p", tool_model_dir, "grpo-gsm8k")
    start_training(load_config(proj / "rlctl.toml", COMMON + [
        "resources.workers=1", "rollout.mode=one_step_off", "resources.rollout_workers=1", "run.total_steps=4",
        "run.save_every=2", "run.keep_last=0", "rollout.temperature=1.0"]), address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    full = metric_rows(run)
    assert [r["rollout/staleness"] for r in full] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/policy_version"] for r in full] == [0.0, 0.0, 1.0, 2.0]
    assert full[0]["rollout/logprob_diff_mean"] == pytest.approx(0.0, abs=1e-6)   # the rollout rank's v0 = the actor's
    assert full[0]["multi_turn/tool_calls/mean"] > 0.5 and full[0]["actor/grad_norm"] > 0
    assert (run / "checkpoints" / "step_2" / "pending_rollout.pkl").is_file()      # batch 3, its turns done with v1
    logged = checked_records(run, tool_model_dir)
    assert calculator_answers(logged) >= 8, "the calculator ran for the rollout group's conversations"

    resume_repeats_steps_3_and_4(run, full, logged)

    # rollout.mode = "async" with K = 1 issues batch k + 1 behind the push of update k - 1: one_step_off's run
    same = project(tmp_path / "async", tool_model_dir, "grpo-gsm8k")
    start_training(load_config(same / "rlctl.toml", COMMON + [
        "resources.workers=1", "rollout.mode=async", "rollout.max_staleness=1", "rollout.sync_every=1",
        "rollout.staleness_strategy=wait", "resources.rollout_workers=1", "run.total_steps=4", "run.save_every=0",
        "rollout.temperature=1.0"]),
        address=None, force=False)
    same_run = same / "runs" / "grpo-gsm8k"
    # data/epoch is the loader's position when the step is logged: async draws batch k + 2's prompts at
    # the push after update k, one_step_off at step k + 1 (both generate it after that push)
    assert [{k: v for k, v in r.items() if not k.startswith(("async/", "data/epoch"))} for r in metric_rows(same_run)] \
        == [{k: v for k, v in r.items() if k != "data/epoch"} for r in full]
    for step in (1, 2, 3, 4):
        assert records(same_run, step) == logged[step]


@pytest.mark.slow
def test_async_multi_turn_keeps_each_batch_on_one_push_and_resumes_exactly(tmp_path, tool_model_dir, ray_cluster):
    """rollout.mode = "async", K = 2: batches 1-3 run their conversations on v0 while the actor trains,
    a push queues behind them (rlctl.controller.async_turns), so every trained row is at most 2 updates
    stale, all its turns from one version; transcripts stay exact and resume reproduces the run."""
    proj = project(tmp_path / "p", tool_model_dir, "grpo-gsm8k")
    start_training(load_config(proj / "rlctl.toml", COMMON + [
        "resources.workers=1", "rollout.mode=async", "rollout.max_staleness=2", "rollout.sync_every=1",
        "rollout.staleness_strategy=wait", "actor.policy_loss=decoupled_ppo", "resources.rollout_workers=1",
        "run.total_steps=4", "run.save_every=2", "run.keep_last=0",
        "run.log_samples=8", "rollout.temperature=1.0"]), address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    full = metric_rows(run)
    assert [r["async/staleness_max"] for r in full] == [0.0, 1.0, 2.0, 2.0]
    assert [r["rollout/policy_version"] for r in full] == [0.0, 0.0, 0.0, 1.0]
    assert all(r["async/dropped"] == 0 for r in full) and full[0]["actor/grad_norm"] > 0   # the weights move
    raw = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["async/idle_rollout"] < 1 for r in raw) and any(r["async/idle_rollout"] > 0 for r in raw)
    assert full[0]["multi_turn/tool_calls/mean"] > 0.5
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 8 and all(0 <= (s["step"] - 1) - s["policy_version"] <= 2 for s in samples)
    logged = checked_records(run, tool_model_dir)
    assert calculator_answers(logged) >= 8, "the calculator ran for the rollout group's conversations"

    resume_repeats_steps_3_and_4(run, full, logged)


@pytest.mark.slow
def test_ppo_critic_trains_on_multi_turn_samples(tmp_path, tool_model_dir, ray_cluster):
    proj = project(tmp_path / "p", tool_model_dir, "ppo-gsm8k")
    start_training(load_config(proj / "rlctl.toml", COMMON + [
        "rollout.n=1", "data.batch_size=8", "actor.mini_batch_size=8", "critic.mini_batch_size=8",
        "critic.micro_batch_size=4", "run.total_steps=2"]), address=None, force=False)
    rows = metric_rows(proj / "runs" / "ppo-gsm8k")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["multi_turn/tool_calls/mean"] > 0
        assert all(row[k] == row[k] for k in ("critic/vf_loss", "actor/pg_loss"))   # finite, not NaN


@pytest.mark.slow
def test_prime_trains_on_multi_turn_samples(tmp_path, tool_model_dir, ray_cluster):
    """PRIME through the calculator (rlctl.rollouts.table declares the pair built): its implicit PRM reads
    the model's turns only (the response mask; tests/algorithms/test_prime.py shows a tool's answer
    counts nowhere), starts equal to its reference (step 1's BCE is ln 2) and learns."""
    import math

    proj = project(tmp_path / "p", tool_model_dir, "grpo-gsm8k")
    start_training(load_config(proj / "rlctl.toml", COMMON + [
        "run.total_steps=2", "run.log_rollouts=false", "algorithm.name=prime", "algorithm.params.prm_lr=0.01"]),
        address=None, force=False)
    rows = metric_rows(proj / "runs" / "grpo-gsm8k")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["prm/loss"] == pytest.approx(math.log(2.0), abs=1e-5) and rows[1]["prm/loss"] != rows[0]["prm/loss"]
    assert all(r["multi_turn/tool_calls/mean"] > 0 and math.isfinite(r["actor/pg_loss"])
               and r["prm/process_reward_mean"] != 0 for r in rows)


@pytest.mark.slow
def test_async_partial_multi_turn_lets_a_push_land_between_turns_and_resumes_exactly(tmp_path, tool_model_dir,
                                                                                     ray_cluster):
    """rollout.partial_rollout with multi-turn, K = 2: a round is one turn of every live conversation
    (rlctl.controller.async_turns.TurnPool), so pushes land between turns and conversations carry
    tokens of two versions; the oldest token stays within the bound, each turn's log-probs are its
    sampler's (step 1 matches the trainer), transcripts stay exact, and a checkpoint taken with
    conversations in flight resumes the run exactly."""
    import pickle

    proj = project(tmp_path / "p", tool_model_dir, "grpo-gsm8k")
    start_training(load_config(proj / "rlctl.toml", COMMON + [
        "resources.workers=1", "rollout.mode=async", "rollout.max_staleness=2", "rollout.sync_every=1",
        "rollout.staleness_strategy=wait", "rollout.partial_rollout=true", "actor.policy_loss=decoupled_ppo",
        "resources.rollout_workers=1", "run.total_steps=4", "run.save_every=2", "run.keep_last=0",
        "run.log_samples=8", "rollout.temperature=1.0", "rollout.multi_turn.max_turns=2"]), address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    full = metric_rows(run)
    assert [r["step"] for r in full] == [1, 2, 3, 4]
    assert full[0]["rollout/logprob_diff_mean"] == pytest.approx(0.0, abs=1e-5)   # per-turn tags = v0's log-probs
    assert max(r["async/partial_ratio"] for r in full) > 0, "some conversation's turns straddle a push"
    assert all(r["async/staleness_max"] <= 2 for r in full) and full[0]["multi_turn/tool_calls/mean"] > 0.5
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 8 and all(0 <= (s["step"] - 1) - s["policy_version"] <= 2 for s in samples)
    logged = checked_records(run, tool_model_dir)
    with open(run / "checkpoints" / "step_2" / "async_rollout.pkl", "rb") as f:
        pool = pickle.loads(pickle.load(f)["partial"]["pool"])
    assert pool["entries"], "conversations were in flight at the checkpoint"
    assert any(-1 in e["versions"] for e in pool["entries"]), "a conversation mid-way, tool tokens untagged"

    resume_repeats_steps_3_and_4(run, full, logged)
