"""The calculator task (../calc.py) with pydantic-ai and a structured `output_type`: the answer is an
`Answer` object, validated by pydantic, not free text.

pydantic-ai's chat-completions model (`OpenAIChatModel`, the one its docs use for OpenAI-compatible
servers) offers the output schema as one more tool, `final_result`, beside the calculator, and sends
tool_choice "required": every turn is a tool call, and the run ends with a valid `final_result` call.
The provider reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment. Run by rlctl once per
episode (rlctl.toml beside this file).
"""

import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.usage import UsageLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calc  # noqa: E402  (the shared task, one folder up)


class Answer(BaseModel):
    answer: int


def main() -> None:
    row = calc.read_row()
    agent = Agent(OpenAIChatModel(calc.MODEL), output_type=Answer, instructions=calc.INSTRUCTIONS,
                  tools=[calc.calculator], model_settings={"max_tokens": calc.MAX_TOKENS})
    try:
        result = agent.run_sync(calc.question(row), usage_limits=UsageLimits(request_limit=calc.MAX_TURNS))
        answer = result.output.answer
    except (UnexpectedModelBehavior, UsageLimitExceeded):   # no valid Answer within the retries or MAX_TURNS
        answer = None
    calc.report(calc.score(answer, row))


if __name__ == "__main__":
    main()
