"""The synthetic `calc-tools` task: sums and products of larger numbers, solved with a calculator tool.

Too large for a tiny model to compute in its head (4-digit sums, 3-digit by 2-digit products),
easy with the built-in `calculator` tool (rlctl.multiturn.builtin_tools). Every answer has exactly
5 digits, so copying the tool's number into the final answer is a fixed stride back in the
conversation, which a tiny model can learn. Each row serves both stages of the CPU tool-use recipe:

* RL: `prompt` is the user's question alone; the rollout renders the tool's schema through the
  chat template (`[rollout.multi_turn] tools = ["calculator"]`), and the `calc-tools` reward
  scores the exact final answer (`score`, below).
* SFT: `messages` is the whole worked transcript in the OpenAI chat shape - the question, an
  assistant turn calling `calculator`, the `tool` answer, the final answer - and `tools` the
  JSON list of tool schemas to render it with (`apply_chat_template(messages, tools=...)`).
  One transcript in DIRECT_EVERY answers directly instead (the right number, no call), as a
  teacher who sometimes works in its head: an SFT'd model then calls the tool only part of the
  time, and RL has to learn that the call pays.

The ground truth is `calculator(expression)`, so the transcripts are right by construction.

The reward: the final answer, after any calculator calls, must be exact. A multi-turn response
holds the model's tool calls, the tool responses and the template glue between turns; only the
last assistant turn is the answer. With `extra_info["messages"]` (what multi-turn rollouts pass)
that turn is read from the messages; otherwise from the text after the last `</tool_response>`,
with special tokens and a left-over `assistant` role line removed
(decoding with skip_special_tokens keeps the role word of `<|im_start|>assistant`).

    final = the last assistant turn's text without its <tool_call> blocks, stripped, commas removed
    score = 1.0 if final == ground_truth; format_score if final is an integer; else 0.0
    acc   = 1.0 if final == ground_truth
    tool_call = 1.0 if the response called a tool (a `<tool_call>` block or an assistant tool_calls)
"""

from __future__ import annotations

import json
import random
import re

from rlctl.data.sources import Generated, PrepSource, rule_row
from rlctl.multiturn.builtin_tools import calculator
from rlctl.multiturn.formats import ToolCall, openai_tool_calls, parse_tool_calls

DATA_SOURCE = "rlctl/calc-tools"
DATA_SOURCES = (DATA_SOURCE,)
DEFAULT_VAL_FRACTION = 0.1
PROBLEMS = 1000  # half sums, half products; duplicates are redrawn
# every answer has 5 digits: 10000 <= 5000 + 5000, 9999 + 9999 <= 19998; 10000 <= 200 * 50, 999 * 99 <= 98901
OPERANDS = {"+": ((5_000, 9_999), (5_000, 9_999)), "*": ((200, 999), (50, 99))}
DIRECT_EVERY = 4   # SFT transcripts 0, 4, 8, ... of each split answer without the tool
TOOL_NAME = "calculator"
_INTEGER = re.compile(r"-?\d+")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
_ROLE_LINE = re.compile(r"^\s*assistant\s*\n")


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? Reply with the number only."


def tool_schemas() -> list[dict]:
    """The OpenAI function schemas of the task's tools, derived from the functions themselves (as the
    multi-turn rollout derives them)."""
    from rlctl.multiturn.tools import FunctionTool   # asyncio and threads: only when this task is made

    return [FunctionTool(calculator).schema]


def transcript(a: int, op: str, b: int, answer: str, *, direct: bool = False) -> list[dict]:
    """The worked conversation in the OpenAI chat shape (what the chat template renders); `direct`:
    the answer alone, without the calculator."""
    if direct:
        return [{"role": "user", "content": question(a, op, b)}, {"role": "assistant", "content": answer}]
    calls = openai_tool_calls([ToolCall(TOOL_NAME, {"expression": f"{a} {op} {b}"})])
    return [
        {"role": "user", "content": question(a, op, b)},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "name": TOOL_NAME, "content": answer},
        {"role": "assistant", "content": answer},
    ]


