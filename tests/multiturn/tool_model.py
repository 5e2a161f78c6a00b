"""A tiny model that has learned to call the calculator: a few hundred plain-torch steps on a few transcripts.

Tests of multi-turn rollouts with tools need a policy that writes tool calls; a random tiny model
never does. This memorises [question -> calculator call -> tool answer -> final answer] (loss on
the assistant turns only, rendered by the model's own chat template with the tool's schema); given
several conversations (e.g. one calling the tool and one answering directly, for the same
question) it learns each, so it samples between them.
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


def transcript(question: str) -> list[dict]:
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": CALL["name"], "arguments": json.dumps(CALL["arguments"])}}]},
            {"role": "tool", "content": "4"},
            {"role": "assistant", "content": "4"}]


def train_tool_caller(src: Path, out: Path, *, steps: int = 100, lr: float = 4e-3,
                      conversations: list[list[dict]] | None = None) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema

    from rlctl.data.sft import tokenize_conversation
    from rlctl.multiturn.builtin_tools import calculator

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    # the SFT mask: the assistant turns' tokens up to <|im_end|> are labels; everything else is context
    examples = []
    for messages in conversations or [transcript("What is 2 + 2?")]:
        ids, mask = tokenize_conversation(tok, messages, [get_json_schema(calculator)])
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
