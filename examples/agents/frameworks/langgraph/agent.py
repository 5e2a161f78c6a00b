"""The calculator task (../calc.py) with LangGraph's prebuilt ReAct agent on langchain-openai's ChatOpenAI.

It speaks chat completions with `tools` and tool_choice "auto": the model calls the calculator, the
ToolNode runs it and appends the result, and the loop ends on an answer without a call. ChatOpenAI
reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment. Run by rlctl once per episode
(rlctl.toml beside this file); `.venv-agents/bin/pip install -r requirements.txt` installs it.
"""

import sys
from pathlib import Path

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calc  # noqa: E402  (the shared task, one folder up)


def main() -> None:
    row = calc.read_row()
    # max_retries=0: a refused call (a 4xx from the endpoint) reaches this program at once and fails the episode
    llm = ChatOpenAI(model=calc.MODEL, max_tokens=calc.MAX_TOKENS, max_retries=0)
    agent = create_react_agent(llm, [tool(calc.calculator)], prompt=calc.INSTRUCTIONS)
    try:
        # each model call and each tool run is a graph step: 2 per turn, and the last answer's one
        out = agent.invoke({"messages": [("user", calc.question(row))]},
                           {"recursion_limit": 2 * calc.MAX_TURNS})
        answer = out["messages"][-1].content
    except GraphRecursionError:   # the model kept calling tools past MAX_TURNS: no answer, reward 0
        answer = None
    calc.report(calc.score(answer, row))


if __name__ == "__main__":
    main()
