"""A real multi-turn run for `rlctl view`: `rlctl train`'s training, called in this process (in the Ray it
has started, else in an embedded one of its own), of GRPO with the calculator tool on a tiny model taught
to call it, 4 prompts x 2 samples a step, run.log_rollouts on. Used by tests/view/conftest.py (2 steps)
and scripts/view_screenshots.py (the docs' pictures)."""

from __future__ import annotations

import sys
from pathlib import Path

from support.parquet_rows import write_rows

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = (("What is 2 + 2?", "4"), ("What is 2 + 2?", "4"), ("What is 3 + 4?", "7"), ("What is 2 + 2?", "4"))
OVERRIDES = ["resources.gpus_per_node=0", "resources.workers=1", "data.batch_size=4", "rollout.n=2",
             "actor.mini_batch_size=4", "actor.micro_batch_size=4", "data.max_prompt_length=1024",
             "data.max_response_length=200", "data.val_files=[]", 'data.train_files=["data/train.parquet"]',
             "model.dtype=float32", "model.gradient_checkpointing=false", "reward.function=reward.py:compute_score",
             "reward.workers=1", "actor.lr=1e-4", "rollout.temperature=0.7", "run.log_rollouts=true",
             "rollout.multi_turn.enable=true", 'rollout.multi_turn.tools=["calculator"]',
             "rollout.multi_turn.max_turns=3", "run.save_every=0", "run.log_samples=2"]


def make_calc_run(root: Path, tiny_model: Path, steps: int = 2) -> Path:
    """Train the tool caller from `tiny_model`, then `rlctl train` `steps` steps in root/p; the run folder."""
    sys.path.insert(0, str(REPO / "tests" / "multiturn"))
    from support.tool_model import REWARD, train_tool_caller

    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training
    from rlctl.project import write_project

    model = train_tool_caller(tiny_model, root / "tool_model", steps=60)
    project = root / "p"
    write_project(project, "grpo-gsm8k", str(model))
    (project / "reward.py").write_text(REWARD)
    write_rows(project / "data" / "train.parquet", [
        {"data_source": "calc", "prompt": [{"role": "user", "content": q}],
         "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index": i}}
        for i, (q, answer) in enumerate(QUESTIONS)])
    start_training(load_config(project / "rlctl.toml", [*OVERRIDES, f"run.total_steps={steps}"]), address=None,
                   force=False)
    return project / "runs" / "grpo-gsm8k"
