"""The built-in agent `rollout.agent.function = "verifiers"`: each `verifiers/ID` row (rlctl data prep
verifiers:ID, rlctl.tasks.verifiers_env) is one episode of its verifiers environment, played by the
environment itself (its harness, tools, turns and rubric) against this episode's agent endpoint.

The model calls go through verifiers' train client (`TrainClientConfig`, as prime-rl trains): it renders
the chat to token ids with the renderers package over the policy's own tokenizer and posts them to the
endpoint's vLLM-style `/inference/v1/generate`, which samples from exactly those ids and records them
(rlctl.agent.engine). A later turn's prompt is the renderer's bridge of the earlier tokens plus the new
tool / user messages, so it continues the recorded tokens and the episode is one sequence: the trained
tokens are the sampled ones, the environment's messages are masked context. The episode's reward is
the sum of its trainable traces' weighted rubric rewards; each reward and metric is also logged
(agent/vf_<name>). An episode that errors, times out, records no reward or has a model call refused
(a prompt past the row's token budget) fails (agent/failed).

Rows of other sources in the same run (mixed data) get one chat completion of their prompt, scored by
rlctl's built-in scorer for their data_source, as a single-turn rollout would be.
"""

from __future__ import annotations

import json
import math

from rlctl.tasks.verifiers_env import PREFIX, load_env

NO_KEY_VAR = "RLCTL_AGENT_NO_KEY"   # verifiers reads a key from an environment variable: this unset one
MODEL = "policy"                  # the name GET /v1/models lists (rlctl.agent.endpoint.MODEL_NAME)
_ENVS: dict[str, object] = {}     # one loaded Env per environment config, for the process's life


def environment(config: dict):
    key = json.dumps(config, sort_keys=True)
    if key not in _ENVS:
        _ENVS[key] = load_env(config)
    return _ENVS[key]


def task_of(env, data: dict):
    """The row's task, rebuilt from its wire data as the taskset's own Task class."""
    cls = type(env.taskset).task_type()
    return cls(cls.data_type().model_validate(data), env.taskset.config.task)


def model_context(client, spec: dict, tokenizer: str | None):
    from verifiers.v1.clients import ModelContext, TrainClientConfig

    # The episode's own key goes in a header of its client config, not in os.environ: concurrent episodes
    # each have their own, and no key stays in the controller's environment.
    config = TrainClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=NO_KEY_VAR,
                               headers={"Authorization": f"Bearer {client.api_key}"},
                               renderer=spec.get("renderer"), renderer_model_name=tokenizer)
    return ModelContext(model=MODEL, client=config)


async def play(client, row: dict, *, tokenizer: str | None = None):
    """One verifiers Episode of a verifiers/ID row against the client's endpoint."""
    spec = json.loads(row["extra_info"]["verifiers"])
    env = environment(spec["config"])
    task = task_of(env, spec["task"])
    await known_context_length(client)
    async with env.serving():
        return await env.run_episode(task, model_context(client, spec, tokenizer))


async def known_context_length(client) -> None:
    """Tell the renderers package this episode's max_model_len before verifiers asks for it. Its first
    lookup per base URL (each episode has its own) takes a module-level asyncio.Lock, which binds to the
    event loop that first waits on it; rlctl's runner plays each rollout in a fresh loop, so a later
    rollout's lookup would fail with "bound to a different event loop". A known value skips the lock."""
    from renderers import client as renderers_client

    cards = (await client.models.list()).data
    length = next((c.to_dict().get("max_model_len") for c in cards if c.id == MODEL), None)
    base = str(client.base_url).rstrip("/")
    for url in (base, base + "/"):
        renderers_client._max_prompt_len_cache[(url, MODEL)] = length


def episode_result(episode) -> dict:
    """{"reward", "vf_<reward>", "vf_<metric>"}; raises (a failed episode) when it errored or gave no reward."""
    refused = [c.error for t in episode.traces for c in t.calls if c.error is not None]
    if refused:   # a model call the endpoint refused (the row's token budget, max_calls): verifiers ends the turn
        raise RuntimeError(f"a model call of the verifiers episode failed: {refused[0].message[:200]}")
    if not episode.ok:
        errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
        first = errors[0] if errors else None
        raise RuntimeError(f"the verifiers episode failed: {first.type}: {first.message[:200]}" if first
                           else "the verifiers episode did not complete")
    traces = [t for t in episode.traces if t.agent.trainable] or list(episode.traces)
    out, total, rewarded = {}, 0.0, False
    for trace in traces:
        for name, reward in trace.rewards.items():
            if reward is not None and math.isfinite(reward.score):
                out[f"vf_{name}"] = out.get(f"vf_{name}", 0.0) + float(reward.score)
                total, rewarded = total + reward.value, True
        out.update({f"vf_{k}": float(v) for k, v in trace.metrics.items() if isinstance(v, (int, float))})
    out["reward"] = total if rewarded else None
    return out


async def single_turn(client, row: dict) -> dict:
    """A row of rlctl's own tasks beside verifiers rows: one completion, rlctl's built-in score."""
    from rlctl.rewards.builtin import default_compute_score

    reply = await client.chat.completions.create(model=MODEL, messages=list(row["prompt"]))
    answer = reply.choices[0].message.content or ""
    score = default_compute_score(row["data_source"], answer, row["reward_model"]["ground_truth"],
                                  row.get("extra_info") or {})
    return {"reward": float(score["score"] if isinstance(score, dict) else score)}


def player():
    """This agent's function (its row of rlctl.rollouts.table.ENVIRONMENTS), once verifiers is importable."""
    from rlctl.tasks.verifiers_env import require_verifiers

    require_verifiers()
    return run


async def run(client, row: dict, *, tokenizer: str | None = None):
    if not str(row.get("data_source", "")).startswith(PREFIX):
        return await single_turn(client, row)
    return episode_result(await play(client, row, tokenizer=tokenizer))
