"""A Responses-API agent on the agent endpoint: `client.responses.create` (and its stream) across two calls
with a function_call_output in between is recorded token-exactly as the same agent written with chat
completions: one merged sequence, the same tokens. The endpoint and policy are test_endpoint.py's (the
tiny tool model behind LocalTurns, real HTTP on loopback, the official `openai` client)."""

from __future__ import annotations

import json

import pytest
from test_endpoint import endpoint, play, policy  # noqa: F401  (fixtures)

from rlctl.agent.rollout import agent_metrics

RESPONSES_AGENTS = '''
import json

FLAT_CALC = json.loads(FLAT_CALC_JSON)

async def _create(client, stream, **kw):
    if not stream:
        return await client.responses.create(model="anything", **kw)
    async with client.responses.stream(model="anything", **kw) as events:
        return await events.get_final_response()

async def _play(client, row, stream):
    question = row["prompt"][-1]["content"]
    first = await _create(client, stream, input=question, tools=[FLAT_CALC], max_output_tokens=120)
    calls = [item for item in first.output if item.type == "function_call"]
    history = [{"role": "user", "content": question}, *[item.model_dump(exclude_none=True) for item in first.output]]
    for call in calls:
        history.append({"type": "function_call_output", "call_id": call.call_id,
                        "output": str(eval(json.loads(call.arguments)["expression"]))})
    final = await _create(client, stream, input=history, tools=[FLAT_CALC], max_output_tokens=16)
    return {"reward": float(final.output_text.strip() == row["reward_model"]["ground_truth"]),
            "tool_calls": float(len(calls))}

async def responses_agent(client, row):
    return await _play(client, row, stream=False)

async def responses_stream_agent(client, row):
    return await _play(client, row, stream=True)
'''


def flat_calculator() -> str:
    """The calculator the tool model learnt, in Responses' flat function-tool shape."""
    from transformers.utils import get_json_schema

    from rlctl.multiturn.builtin_tools import calculator

    return json.dumps({"type": "function", **get_json_schema(calculator)["function"]})


@pytest.mark.parametrize("agent", ["responses_agent", "responses_stream_agent"])
def test_a_responses_agent_merges_into_the_chat_agents_sequence(endpoint, agent):   # noqa: F811
    _, _, base = endpoint
    (base / "agents.py").write_text((base / "agents.py").read_text()
                                    + f"\nFLAT_CALC_JSON = {flat_calculator()!r}\n" + RESPONSES_AGENTS)
    eps = play(endpoint, agent)
    chat = play(endpoint, "tool_agent")
    for ep, twin in zip(eps, chat):
        assert ep.failure == "" and ep.reward == 1.0 and ep.metrics["tool_calls"] == 1.0
        assert len(ep.calls) == 2 and [c.merged for c in ep.calls] == [False, True]
        assert len(ep.sequences) == 1
        # token for token what the chat-completions agent recorded: prompt, samples, tool turn, mask
        seq, chat_seq = ep.sequences[0], twin.sequences[0]
        assert (seq.prompt_ids, seq.response_ids, seq.response_mask) == (
            chat_seq.prompt_ids, chat_seq.response_ids, chat_seq.response_mask)
        assert seq.log_probs == pytest.approx(chat_seq.log_probs, abs=1e-5)
    assert agent_metrics(eps)["agent/merged"] == 1.0
