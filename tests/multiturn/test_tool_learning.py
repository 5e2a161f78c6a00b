"""Proof that multi-turn GRPO learns to use the calculator: accuracy rises because tool use rises.

The start is a tiny model fitted (tests/multiturn/tool_model.py) to a calc-tools question answered
both ways: through a calculator call and the tool's number, and directly with a wrong
number (a near miss, as a model doing the sum in its head). So it calls the tool in about half its
conversations, and only those can be right. The RL stage is the shipped grpo-calc-tools-cpu recipe
(real Ray actors, the hf engine, the real calculator, the built-in calc-tools reward) with a smaller
batch: tool use and accuracy must both rise, and every rewarded answer must be the number a
calculator turn returned. Ignoring the reward or dropping the tool's answers fails it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.parquet_rows import write_rows
from tool_model import train_tool_caller
from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from rlctl.data.calc_tools import question, transcript
from rlctl.multiturn.builtin_tools import calculator
from rlctl.project import write_project
from rlctl.rewards.scorers.calc_tools import DATA_SOURCE

PROBLEMS = [(52717, "+", 38946)]
STEPS = 12


def near_miss(answer: str) -> str:
    """The answer with its second digit off by one: well-formed, close, wrong."""
    return answer[0] + str((int(answer[1]) + 1) % 10) + answer[2:]


@pytest.fixture(scope="module")
def half_tool_model(tiny_model_dir, tmp_path_factory) -> Path:
    conversations = []
    for a, op, b in PROBLEMS:
        answer = calculator(f"{a} {op} {b}")
        conversations.append(transcript(a, op, b, answer))
        conversations.append([{"role": "user", "content": question(a, op, b)},
                              {"role": "assistant", "content": near_miss(answer)}])
    return train_tool_caller(tiny_model_dir, tmp_path_factory.mktemp("half_tool") / "model", steps=250,
                             conversations=conversations)


@pytest.mark.slow
def test_grpo_raises_tool_use_and_accuracy_on_calc_tools(tmp_path, half_tool_model, ray_cluster):
    proj = tmp_path / "p"
    write_project(proj, "grpo-calc-tools-cpu", str(half_tool_model))
    rows = []
    for i, (a, op, b) in enumerate(PROBLEMS * 8):
        text = question(a, op, b)
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": text}],
                     "reward_model": {"style": "rule", "ground_truth": calculator(f"{a} {op} {b}")},
                     "extra_info": {"index": i, "question": text}})
    write_rows(proj / "data" / "calc-tools" / "train.parquet", rows)
    start_training(load_config(proj / "rlctl.toml", [
        f"run.total_steps={STEPS}", "run.save_every=0", "run.val_every=0", "data.val_files=[]",
        "data.batch_size=2", "rollout.n=8", "actor.mini_batch_size=2", "actor.micro_batch_size=8"]), address=None, force=False)
    run = proj / "runs" / "grpo-calc-tools-cpu"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    tool_use = [m["multi_turn/tool_use_frac"] for m in metrics]
    acc = [m["reward/acc"] for m in metrics]
    curves = f"tool use {[round(x, 2) for x in tool_use]}, accuracy {[round(x, 2) for x in acc]}"
    assert 0.15 < tool_use[0] < 0.85, f"the start samples both ways: {curves}"
    # step 1 samples the fitted model before any update; the last steps' mean against it
    assert sum(acc[-3:]) / 3 > max(acc[0] + 0.2, 0.8), f"accuracy rose: {curves}"
    assert sum(tool_use[-3:]) / 3 > tool_use[0] + 0.2, f"tool use rose: {curves}"
    for line in (run / "rollouts" / f"step_{STEPS}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["score"] == 1.0:   # a right answer is the number the calculator returned in this conversation
            tool_answers = [m["content"] for m in record["messages"] if m["role"] == "tool"]
            assert record["messages"][-1]["content"].strip() in tool_answers, record["messages"]
