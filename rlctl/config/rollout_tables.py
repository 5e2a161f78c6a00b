"""The tables inside [rollout] that replace one-shot generation with a loop: multi-turn rollouts
(rlctl's own turn loop with tools and interactions) and agent programs (your loop, calling the policy
through an OpenAI-compatible endpoint).

Part of the schema (rlctl.config.schema re-exports each class); split out to keep modules small.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.config.fields import opt

TOOL_FORMATS = ("hermes",)   # rlctl.multiturn.formats.FORMATS, without importing it
BUILTIN_TOOLS = ("calculator", "python")   # rlctl.multiturn.builtin_tools.BUILTINS (a test keeps them equal)


@dataclass(frozen=True)
class MultiTurnConfig:
    enable: bool = opt(False, "Multi-turn rollouts: the model may call tools and answer an interaction over "
                              "several turns (docs/multi-turn.md).")
    max_turns: int = opt(4, "Assistant turns per sample at most.", ge=1)
    max_turn_length: int = opt(0, "Tokens per assistant turn at most (0 = what remains of "
                                  "data.max_response_length); a turn cut there is closed by the template, its "
                                  "end-of-turn token masked 0 (the model did not choose it).", ge=0)
    max_tool_response_length: int = opt(256, "Tokens of one tool or interaction answer at most (longer ones are "
                                             "cut, with a note saying so).", ge=1)
    tools: tuple = opt((), "Tools the model may call: built-ins \"calculator\", \"python\" (runs in rlctl's "
                           "sandbox), or \"file.py:name\" (a typed, documented function or a verl BaseTool-style "
                           "object; relative to rlctl.toml).")
    interaction: str = opt("", "\"file.py:name\": a function (messages, extra_info) -> {\"content\", \"done\", "
                               "\"score\"} or a verl BaseInteraction-style object, asked after every turn that "
                               "called no tool; or a dict of them by name, each row picking one with "
                               "extra_info.interaction_kwargs.name (empty = none).")
    tool_format: str = opt("hermes", "How the model writes tool calls (hermes: <tool_call>{json}</tool_call>, "
                                     "Qwen2.5/Qwen3).", choices=TOOL_FORMATS)
    tool_timeout_s: float = opt(10.0, "Seconds one tool call may take; a slower call answers \"error: timed out\".",
                                gt=0)


AGENT_REWARDS = ("agent", "scorer", "sum")   # rlctl.agent.rollout: where an episode's reward comes from


@dataclass(frozen=True)
class AgentConfig:
    function: str = opt("", "\"file.py:name\": an async function (client, row) -> reward, called once per episode "
                            "with an openai.AsyncOpenAI client for the episode's endpoint and the parquet row as a "
                            "dict; it returns a float or a dict with \"reward\" (docs/agents.md). \"verifiers\": "
                            "the built-in that plays verifiers/ID rows through their verifiers environment "
                            "(docs/environments.md).")
    command: tuple = opt((), "A process per episode instead of a function: argv, relative paths from rlctl.toml; "
                             "OPENAI_BASE_URL and OPENAI_API_KEY set, the row as JSON on stdin, the reward as the "
                             "last stdout line (a number or a JSON object with \"reward\").")
    max_calls: int = opt(16, "Model calls per episode at most; the call past it is refused (HTTP 429) and the "
                             "episode counts as failed.", ge=1)
    timeout_s: float = opt(300.0, "Seconds an episode may run; past it the agent is cancelled (a command killed) "
                                  "and the episode counts as failed.", gt=0)
    concurrency: int = opt(64, "Episodes running at once.", ge=1)
    reward: str = opt("agent", "The episode's reward: \"agent\" (what the agent returned), \"scorer\" "
                               "(reward.function, or the row's built-in by data_source, on the last answer) or "
                               "\"sum\" (both).", choices=AGENT_REWARDS)
    max_wait_s: float = opt(1.0, "Batching: calls wait until every running episode is waiting on the model, or "
                                 "this long after the first of them arrived, then generate together.", gt=0)
