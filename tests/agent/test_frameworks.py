"""The framework agents of examples/agents/frameworks train: each example's own rlctl.toml, its agent a
command run by the framework's interpreter in .venv-agents (scripts/setup.sh installs the frameworks
there from PyPI), 2 GRPO steps on the session's tool-calling tiny model and `rlctl data prep arith` rows,
and every episode completes (agent/failed == 0 at every step).

Real everything: the shared embedded Ray, the actor rank, the hf engine behind the agent endpoint on
loopback, one process per episode speaking to it through the framework's own client. The tiny model
seldom answers right, so the rewards are mostly 0: what is tested is that each framework's requests
are served and its episodes end with a reward, not what the model learns (docs/benchmarks.md has the
SmolLM2 run that learns).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from support.venvs import venv_python

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "agents" / "frameworks"
VENV_PYTHON = REPO / ".venv-agents" / "bin" / "python"
FRAMEWORKS = {"langgraph": "langgraph.prebuilt, langchain_openai", "openai-agents": "agents",
              "pydantic-ai": "pydantic_ai", "smolagents": "smolagents"}   # folder -> what its agent imports
STEPS = 2
TINY = ["model.dtype=float32", "model.chat_template=", "data.max_prompt_length=768", "data.max_response_length=1024", "data.batch_size=2",
        "rollout.n=2", "actor.mini_batch_size=2", "actor.micro_batch_size=4", "rollout.agent.concurrency=4",
        "run.val_before_train=false", "data.val_files=[]", "run.save_every=0", "run.keep_last=0",
        f"run.total_steps={STEPS}"]


def framework_python(folder: str) -> Path:
    """.venv-agents' interpreter once `folder`'s framework imports in it; else a skip (a failure under CI=true)."""
    return venv_python(VENV_PYTHON, FRAMEWORKS[folder], folder)


@pytest.fixture(scope="module")
def arith(tmp_path_factory) -> Path:
    from rlctl.tasks.prep import PrepOptions, prepare

    out = tmp_path_factory.mktemp("arith")
    prepare("arith", PrepOptions(out=out))
    return out


@pytest.mark.parametrize("folder", list(FRAMEWORKS))
def test_a_framework_agent_trains_with_every_episode_completing(folder, arith, tool_model_dir, ray_cluster,
                                                                tmp_path):
    framework_python(folder)   # the example's own command runs it: ../../../../.venv-agents/bin/python
    start_training(load_config(EXAMPLES / folder / "rlctl.toml", TINY + [
        f"model.path={tool_model_dir}", f"data.train_files=[\"{arith / 'train.parquet'}\"]",
        f"run.output_dir={tmp_path}"]), address=None, force=False)
    rows = [json.loads(line) for line in (tmp_path / folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["agent/failed"] == 0.0, (folder, r)
        assert r["agent/calls"] >= 1.0 and "agent/called" in r and "actor/pg_loss" in r
