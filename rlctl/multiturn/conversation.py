"""One sample's conversation, kept token-in-token-out.

The ids the model generated are appended exactly as sampled and never re-tokenised. Everything
else - tool answers, interaction messages and the chat template's glue between turns - is
tokenised as the template renders it, by delta: with `text` the rendering the ids so far stand
for, the template's rendering of the longer conversation R must start with `text`, and the new ids
are tokenize(R[len(text):]) with response_mask 0. The delta always starts right after the model's
turn-closing special token, where BPE merges cannot reach across, so these ids are what the
template would give. Hence, for every sample:

    decode(prompt_ids + response_ids) + closing == render(messages)

where `closing` is the template's text after the last assistant turn's content (e.g.
"<|im_end|>\n", the final EOS included; see `check_transcript`). A model turn whose rendering is
not what the model wrote (say, a tool call JSON with other spacing) is kept as plain content text,
so the rendering stays exact; its calls are still executed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlctl.data.sft import render
from rlctl.multiturn.formats import openai_tool_calls, parse_tool_calls
from rlctl.multiturn.tools import SampleTools


class ChatRenderer:
    """The tokenizer's chat template (with the tools' schemas) as text, and text <-> ids."""

    def __init__(self, tokenizer, tool_schemas: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.tools = list(tool_schemas or []) or None
        self.closing = self._closing()

    def render(self, messages: list[dict], *, generation_prompt: bool) -> str:   # as SFT renders (data.sft)
        return render(self.tokenizer, messages, self.tools, generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _closing(self) -> str:
        """What the template writes after an assistant message's content (e.g. "<|im_end|>\\n")."""
        marker = "\x00rlctl-probe\x00"
        text = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}],
                           generation_prompt=False)
        return text[text.index(marker) + len(marker):]


@dataclass
class Conversation:
    """A sample's state. `messages` holds the whole chat (prompt first); `text` is what
    prompt_ids + response_ids stand for."""

    messages: list
    prompt_ids: list
    text: str
    extra_info: dict
    tools: SampleTools
    response_ids: list = field(default_factory=list)
    response_mask: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)
    turns: int = 0
    calls: list = field(default_factory=list)          # [{"name", "arguments", "error"}] in order
    pending: list = field(default_factory=list)        # this turn's calls (ToolCall) and parse errors (str)
    turn_scores: list = field(default_factory=list)
    interaction_state: Any = None
    next: str = ""                                     # "tools" | "interact" | "" (done)
    finish: str = ""                                   # why it ended: stop, length, max_turns, interaction, template
    images: list = field(default_factory=list)         # VLM: [(pixel_values, image_grid_thw)] prompt's, then tools'
    positions: Any = None                              # VLM: M-RoPE positions [3, len(ids)] of the last turn

    @property
    def done(self) -> bool:
        return bool(self.finish)

    def add_turn(self, renderer: ChatRenderer, ids: list[int], log_probs: list[float] | None, *, truncated: bool,
                 eos_ids: set, max_turns: int, has_tools: bool, has_interaction: bool, fmt: str,
                 at_budget: bool = True) -> None:
        """Append the model's turn exactly as generated and decide what comes next.

        truncated: no EOS ended it; at_budget: it used up the response budget (else it was cut at
        max_turn_length, and the template's end-of-turn text comes with the next glue, mask 0)."""
        self.turns += 1
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)
        self.text += renderer.decode(ids)
        body = ids[:-1] if ids and ids[-1] in eos_ids else ids
        content = renderer.decode(body)
        parsed = parse_tool_calls(content, fmt) if has_tools else None
        candidates = [{"role": "assistant", "content": content}]
        if parsed is not None and parsed.calls and not parsed.errors:
            structured = {"role": "assistant", "content": parsed.content,
                          "tool_calls": openai_tool_calls(parsed.calls, id_prefix=f"call_{self.turns}")}
            candidates.insert(0, structured)
        for message in candidates:   # the structured form only where it renders exactly what the model wrote
            if renderer.render(self.messages + [message], generation_prompt=False).startswith(self.text):
                break
        else:   # a turn closed by another EOS than the template's (<|endoftext|>): it cannot go on
            message = candidates[-1]
            self.finish = "stop" if ids and ids[-1] in eos_ids else "template"
        self.messages.append(message)
        if self.finish:
            return
        if truncated and at_budget:
            self.finish = "length"
        elif self.turns >= max_turns:
            self.finish = "max_turns"
        elif parsed is not None and (parsed.calls or parsed.errors):
            self.next, self.pending = "tools", list(parsed.calls) + list(parsed.errors)
        elif has_interaction:
            self.next = "interact"
        else:
            self.finish = "stop"

    def extend(self, renderer: ChatRenderer, new_messages: list[dict], budget: int,
               images=None, vision=None) -> bool:
        """Add non-model messages (tool answers, a user turn) + the next generation prompt, as the
        template renders them, with mask 0. False (and the conversation ends, without them) when
        they would leave no room for one more model token within `budget` response tokens: a
        tool image is never cut, its whole answer is left out. `images` (pixel_values,
        image_grid_thw) of the messages' images in order, and `vision` (TurnImages) to expand
        their placeholders (rlctl.multiturn.vision_turns)."""
        messages = self.messages + new_messages
        rendered = renderer.render(messages, generation_prompt=True)
        if not rendered.startswith(self.text):
            self.finish = "template"
            return False
        delta = renderer.encode(rendered[len(self.text):])
        text = renderer.decode(delta)   # `text` keeps the template's one placeholder per image
        if images is not None:
            delta = vision.expand(delta, images[1])
            if delta is None:   # the template wrote no placeholder for a tool image
                self.finish = "template"
                return False
        if len(self.response_ids) + len(delta) >= budget:
            self.finish = "length"
            return False
        self.messages = messages
        self.response_ids += delta
        self.response_mask += [0] * len(delta)
        self.log_probs += [0.0] * len(delta)
        self.text += text
        if images is not None:
            self.images.append(images)
        self.next = ""
        return True

    def summary(self) -> dict:
        return {"num_turns": self.turns, "tool_calls": self.calls, "turn_scores": self.turn_scores,
                "tool_rewards": list(self.tools.rewards), "finish": self.finish}


def check_transcript(renderer: ChatRenderer, prompt_ids, response_ids, messages, eos_ids) -> str | None:
    """The invariant of this module for one finished sample; None when it holds, else what differs."""
    ids = list(prompt_ids) + list(response_ids)
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    decoded = renderer.decode(ids) + renderer.closing
    rendered = renderer.render(messages, generation_prompt=False)
    if decoded == rendered:
        return None
    at = next((i for i, (a, b) in enumerate(zip(decoded, rendered)) if a != b), min(len(decoded), len(rendered)))
    return f"differs at character {at}: ids give {decoded[at:at + 40]!r}, the template {rendered[at:at + 40]!r}"
