"""A tiny model that has learned to call a tool: a hundred or so plain-torch steps on a few transcripts.

Tests of multi-turn rollouts with tools need a policy that writes tool calls; a random tiny model
never does. This memorises [prompt -> tool call -> tool answer -> final answer] (loss on the
assistant turns only, rendered by the model's own chat template with the tool's schema). The
default is the calculator on "What is 2 + 2?"; `conversation` builds others (the python tool on a
GSM8K prompt: tests/multiturn/test_gsm8k_python_tool.py). Given several conversations (e.g. one
calling the tool and one answering directly, for the same question) it learns each, so it samples
between them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CALL = {"name": "calculator", "arguments": {"expression": "2+2"}}

# the reward of the tests that use this model: exact final answer after a good calculator call, and a
# check that verl's multi-turn extra_info keys arrived
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    missing = [k for k in ("messages", "num_turns", "tool_calls", "turn_scores", "tool_rewards") if k not in extra_info]
    if missing:
        raise KeyError(f"extra_info lacks {missing}")
    if extra_info["num_turns"] != sum(m["role"] == "assistant" for m in extra_info["messages"]):
        raise ValueError("num_turns does not count the assistant turns")
    used = any(c["name"] == "calculator" and not c["error"] for c in extra_info["tool_calls"])
    final = extra_info["messages"][-1]
    return float(used and final["role"] == "assistant" and final["content"].strip() == ground_truth)
'''


def conversation(prompt: list[dict], call: dict, tool_answer: str, final: str) -> list[dict]:
    """`prompt` (chat messages), then one assistant turn making `call`, the tool's answer, the final answer."""
    return [*prompt,
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]},
            {"role": "tool", "content": tool_answer},
            {"role": "assistant", "content": final}]


def transcript(question: str) -> list[dict]:
    return conversation([{"role": "user", "content": question}], CALL, "4", "4")


def train_tool_caller(src: Path, out: Path, *, messages: list[dict] | None = None, tool=None,
                      steps: int = 100, lr: float = 4e-3,
                      conversations: list[list[dict]] | None = None) -> Path:
    """`src` trained on `conversations` (or the one `messages`; default: the calculator transcript)
    rendered with `tool`'s schema (a typed, documented function; default the calculator), saved as
    a model folder at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema

    from rlctl.data.sft import tokenize_conversation
    from rlctl.multiturn.builtin_tools import calculator

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    # the SFT mask: the assistant turns' tokens up to <|im_end|> are labels; everything else is context
    examples = []
    for convo in conversations or [messages or transcript("What is 2 + 2?")]:
        ids, mask = tokenize_conversation(tok, convo, [get_json_schema(tool or calculator)])
        examples.append((torch.tensor([ids]), torch.tensor([[t if m else -100 for t, m in zip(ids, mask)]])))
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    torch.manual_seed(0)
    targets = sum(int((y[:, 1:] != -100).sum()) for _, y in examples)
    for _ in range(steps):   # the mean over all target tokens, so each conversation weighs by its length
        loss = sum(model(input_ids=x, labels=y).loss * int((y[:, 1:] != -100).sum()) for x, y in examples) / targets
        loss.backward()
        optim.step()
        optim.zero_grad()
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for extra in ("generation_config.json", "rlctl_tiny.json"):
        if (src / extra).exists():
            shutil.copy(src / extra, out / extra)
    return out
