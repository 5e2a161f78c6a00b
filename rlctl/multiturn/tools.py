"""Tools a model may call during a multi-turn rollout, and how their calls run.

Two kinds, both named in `[rollout.multi_turn] tools`:
  * a plain function with type hints and a Google-style docstring: its OpenAI function schema is
    derived from it (transformers' `get_json_schema`, the same derivation `rlctl data prep` uses),
    and it returns a string, a dict {"text": ..., "reward": ..., "images": [...]} or a ToolResult;
  * a verl BaseTool-style object (`tool_schema`, async or sync `create` / `execute` / `calc_reward`
    / `release`), used unchanged: per sample it is created on its first call with
    `extra_info.tools_kwargs[name]["create_kwargs"]`, executed per call, asked `calc_reward` and
    released when the conversation ends.

`ToolRunner` runs every call of a turn concurrently on one asyncio loop in a background thread
(sync functions in its thread pool), each with a time limit. Whatever goes wrong - an unknown
tool, bad arguments, an exception, a timeout - becomes the call's text answer ("error: ..."),
never an exception in the rollout.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rlctl.errors import ConfigError
from rlctl.multiturn.builtin_tools import BUILTINS
from rlctl.plugins import import_file


@dataclass
class ToolResult:
    """A tool call's answer. `images` (PIL images or encoded image bytes, in order) reach a
    vision-language policy inside the tool message, after its text's placeholders
    (rlctl.multiturn.vision_turns); a text-only policy is told they were left out."""

    text: str
    reward: float | None = None
    error: bool = False
    images: list = field(default_factory=list)


# --- loading ---------------------------------------------------------------------------------------

def load_object(spec: str, base: Path, key: str) -> Any:
    """`file.py:name` (relative to `base`) -> the named object. ConfigError (exit 2) when it is not there."""
    file, _, name = spec.rpartition(":")
    if not file or not name or not file.endswith(".py"):
        raise ConfigError(f"{key}: {spec!r} is not \"file.py:name\"",
                          hint="name a Python file and an object in it, e.g. \"tools.py:lookup\"")
    path = Path(file).expanduser()
    path = path if path.is_absolute() else (base / path)
    if not path.is_file():
        raise ConfigError(f"{key}: {file} does not exist (looked in {path.parent})")
    try:   # once per process, shared with reward.py and plugins; its folder joins sys.path
        module = import_file(path)
    except Exception as e:
        raise ConfigError(f"{key}: importing {file} failed: {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        public = [n for n in vars(module) if not n.startswith("_")]
        raise ConfigError(f"{key}: {file} has no {name!r}", hint=f"it defines: {', '.join(public[:12]) or 'nothing'}")
    return getattr(module, name)


class FunctionTool:
    """A plain typed function; its schema comes from its signature and docstring."""

    def __init__(self, fn: Callable, key: str = "rollout.multi_turn.tools"):
        from transformers.utils import get_json_schema

        try:
            self.schema = get_json_schema(fn)
        except Exception as e:   # missing type hints or docstring: transformers says which
            raise ConfigError(f"{key}: tool {getattr(fn, '__name__', fn)!r} has no usable schema: {e}",
                              hint="give every parameter a type hint and describe it under Args: in the "
                                   "docstring (Google style)") from e
        self.fn, self.name = fn, self.schema["function"]["name"]
        params = self.schema["function"]["parameters"]
        self.required = set(params.get("required", []))
        self.known = set(params.get("properties", {}))
        self.is_async = inspect.iscoroutinefunction(fn)

    async def call(self, arguments: dict, session: "SampleTools") -> ToolResult:
        unknown, missing = set(arguments) - self.known, self.required - set(arguments)
        if unknown or missing:
            what = [f"unknown argument(s) {sorted(unknown)}" if unknown else "",
                    f"missing argument(s) {sorted(missing)}" if missing else ""]
            return ToolResult(f"error: {self.name}: " + "; ".join(w for w in what if w), error=True)
        out = await self.fn(**arguments) if self.is_async else await asyncio.to_thread(self.fn, **arguments)
        return as_result(out)

    async def finish(self, session: "SampleTools") -> float | None:
        return None


class VerlTool:
    """A verl BaseTool-style object, used unchanged (sync or async methods both work)."""

    def __init__(self, obj: Any, key: str = "rollout.multi_turn.tools"):
        schema = getattr(obj, "tool_schema", None)
        if schema is None and hasattr(obj, "get_openai_tool_schema"):
            schema = obj.get_openai_tool_schema()
        if hasattr(schema, "model_dump"):   # verl's pydantic OpenAIFunctionToolSchema
            schema = schema.model_dump(exclude_unset=True, exclude_none=True)
        if not isinstance(schema, dict) or "function" not in schema or "name" not in schema["function"]:
            raise ConfigError(f"{key}: tool object {type(obj).__name__} has no OpenAI tool_schema",
                              hint="give it tool_schema = {\"type\": \"function\", \"function\": {\"name\": ..., "
                                   "\"description\": ..., \"parameters\": {...}}}")
        self.obj, self.schema, self.name = obj, schema, schema["function"]["name"]

    async def call(self, arguments: dict, session: "SampleTools") -> ToolResult:
        instance = session.instances.get(self.name)
        kwargs = session.tools_kwargs.get(self.name) or {}
        if instance is None:   # a vision prompt's first image is create_kwargs["image"] unless the row names one
            first = {"image": session.images[0]} if session.images else {}
            created = await maybe_await(self.obj.create(create_kwargs={**first, **(kwargs.get("create_kwargs") or {})}))
            instance = created[0] if isinstance(created, tuple) else created   # verl >= 0.5: (id, ToolResponse)
            session.instances[self.name] = instance
        out = await maybe_await(self.obj.execute(instance, arguments, **(kwargs.get("execute_kwargs") or {})))
        response, reward = (tuple(out) + (None,))[:2] if isinstance(out, tuple) else (out, None)   # (.., metrics)
        result = as_result(response)
        result.reward = reward if reward is not None else result.reward
        return result

    async def finish(self, session: "SampleTools") -> float | None:
        """calc_reward, then release, for a sample that created an instance."""
        instance = session.instances.pop(self.name, None)
        if instance is None:
            return None
        kwargs = session.tools_kwargs.get(self.name) or {}
        try:
            reward = await maybe_await(self.obj.calc_reward(instance, **(kwargs.get("calc_reward_kwargs") or {})))
        finally:
            await maybe_await(self.obj.release(instance, **(kwargs.get("release_kwargs") or {})))
        return None if reward is None else float(reward)


async def maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def as_result(out: Any) -> ToolResult:
    """A tool's return value -> ToolResult: a string, a dict with "text" (or "content"), "reward"
    and "images" (or verl's "image"), or an object with `.text` and `.image` (verl's ToolResponse)."""
    if isinstance(out, ToolResult):
        return out
    if isinstance(out, dict):
        text = out.get("text", out.get("content", ""))
        reward = out.get("reward")
        return ToolResult(str(text if text is not None else ""), None if reward is None else float(reward),
                          images=_image_list(out.get("images", out.get("image"))))
    if hasattr(out, "text") and not isinstance(out, str):
        return ToolResult(str(out.text or ""), images=_image_list(getattr(out, "image", None)))
    return ToolResult("" if out is None else str(out))


def _image_list(images: Any) -> list:
    """None, one image or a list of them -> a list (verl's ToolResponse.image is a list or None)."""
    if images is None:
        return []
    return list(images) if isinstance(images, (list, tuple)) else [images]


def make_tool(spec: str, base: Path):
    key = "rollout.multi_turn.tools"
    if spec in BUILTINS:
        return FunctionTool(BUILTINS[spec](), key)
    if ":" not in spec:
        raise ConfigError(f"{key}: unknown tool {spec!r}",
                          hint=f"use a built-in ({', '.join(BUILTINS)}) or \"file.py:name\"")
    obj = load_object(spec, base, key)
    if inspect.isclass(obj):
        raise ConfigError(f"{key}: {spec} is a class; name an instance of it",
                          hint="verl tool classes need their config and schema: in your file write "
                               "`my_tool = MyTool(config={...}, tool_schema=...)` and name my_tool")
    if hasattr(obj, "execute"):
        return VerlTool(obj, key)
    if callable(obj):
        return FunctionTool(obj, key)
    raise ConfigError(f"{key}: {spec} is neither a function nor a tool object (with execute)")


def load_tools(specs, base: Path) -> list:
    tools = [make_tool(s, base) for s in specs]
    seen: dict[str, str] = {}
    for spec, tool in zip(specs, tools):
        if tool.name in seen:
            raise ConfigError(f"rollout.multi_turn.tools: {spec!r} and {seen[tool.name]!r} are both named "
                              f"{tool.name!r}", hint="tool names must be unique (the model calls them by name)")
        seen[tool.name] = spec
    return tools


# --- running ---------------------------------------------------------------------------------------

@dataclass
class SampleTools:
    """One conversation's tool state: verl instances, its tools_kwargs, rewards so far, and its
    prompt's PIL images (a vision-language policy; verl's image tools read create_kwargs["image"])."""

    tools_kwargs: dict
    instances: dict = field(default_factory=dict)
    rewards: list = field(default_factory=list)
    images: list = field(default_factory=list)


class EventLoop:
    """One asyncio loop in a daemon thread: tools and interactions run there (verl's async
    objects keep their sessions on one loop), the rollout waits on the results."""

    def __init__(self, threads: int = 64):
        from concurrent.futures import ThreadPoolExecutor

        self.loop = asyncio.new_event_loop()
        # sync tools run here: enough threads that a turn's calls start at once (their time limit
        # counts from the start, so a call must not wait for a thread)
        self.loop.set_default_executor(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rlctl-tool"))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="rlctl-tools")
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class ToolRunner:
    def __init__(self, tools: list, *, timeout_s: float, max_chars: int = 100_000):
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema for t in tools]
        self.timeout_s, self.max_chars = timeout_s, max_chars

    async def call(self, name: str, arguments: dict, session: SampleTools) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolResult(f"error: unknown tool {name!r} (tools: {known})", error=True)
        try:
            result = await asyncio.wait_for(tool.call(arguments, session), self.timeout_s)
        except asyncio.TimeoutError:
            return ToolResult(f"error: {name} timed out after {self.timeout_s:g} s", error=True)
        except Exception as e:   # the tool's bug is the model's observation, not the run's crash
            return ToolResult(f"error: {name}: {type(e).__name__}: {e}", error=True)
        result.text = clean_text(result.text)[: self.max_chars]
        if result.reward is not None:
            session.rewards.append(float(result.reward))
        return result

    async def finish(self, session: SampleTools) -> None:
        """End of a conversation: verl tools' calc_reward (added to the sample's tool rewards) and release."""
        for tool in self.tools.values():
            try:
                reward = await asyncio.wait_for(tool.finish(session), self.timeout_s)
            except Exception:   # a failing release must not lose the rollout
                reward = None
            if reward is not None:
                session.rewards.append(reward)


def clean_text(text: str) -> str:
    """NFC-normalised text: what a tokenizer with an NFC normaliser (Qwen's) decodes back unchanged."""
    return unicodedata.normalize("NFC", text)
