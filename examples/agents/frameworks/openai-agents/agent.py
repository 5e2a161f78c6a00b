"""The calculator task (../calc.py) with the OpenAI Agents SDK, its defaults kept: the Responses API
(`POST /v1/responses`) through the default OpenAI provider, which reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment.

Two settings differ from a fresh `Agent`: the model's name (the SDK's default names a hosted model
and adds that model's reasoning settings) and tracing, whose exporter would send every run to
OpenAI's servers (the endpoint is loopback only and the run needs no trace). Run by rlctl once per
episode (rlctl.toml beside this file).
"""

import sys
from pathlib import Path

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calc  # noqa: E402  (the shared task, one folder up)


def main() -> None:
    set_tracing_disabled(True)
    row = calc.read_row()
    agent = Agent(name="calculator", instructions=calc.INSTRUCTIONS, model=calc.MODEL,
                  tools=[function_tool(calc.calculator)], model_settings=ModelSettings(max_tokens=calc.MAX_TOKENS))
    try:
        answer = Runner.run_sync(agent, calc.question(row), max_turns=calc.MAX_TURNS).final_output
    except (MaxTurnsExceeded, ModelBehaviorError):   # no answer within MAX_TURNS, or a call to no such tool
        answer = None
    calc.report(calc.score(answer, row))


if __name__ == "__main__":
    main()
