"""The chat templates of `rlctl model tiny`'s tokenizers: ChatML in Qwen2.5's shape, with Qwen's own
tools block (the Qwen-vocabulary tokenizer, rlctl.models.qwen_vocab) or a compact one (the byte-level
tokenizer, rlctl.models.tiny). Both tokenizer builders read them from here."""

from __future__ import annotations

import re

# ChatML in Qwen2.5's shape: `tools=` renders a system block listing the tools, an assistant's
# `tool_calls` render as hermes `<tool_call>` JSON blocks, and `tool` messages (consecutive ones
# together) come back inside one user turn as `<tool_response>` blocks. Without tools it renders
# exactly `<|im_start|>role\ncontent<|im_end|>\n` per message (no default system).
_QWEN_TOOLS_BLOCK = (
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments'"
    " + ' within <tool_call></tool_call> XML tags:\n<tool_call>\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n' }}"
)
# The byte-level tokenizer spends one token per byte, so Qwen's block above (its instructions plus
# every schema as JSON) costs ~700 tokens for one small tool, and a 2 x 64 model does not learn to
# copy a number across it (docs/multi-turn.md). Its block names each tool, its parameters and its
# description on one line, and shows the call format once (~160 tokens for the calculator).
_COMPACT_TOOLS_BLOCK = (
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools' }}"
    "{%- for tool in tools %}{%- set fn = tool['function'] if tool.get('function') else tool %}"
    "{%- set params = (fn.get('parameters') or {}).get('properties') or {} %}"
    "{{- '\n' + fn['name'] + '(' + (params | list | join(', ')) + ')' }}"
    "{%- if fn.get('description') %}{{- ': ' + fn['description'] }}{%- endif %}"
    "{%- endfor %}"
    "{{- '\nCall a tool as <tool_call>\n{\"name\": <name>, \"arguments\": <json object>}\n</tool_call><|im_end|>\n' }}"
)


def _chat_template(tools_block: str) -> str:
    return (
        "{%- if tools %}" + tools_block +
        "{%- elif messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' and loop.first %}"
        "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
        "{{- '<|im_start|>assistant' }}"
        "{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}"
        "{%- for call in message['tool_calls'] %}"
        "{%- set fn = call['function'] if call.get('function') else call %}"
        "{%- set args = fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) %}"
        "{{- '\n<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + args + '}\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\n' }}"
        "{%- elif message['role'] == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
        "{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
    )


QWEN_CHAT_TEMPLATE = _chat_template(_QWEN_TOOLS_BLOCK)  # Qwen's own vocabulary (rlctl.models.qwen_vocab)
BYTE_CHAT_TEMPLATE = _chat_template(_COMPACT_TOOLS_BLOCK)  # the byte-level tokenizer's

# The tiny vision-language model's template: the byte-level one, with every message's content
# rendered by one macro. Content is a string (an `<image>` marker, verl's data format, becomes the
# vision tokens) or a list of parts, as real VLM templates take them ({"type": "image"} or
# "image_url" -> the vision tokens, {"type": "text"} -> its text).
VISION_TOKENS = "<|vision_start|><|image_pad|><|vision_end|>"
_RENDER_CONTENT = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content | replace('<image>', '" + VISION_TOKENS + "') -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '" + VISION_TOKENS + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)
VISION_CHAT_TEMPLATE = _RENDER_CONTENT + re.sub(r"(messages\[0\]|message)\['content'\]", r"render(\1['content'])",
                                                BYTE_CHAT_TEMPLATE)