def _row(a: int, op: str, b: int, split: str, index: int, tools_json: str) -> dict:
    text = question(a, op, b)
    answer = calculator(f"{a} {op} {b}")
    return {
        **rule_row(DATA_SOURCE, [{"role": "user", "content": text}], "arithmetic", answer, split, index,
                   question=text, answer=answer),
        "messages": transcript(a, op, b, answer, direct=index % DIRECT_EVERY == 0),
        "tools": tools_json,
    }


def _problems(rng: random.Random) -> list[tuple[int, str, int]]:
    seen: set = set()
    ops = ["+", "*"] * (PROBLEMS // 2)
    for op in ops:
        (lo_a, hi_a), (lo_b, hi_b) = OPERANDS[op]
        problem = (rng.randint(lo_a, hi_a), op, rng.randint(lo_b, hi_b))
        while problem in seen:
            problem = (rng.randint(lo_a, hi_a), op, rng.randint(lo_b, hi_b))
        seen.add(problem)
    return sorted(seen, key=lambda p: (p[1], p[0], p[2]))  # a stable order before the seeded shuffle


def generate(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: PROBLEMS seeded problems, test = val_fraction of them."""
    rng = random.Random(seed)
    problems = _problems(rng)
    rng.shuffle(problems)
    n_test = round(len(problems) * val_fraction)
    splits = {"train": problems[n_test:], "test": problems[:n_test]}
    tools_json = json.dumps(tool_schemas())
    return {split: [_row(a, op, b, split, i, tools_json) for i, (a, op, b) in enumerate(chosen)]
            for split, chosen in splits.items() if chosen}


def final_answer(solution_str: str, extra_info: dict | None = None) -> str:
    """The last assistant turn's plain text (tool-call blocks removed), stripped, commas removed."""
    messages = (extra_info or {}).get("messages") if isinstance(extra_info, dict) else None
    if messages:
        assistant = [m for m in messages if m.get("role") == "assistant"]
        text = (assistant[-1].get("content") or "") if assistant else ""
    else:
        text = solution_str.rsplit("</tool_response>", 1)[-1]
        text = _ROLE_LINE.sub("", _SPECIAL.sub("", text), count=1)
    return parse_tool_calls(text).content.strip().replace(",", "")


def called_tool(solution_str: str, extra_info: dict | None = None) -> bool:
    messages = (extra_info or {}).get("messages") if isinstance(extra_info, dict) else None
    if messages and any(m.get("role") == "assistant" and m.get("tool_calls") for m in messages):
        return True
    return "<tool_call>" in solution_str


def score(solution_str: str, ground_truth: str, extra_info: dict | None = None, *,
          format_score: float = 0.0) -> dict:
    final = final_answer(solution_str, extra_info)
    exact = final == str(ground_truth).strip()
    value = 1.0 if exact else (format_score if _INTEGER.fullmatch(final) else 0.0)
    return {"score": value, "acc": float(exact), "tool_call": float(called_tool(solution_str, extra_info))}


def arrow_schema():
    """rlctl's row schema plus the SFT columns: `messages` (OpenAI chat messages) and `tools` (JSON)."""
    import pyarrow as pa

    from rlctl.data.schema import arrow_schema as rl_schema

    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(call)),
                         ("tool_call_id", pa.string()), ("name", pa.string())])
    return rl_schema().append(pa.field("messages", pa.list_(message))).append(pa.field("tools", pa.string()))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The exact final answer after any calculator calls (the last assistant turn), plus `tool_call`."""
    return score(solution_str, ground_truth, extra_info, format_score=format_score)


REWARDS = {"calc-tools": compute_score}
PREP = (PrepSource("calc-tools", Generated(DATA_SOURCE, generate, DEFAULT_VAL_FRACTION, arrow_schema),
                   help="offline tool-use task: RL prompts + SFT transcripts calling a calculator"),)
