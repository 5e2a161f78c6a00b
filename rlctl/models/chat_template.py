"""Chat templates of your own: `model.chat_template = "FILE.jinja"` and `rlctl serve --chat-template FILE`.

A model's own template may not render what a run needs (SmolLM2's ignores `tools`, so no tool agent
could train it). A Jinja file then replaces it wherever the policy's tokenizer renders a chat: the
prompts training reads, the rollout workers (multi-turn, the agent endpoint), validation, and
`rlctl merge`, which saves it with the tokenizer so the merged model (and `rlctl eval` / `serve` of it
or of the run) renders the same. A relative path is relative to rlctl.toml; a name rlctl ships
(templates/*.jinja, e.g. smollm2-tools.jinja) is taken from there when no such file is beside it.

A template is checked by rendering a short conversation, and one that mentions `tools` also one with
a tool, a call and its result, exactly as transformers renders it for apply_chat_template.
"""

from __future__ import annotations

from pathlib import Path

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config

_CONVERSATION = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "What is 2 + 2?"}]
_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
_TOOL_TURNS = [{"role": "user", "content": "What is 2 + 2?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
               {"role": "tool", "tool_call_id": "call_0", "content": "4"}]


def bundled(name: str) -> Path | None:
    """rlctl's own template of that file name (templates/NAME), or None."""
    path = _shipped_dir() / name
    return path if name.endswith(".jinja") and path.is_file() else None


def resolve(value: str, base: Path) -> Path:
    """The file a configured template names: relative to `base` (rlctl.toml's folder), else one rlctl ships."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    if not path.is_file() and not Path(value).is_absolute():
        return bundled(Path(value).name) or path
    return path


def render_error(template: str) -> str | None:
    """Why `template` cannot render a short conversation (and, if it speaks of tools, one with a tool
    call and its result), or None when it can."""
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = [(_CONVERSATION, None)] + ([(_TOOL_TURNS, [_TOOL])] if "tools" in template else [])
    for messages, tools in cases:
        try:
            render_jinja_template([messages], tools=tools, chat_template=template, add_generation_prompt=True,
                                  bos_token="", eos_token="")
        except Exception as e:   # a syntax error, an undefined name, the template's own raise_exception
            what = "a conversation with a tool call" if tools else "a short conversation"
            return f"it fails to render {what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def template_problem(path: Path, named: str) -> str | None:
    """What is wrong with the template file `path` (named `named` by the user), or None."""
    if not path.is_file():
        names = ", ".join(p.name for p in sorted(_shipped_dir().glob("*.jinja"))) or "none"
        return f"{named} does not exist (a Jinja chat template file; rlctl ships: {names})"
    error = render_error(path.read_text(encoding="utf-8"))
    return f"{path}: {error}" if error else None


def checked_template(value: str, base: Path, flag: str) -> Path:
    """The template file `value` names (`rlctl serve --chat-template`: relative to `base` or one rlctl
    ships); a one-line UsageError when it is missing or cannot render."""
    from rlctl.errors import UsageError

    path = resolve(value, base).resolve()
    problem = template_problem(path, str(path))
    if problem:
        raise UsageError(f"{flag} {problem}", hint=f"leave {flag} out to use the model's own template")
    return path


def use_template(tokenizer, path: str | Path | None):
    """`tokenizer` (or a processor) rendering with the template in `path` ("" / None: its own)."""
    if path and tokenizer is not None:
        tokenizer.chat_template = Path(path).read_text(encoding="utf-8")
    return tokenizer


def check_chat_template(c: Config, ctx: CheckContext) -> list[Problem]:
    """model.chat_template names a file that renders a conversation (machine pass: it reads the file)."""
    if not c.model.chat_template:
        return []
    from rlctl.models.checks import model_config

    if (model_config(c, ctx) or {}).get("vision_config") is not None:   # its processor renders the prompts
        return [Problem("model.chat_template", "is not applied to a vision-language model's processor yet; "
                                               "leave it out (the processor's own template renders the chats)")]
    problem = template_problem(resolve(c.model.chat_template, ctx.base_dir), c.model.chat_template)
    return [Problem("model.chat_template", problem)] if problem else []


def _shipped_dir() -> Path:
    from rlctl.recipes import bundled_dir

    return bundled_dir("templates")
