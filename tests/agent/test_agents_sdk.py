"""The OpenAI Agents SDK itself as a command agent on the agent endpoint, with its defaults: an `Agent` with a
`function_tool` and nothing else (its default model name and that model's settings), `Runner.run_sync` /
`Runner.run_streamed`, the default OpenAI provider (the Responses API, `POST /v1/responses`, reading
OPENAI_BASE_URL and OPENAI_API_KEY). Only its tracing is off, from the environment
(OPENAI_AGENTS_DISABLE_TRACING=1: its exporter would send every run to OpenAI's servers). Each episode
calls the tool and answers, and its two calls merge into one training sequence.

The SDK runs in .venv-agents (scripts/setup.sh installs it there, apart from rlctl's own environment as
a user keeps an agent's dependencies); without it the test skips with that reason, and fails under
CI=true. The endpoint and policy are test_endpoint.py's (the tiny tool model behind LocalTurns, greedy).
"""

from __future__ import annotations

import json

import pytest
from support.venvs import venv_python
from test_endpoint import ROW, endpoint, policy  # noqa: F401  (fixtures)
from test_frameworks import VENV_PYTHON

from rlctl.agent.episodes import Episode
from rlctl.agent.rollout import agent_metrics
from rlctl.agent.runner import AgentRunner
from rlctl.config.rollout_tables import AgentConfig

pytestmark = pytest.mark.slow

SDK_AGENT = '''
import asyncio, json, sys

from agents import Agent, Runner, function_tool


@function_tool
def calculator(expression: str) -> str:
    """Evaluate arithmetic: numbers, + - * / // % ** and parentheses.

    Args:
        expression: e.g. "4821 * 37"
    """
    return str(eval(expression, {"__builtins__": {}}))


async def streamed(agent, question):
    result = Runner.run_streamed(agent, question, max_turns=3)
    async for _ in result.stream_events():
        pass
    return result


row = json.loads(sys.stdin.readline())
agent = Agent(name="calculator", tools=[calculator])
question = row["prompt"][-1]["content"]
if sys.argv[1] == "stream":
    result = asyncio.run(streamed(agent, question))
else:
    result = Runner.run_sync(agent, question, max_turns=3)
calls = sum(item.type == "tool_call_item" for item in result.new_items)
answer = str(result.final_output).strip()
print(json.dumps({"reward": float(answer == row["reward_model"]["ground_truth"]), "tool_calls": float(calls)}))
'''


def sdk_python() -> str:
    """.venv-agents' interpreter once the SDK imports there; else a skip (a failure under CI=true)."""
    return str(venv_python(VENV_PYTHON, "agents", "the OpenAI Agents SDK"))


@pytest.mark.parametrize("mode", ["run", "stream"])
def test_the_agents_sdk_with_its_defaults_trains_on_the_endpoint(endpoint, mode, monkeypatch):   # noqa: F811
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")   # the command inherits it
    engine, server, base = endpoint
    program = base / "sdk" / "agent.py"   # not beside test_endpoint's agents.py, which would shadow the SDK's `agents`
    program.parent.mkdir(exist_ok=True)
    program.write_text(SDK_AGENT)
    eps = [Episode(index=i, row=json.loads(json.dumps(ROW))) for i in range(2)]
    engine.begin(seed=0, mode="val")
    AgentRunner(AgentConfig(command=(sdk_python(), str(program), mode), timeout_s=120), base, server,
                engine).run(eps)
    assert engine.error is None
    for ep in eps:
        assert (ep.failure, ep.reward, ep.metrics) == ("", 1.0, {"tool_calls": 1.0}), ep.failure
        # the call, then the answer after the function's output: one sequence
        assert [c.merged for c in ep.calls] == [False, True] and len(ep.sequences) == 1
    assert agent_metrics(eps)["agent/merged"] == 1.0
