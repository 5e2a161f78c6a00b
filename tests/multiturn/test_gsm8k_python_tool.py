"""The grpo-gsm8k-python-tool recipe end to end on CPU, through the real CLI: init -> data prep gsm8k
--tools python (console entry) -> train 2 steps (the same CLI entry in this process, on the shared Ray; the
hf engine, the built-in gsm8k reward).

A random tiny model never writes a tool call, so the policy is the session's tiny model after ~100
plain-torch steps on one transcript (tests/multiturn/tool_model.py): the first prepared GSM8K prompt
(its system message offering `python`) -> a `python` call -> the tool's output -> `#### 72`. The
logged rollouts must then show the program really ran in rlctl's sandbox: each tool message is what
the sandbox prints for the call's code, its tokens are masked out of training, and the GSM8K reward
scored the conversations. Only the
GPU is replaced (CPU overrides of the recipe's sizes); the recipe's GPU run is not tested here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import rlctl_here
from support.tool_model import conversation, train_tool_caller

RECIPE = "grpo-gsm8k-python-tool"
CODE = "print(48 + 48 // 2)"   # Natalia's clips, the fixture's first train question: 72
CPU = ["resources.gpus_per_node=0", "resources.workers=1", "data.batch_size=2", "rollout.n=2",
       "actor.mini_batch_size=2", "actor.micro_batch_size=4", "data.max_prompt_length=1792",
       "data.max_response_length=256", "data.val_batch_size=2", "run.total_steps=2", "model.dtype=float32",
       "model.gradient_checkpointing=false", "reward.workers=1", "rollout.temperature=0.3"]


def rlctl(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=600)


def tool_turns(messages: list[dict]) -> list[tuple[str, str]]:
    """(code, tool message) for each structured python call answered by the next message."""
    pairs = []
    for msg, answer in zip(messages, messages[1:]):
        for call in (msg.get("tool_calls") or []) if msg["role"] == "assistant" else []:
            fn = call["function"]
            args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
            if fn["name"] == "python" and answer["role"] == "tool":
                pairs.append((args["code"], answer["content"]))
    return pairs


@pytest.mark.slow
def test_recipe_runs_the_python_tool_in_the_sandbox(tmp_path, tiny_model_dir, gsm8k_dir, ray_cluster):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from rlctl.multiturn.builtin_tools import python
    from rlctl.sandbox import run as sandbox_run

    proj = tmp_path / "proj"
    assert rlctl("init", proj, "--recipe", RECIPE, cwd=tmp_path).returncode == 0
    prep = rlctl("data", "prep", "gsm8k", "--tools", "python", "--source", gsm8k_dir, "--limit", "2", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    row = pq.read_table(proj / "data/gsm8k-python/train.parquet").to_pylist()[0]
    assert row["reward_model"]["ground_truth"] == "72" and row["prompt"][0]["role"] == "system"
    # the policy: the tiny model taught this one conversation on the prompt exactly as the rollout renders it
    model = train_tool_caller(tiny_model_dir, tmp_path / "caller", tool=python, steps=120,
                              messages=conversation(row["prompt"], {"name": "python", "arguments": {"code": CODE}},
                                                    "72", "#### 72"))

    train = rlctl_here("train", f"model.path={model}", *CPU, cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    run = proj / "runs" / RECIPE
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert "val/acc" in metrics[-1]
    records = [json.loads(line) for step in (1, 2)
               for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    assert len(records) == 8
    calls = [(code, out) for rec in records for code, out in tool_turns(rec["messages"])]
    assert (CODE, "72") in calls, calls   # the memorised call ran and the sandbox's output came back
    assert sandbox_run(CODE).stdout == "72\n"
    for code, out in calls:               # every tool message is what the tool answers for the model's code
        assert out == python(code), (code, out)
    # the built-in gsm8k reward read the conversations: `#### 72` after the tool scores 1 on Natalia's row
    solved = [r for r in records if r["messages"][-1]["content"].strip() == "#### 72"]
    assert solved and all(r["score"] == (1.0 if "Natalia" in r["messages"][1]["content"] else 0.0) for r in solved)
    # the tool's output is in the sample's tokens but not trained on (response_mask 0)
    tok = AutoTokenizer.from_pretrained(model)
    for rec in solved:
        ids, mask = rec["response_ids"], rec["response_mask"]
        assert "<tool_response>\n72\n</tool_response>" in tok.decode([t for t, m in zip(ids, mask) if m == 0])
        assert "tool_response" not in tok.decode([t for t, m in zip(ids, mask) if m == 1])


def test_recipe_validates_as_shipped_and_reads_what_the_prep_writes():
    from rlctl.config.loader import load_config
    from rlctl.validate import validate
    from rlctl.tasks.prep import PrepOptions, out_dir
    from rlctl.recipes import get_recipe

    recipe = get_recipe(RECIPE)
    loaded = load_config(recipe.path)
    problems, plan = validate(loaded, machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    cfg = loaded.config
    prepared = out_dir("gsm8k", PrepOptions(tools=("python",)))
    assert recipe.data_command == "rlctl data prep gsm8k --tools python"
    assert cfg.data.train_files == (f"{prepared}/train.parquet",) and cfg.data.val_files == (f"{prepared}/test.parquet",)
    mt = cfg.rollout.multi_turn
    assert mt.enable and mt.tools == ("python",) and mt.tool_format == "hermes"
    assert cfg.reward.function == "gsm8k" and cfg.rollout.engine == "hf" and cfg.resources.gpus_per_node == "auto"
    assert "Instruct" in cfg.model.path and "NOT RUN ON A GPU YET" in recipe.text()
