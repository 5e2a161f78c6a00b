"""Proof that multi-turn GRPO, from the SFT stage of the CPU tool-use recipe, raises tool use and accuracy.

The start is tests/fixtures/calc-tools-sft: the `sft-calc-tools-cpu` recipe's model (1500 SFT steps on
`rlctl data prep calc-tools` transcripts, one in four answered without the tool), shipped so that the
suite need not spend the SFT stage's ~4 minutes; scripts/make_calc_tools_fixture.sh rebuilds it. It calls
the calculator in most conversations but not all, and copies numbers (the question's operands into the
call, the tool's answer into its reply) only part of the time at temperature 0.7.

The RL stage is the shipped `grpo-calc-tools-cpu` recipe (real Ray actors, the hf engine, the real
calculator, the built-in calc-tools reward) on a fixed set of eight training prompts, so that every step
samples the same questions and a rise is learning, not a change of questions. Tool use and accuracy must
both rise, and every rewarded answer must be the number a calculator turn returned. With a learning
rate of 1e-12 (GRPO doing nothing) the test fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.parquet_rows import write_rows
from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from rlctl.project import write_project
from rlctl.tasks.calc_tools import generate

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "calc-tools-sft"
PROMPTS = 8
STEPS = 24
WINDOW = 4   # steps averaged at each end: 256 conversations


def test_the_fixture_is_rlctl_tiny_with_todays_chat_template():
    """A changed byte-level template (or tokenizer) would leave the fixture trained on another rendering:
    rebuild it with scripts/make_calc_tools_fixture.sh."""
    from transformers import AutoTokenizer

    from rlctl.models.tiny import BYTE_CHAT_TEMPLATE, build_tokenizer

    shipped = AutoTokenizer.from_pretrained(FIXTURE)
    assert shipped.chat_template == BYTE_CHAT_TEMPLATE, "rebuild: bash scripts/make_calc_tools_fixture.sh"
    assert shipped.get_vocab() == build_tokenizer().get_vocab()


@pytest.mark.slow
def test_grpo_from_the_sft_stage_raises_tool_use_and_accuracy(tmp_path, ray_cluster):
    proj = tmp_path / "p"
    write_project(proj, "grpo-calc-tools-cpu", str(FIXTURE))
    rows = [{key: row[key] for key in ("data_source", "prompt", "reward_model", "extra_info")}
            for row in generate(0)["train"][:PROMPTS]]
    write_rows(proj / "data" / "calc-tools" / "train.parquet", rows)
    start_training(load_config(proj / "rlctl.toml", [
        f"run.total_steps={STEPS}", "run.save_every=0", "run.val_every=0", "run.val_before_train=false",
        "data.val_files=[]", f"data.batch_size={PROMPTS}"]), address=None, force=False)
    run = proj / "runs" / "grpo-calc-tools-cpu"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    tool_use = [m["multi_turn/tool_use_frac"] for m in metrics]
    acc = [m["reward/acc"] for m in metrics]
    curves = f"tool use {[round(x, 2) for x in tool_use]}, accuracy {[round(x, 2) for x in acc]}"

    def mean(xs):
        return sum(xs) / len(xs)

    assert mean(tool_use[:WINDOW]) < 0.95, f"the SFT model sometimes answers without the tool: {curves}"
    assert mean(tool_use[-WINDOW:]) > mean(tool_use[:WINDOW]) + 0.05, f"tool use rose: {curves}"
    assert mean(acc[-WINDOW:]) > mean(acc[:WINDOW]) + 0.15, f"accuracy rose: {curves}"
    for line in (run / "rollouts" / f"step_{STEPS}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["score"] == 1.0:   # a right answer is the number the calculator returned in this conversation
            tool_answers = [m["content"] for m in record["messages"] if m["role"] == "tool"]
            assert record["messages"][-1]["content"].strip() in tool_answers, record["messages"]
