"""The `calc-tools` task's reward: the final answer, after any calculator calls, must be exact.

A multi-turn response holds the model's tool calls, the tool responses and the template glue
between turns; only the last assistant turn is the answer. With `extra_info["messages"]` (what
multi-turn rollouts pass) that turn is read from the messages; otherwise from the text after the
last `</tool_response>`, with special tokens and a left-over `assistant` role line removed
(decoding with skip_special_tokens keeps the role word of `<|im_start|>assistant`).

    final = the last assistant turn's text without its <tool_call> blocks, stripped, commas removed
    score = 1.0 if final == ground_truth; format_score if final is an integer; else 0.0
    acc   = 1.0 if final == ground_truth
    tool_call = 1.0 if the response called a tool (a `<tool_call>` block or an assistant tool_calls)
"""

from __future__ import annotations

import re

from rlctl.multiturn.formats import parse_tool_calls

DATA_SOURCE = "rlctl/calc-tools"
_INTEGER = re.compile(r"-?\d+")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
_ROLE_LINE = re.compile(r"^\s*assistant\s*\n")


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
