"""rlctl's verifiers Env for OpenEnv servers: verifiers' own `openenv` taskset (its tasks: one per
`resets` entry, each with the server's `base_url`) played by this Env instead of verifiers 0.4.0's
OpenEnvEnv, which reads a private attribute (`GenericEnvClient._base_url`) that openenv-core 0.3 does
not have and so fails every episode. `rlctl data prep verifiers:openenv` names this Env in the rows'
config (env id "rlctl.tasks.openenv_verifiers"); verifiers imports it by that id.

An episode: reset the environment (the task's reset arguments), then, until the environment says
done: the observation is the user turn (the first also shows the action's JSON schema), the model's reply is the action
(a JSON object, or the bare value when the action has a single required field), one step. The steps'
rewards are summed as the trace's `openenv_reward`; `openenv_steps` counts the steps. Only a running
server is played (`base_url`): start the OpenEnv server first (`uv run server`, `docker run`, ...).
"""

from __future__ import annotations

import json

import httpx
import verifiers.v1 as vf
from verifiers.v1.tasksets.openenv.taskset import OpenEnvData

__all__ = ["RlctlOpenEnv", "RlctlOpenEnvConfig"]
ENV_ID = __name__


class RlctlOpenEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    max_steps: int = 32
    """Steps at most per episode, in case the environment never says done."""


def to_action(reply: str, schema: dict) -> dict:
    """The model's reply as an action: a JSON object as it is, else the value of the one required field."""
    text = reply.strip()
    if text.startswith("```") and text.endswith("```"):
        text = "\n".join(text.splitlines()[1:-1]).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    if isinstance(value, dict):
        return value
    required = schema.get("required") or []
    if len(required) != 1:
        raise ValueError(f"the reply is not a JSON action object and the action has {len(required)} required "
                         f"fields: {text[:80]!r}")
    return {required[0]: text}


def user_turn(observation: dict, schema: dict | None = None) -> str:
    """The first turn shows the action's schema with the observation; later turns the observation alone
    (the schema stays in the context above, and repeating it would cost its tokens every turn)."""
    turn = {"observation": observation, "action_schema": schema} if schema is not None else {"observation": observation}
    return json.dumps(turn, ensure_ascii=False)


class RlctlOpenEnv(vf.Env[RlctlOpenEnvConfig]):
    async def run(self, task, agents) -> None:
        from openenv import GenericEnvClient

        data: OpenEnvData = task.data
        if not data.base_url:
            raise ValueError("rlctl plays OpenEnv servers that already run: pass base_url in --args (start the "
                             "server first), not env")
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.get(f"{data.base_url.rstrip('/')}/schema")
            response.raise_for_status()
        schema = response.json()["action"]
        total, steps = 0.0, 0
        async with GenericEnvClient(base_url=data.base_url) as client:
            result = await client.reset(**data.reset)
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn(user_turn(result.observation, schema))
                while not segment.terminated and not result.done and steps < self.config.max_steps:
                    reply = segment.last_reply.strip()
                    if not reply:
                        interaction.trace.stop("empty_action")
                        break
                    result = await client.step(to_action(reply, schema))
                    steps += 1
                    total += float(result.reward or 0.0)
                    if result.done:
                        break
                    segment = await interaction.turn(user_turn(result.observation))
        interaction.trace.record_reward("openenv_reward", total)
        interaction.trace.record_metric("openenv_steps", float(steps))
