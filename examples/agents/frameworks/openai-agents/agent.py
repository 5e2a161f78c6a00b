"""The calculator task (../calc.py) with the OpenAI Agents SDK, its defaults kept: the Responses API
(`POST /v1/responses`) through the default OpenAI provider, which reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment.

The SDK's default model (its name and reasoning settings: the endpoint serves the policy under any
name) with one setting added, max_tokens, so every turn fits the episode's room; tracing is off, as its
exporter would send every run to OpenAI's servers (the endpoint is loopback only and the run needs no
trace). Run by rlctl once per episode (rlctl.toml beside this file).
"""

import sys
from pathlib import Path

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.models import get_default_model_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calc  # noqa: E402  (the shared task, one folder up)


def main() -> None:
    set_tracing_disabled(True)
    row = calc.read_row()
    settings = get_default_model_settings().resolve(ModelSettings(max_tokens=calc.MAX_TOKENS))
    agent = Agent(name="calculator", instructions=calc.INSTRUCTIONS, tools=[function_tool(calc.calculator)],
                  model_settings=settings)
    try:
        answer = Runner.run_sync(agent, calc.question(row), max_turns=calc.MAX_TURNS).final_output
    except (MaxTurnsExceeded, ModelBehaviorError):   # no answer within MAX_TURNS, or a call to no such tool
        answer = None
    calc.report(calc.score(answer, row))


if __name__ == "__main__":
    main()
