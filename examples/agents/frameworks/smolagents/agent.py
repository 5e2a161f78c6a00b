"""The calculator task (../calc.py) with smolagents' ToolCallingAgent.

It speaks chat completions and sends tool_choice "required" on every step: the model calls the
calculator, then the built-in `final_answer` tool with the answer. The OpenAI client reads
OPENAI_BASE_URL and OPENAI_API_KEY from the environment. One setting differs from the defaults:
the system prompt is replaced by a short one (the default teaches the tool format with worked
examples over ~900 tokens, which a small model on CPU pays for on every call). Run by rlctl once
per episode (rlctl.toml beside this file).
"""

import importlib.resources
import sys
from pathlib import Path

import yaml
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calc  # noqa: E402  (the shared task, one folder up)

SYSTEM_PROMPT = calc.INSTRUCTIONS + " Give the number to the final_answer tool."


def main() -> None:
    row = calc.read_row()
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath(
        "toolcalling_agent.yaml").read_text())
    templates["system_prompt"] = SYSTEM_PROMPT
    # retry=False and max_retries=0: a refused call (4xx) fails the episode at once instead of a 60 s back-off
    model = OpenAIServerModel(calc.MODEL, client_kwargs={"max_retries": 0}, retry=False,
                              max_tokens=calc.MAX_TOKENS)
    agent = ToolCallingAgent(tools=[tool(calc.calculator)], model=model, prompt_templates=templates,
                             max_steps=calc.MAX_TURNS - 1, verbosity_level=0)
    # past max_steps the agent asks once more for an answer without tools: MAX_TURNS calls at most
    calc.report(calc.score(agent.run(calc.question(row)), row))


if __name__ == "__main__":
    main()
