"""The agent endpoint with real HTTP and the official `openai` client on loopback, over the real hf engine.

The policy is the tool-calling tiny model (tests/support/tool_model.py: it has memorised "What is 2 + 2?"
-> a calculator call -> the tool's answer -> "4"), loaded in this process behind `LocalTurns`, the
turn generator `rlctl eval` uses; nothing is mocked. Each test plays agents written in a temporary
file, as a user's would be, through rlctl.agent's runner.
"""

from __future__ import annotations

import json
import platform
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from rlctl.agent.engine import AgentEngine, EngineLimits
from rlctl.agent.endpoint import AgentServer
from rlctl.agent.episodes import CONTEXT_LENGTH, Episode
from rlctl.agent.failures import CONTEXT_REASON, failure_text
from rlctl.agent.rollout import agent_metrics
from rlctl.agent.runner import AgentRunner
from rlctl.config.rollout_tables import AgentConfig

openai = pytest.importorskip("openai")
# the client's headers name the processor: platform runs `uname -p` once per process and caches it; run
# it here, at collection, so the tests themselves start no process (the fast tier's rule)
platform.processor()

ROW = {"data_source": "t", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
       "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {}}

AGENTS = '''
import asyncio, json, math

CALC = json.loads(CALC_JSON)

async def tool_agent(client, row):
    """A tool call in OpenAI's format, the tool's answer, the final answer."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(model="anything", messages=messages, tools=[CALC], max_tokens=120)
    msg = first.choices[0].message
    calls = msg.tool_calls or []
    messages.append({"role": "assistant", "content": msg.content or "",
                     "tool_calls": [c.model_dump() for c in calls]})
    for c in calls:
        expr = json.loads(c.function.arguments)["expression"]
        messages.append({"role": "tool", "tool_call_id": c.id, "content": str(eval(expr))})
    final = await client.chat.completions.create(model="anything", messages=messages, tools=[CALC], max_tokens=16)
    answer = final.choices[0].message.content or ""
    return {"reward": float(answer.strip() == row["reward_model"]["ground_truth"]), "tool_calls": float(len(calls))}

async def rewriting_agent(client, row):
    """Its second call drops the history: its own sequence."""
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=4)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], max_tokens=4)
    return 1.0

async def raising(client, row):
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=2)
    raise RuntimeError("agent bug")

async def hanging(client, row):
    await asyncio.sleep(60)

async def nan_reward(client, row):
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=2)
    return math.nan

async def flooding(client, row):
    while True:
        await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=1)

async def no_reward(client, row):
    return {"score": 1.0}

async def too_long(client, row):
    """A prompt longer than a row holds (data.max_prompt_length + data.max_response_length): a 400."""
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "pad " * 2000}],
                                         max_tokens=2)
    return 1.0
'''


def calculator_schema() -> str:
    """The built-in calculator's schema, as the tool model learnt it (rendered into the prompt)."""
    from transformers.utils import get_json_schema

    from rlctl.multiturn.builtin_tools import calculator

    return json.dumps(get_json_schema(calculator))


@pytest.fixture(scope="module")
def policy(tool_model_dir):
    from rlctl.serve.eval_turns import LocalTurns
    from rlctl.serve.source import load_model
    from rlctl.workers.compute.models import eos_token_ids

    model, tok = load_model(tool_model_dir, "float32")
    eos = eos_token_ids(str(tool_model_dir), tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    return model, tok, LocalTurns(model, pad_token_id=pad, eos_token_ids=eos, temperature=0.0), eos, pad


@pytest.fixture()
def endpoint(policy, tmp_path):
    _, tok, turns, eos, pad = policy
    engine = AgentEngine(turns, tok, limits=EngineLimits(1024, 256, 4, 1.0), eos_ids=eos, pad_id=pad)
    server = AgentServer(engine)
    (tmp_path / "agents.py").write_text(f"CALC_JSON = {calculator_schema()!r}\n" + AGENTS)
    yield engine, server, tmp_path
    server.close()


def play(endpoint, name: str, episodes: int = 2, **limits) -> list[Episode]:
    engine, server, base = endpoint
    eps = [Episode(index=i, row=json.loads(json.dumps(ROW))) for i in range(episodes)]
    engine.begin(seed=0, mode="val")
    AgentRunner(AgentConfig(function=f"agents.py:{name}", **limits), base, server, engine).run(eps)
    assert engine.error is None
    return eps


def test_tool_call_episode_is_one_sequence_with_the_tool_answer_masked(endpoint, policy):
    eps = play(endpoint, "tool_agent")
    for ep in eps:
        assert ep.failure == "" and ep.reward == 1.0 and ep.metrics["tool_calls"] == 1.0
        assert len(ep.calls) == 2 and [c.merged for c in ep.calls] == [False, True]
        assert len(ep.sequences) == 1
        seq = ep.sequences[0]
        first, second = ep.calls
        # the second call's prompt = the first call's tokens + the tool turn; only sampled tokens are 1
        context = second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids):]
        assert seq.prompt_ids == first.prompt_ids
        assert seq.response_ids == first.completion_ids + context + second.completion_ids
        assert seq.response_mask == [1] * len(first.completion_ids) + [0] * len(context) + [1] * len(second.completion_ids)
        _, tok, *_ = policy
        assert "4" in tok.decode(context)   # the tool's answer is in the masked part
    assert agent_metrics(eps)["agent/merged"] == 1.0


def test_recorded_tokens_are_the_engines_samples_and_log_probs_the_trainers(endpoint, policy):
    model, _, turns, _, pad = policy
    ep = play(endpoint, "tool_agent", episodes=1)[0]
    first = ep.calls[0]
    # the same prompt through the engine directly, greedy: the same tokens
    from rlctl.runtime.batch import Batch

    ids = np.asarray([first.prompt_ids], np.int64)
    out = turns.generate_turn(Batch({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                     "max_new_tokens": np.asarray([120])}), seed=0, n=1, width=120)
    assert out["responses"][0, :out["response_length"][0]].tolist() == first.completion_ids
    # the trainer's log-probs of the merged sequence (one forward) equal the engine's recorded ones
    seq = ep.sequences[0]
    with torch.no_grad():
        logits = model(torch.tensor([seq.tokens])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(seq.prompt_ids) - 1:-1].gather(
        -1, torch.tensor(seq.response_ids)[:, None])[:, 0]
    sampled = torch.tensor(seq.response_mask, dtype=torch.bool)
    recorded = torch.tensor(seq.log_probs)[sampled]
    assert torch.allclose(lp[sampled], recorded, atol=1e-3), (lp[sampled] - recorded).abs().max()


def test_a_history_rewriting_agent_splits_into_counted_rows(endpoint):
    eps = play(endpoint, "rewriting_agent")
    for ep in eps:
        assert [c.merged for c in ep.calls] == [False, False] and len(ep.sequences) == 2
    metrics = agent_metrics(eps)
    assert metrics["agent/merged"] == 0.0 and metrics["agent/sequences"] == 2.0


@pytest.mark.parametrize("name, limits, failure", [
    ("raising", {}, "raised RuntimeError: agent bug"),
    ("hanging", {"timeout_s": 1.0}, "timeout"),
    ("nan_reward", {}, "returned reward nan"),
    ("flooding", {}, "max_calls"),   # the endpoint's limit: EngineLimits(max_calls=4)
    ("no_reward", {}, "returned no reward"),
])
def test_failing_agents_are_contained_and_counted(endpoint, name, limits, failure):
    eps = play(endpoint, name, **limits)
    assert all(ep.failure == failure for ep in eps), [ep.failure for ep in eps]
    assert agent_metrics(eps)["agent/failed"] == 1.0
    if name == "flooding":
        assert all(len(ep.calls) == 4 for ep in eps)


def test_a_call_too_long_for_its_row_fails_its_episode_with_the_keys_to_raise(endpoint):
    for ep in play(endpoint, "too_long"):
        assert ep.failure.startswith("raised BadRequestError") and ep.refused == CONTEXT_LENGTH
        assert failure_text(ep.failure, ep.refused).startswith(CONTEXT_REASON)


def test_each_episode_has_its_own_key_and_an_ended_one_is_gone(endpoint):
    engine, server, _ = endpoint
    assert server.server_address[0] == "127.0.0.1"
    tags = [server.new_tag() for _ in range(2)]
    eps = [Episode(index=0, row=ROW) for _ in tags]
    with engine.lock:
        for tag, ep in zip(tags, eps):
            engine.open(tag, ep)
    url = server.base_url(tags[0]) + "/chat/completions"
    body = json.dumps({"model": "x", "messages": ROW["prompt"], "max_tokens": 2}).encode()
    for key in (None, "wrong", server.key(tags[1])):   # none, a made-up one, the other live episode's
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, body, headers=headers), timeout=30)
        assert e.value.code == 401
    client = openai.OpenAI(base_url=server.base_url(tags[0]), api_key=server.key(tags[0]), max_retries=0)
    assert client.models.list().data[0].model_extra["max_model_len"] == 1024 + 256
    with engine.lock:
        engine.close(tags[0])
    with pytest.raises(openai.APIStatusError) as gone:   # its own key, after its episode ended
        client.chat.completions.create(model="x", messages=ROW["prompt"], max_tokens=2)
    assert gone.value.status_code == 410 and not eps[0].calls and engine.generated_calls == 0
    with pytest.raises(openai.APIStatusError) as gone:
        client.models.list()
    assert gone.value.status_code == 410


def test_token_endpoint_merges_exactly_and_stream_and_stop_work(endpoint, policy):
    engine, server, _ = endpoint
    _, tok, *_ = policy
    ep = Episode(index=0, row=ROW)
    engine.begin(seed=0, mode="val")
    tag = server.new_tag()
    with engine.lock:
        engine.open(tag, ep)
    prompt = engine.encode_chat(ROW["prompt"])
    url = f"http://127.0.0.1:{server.port}/e/{tag}/inference/v1/generate"

    def generate(ids: list[int]) -> dict:
        body = json.dumps({"token_ids": ids, "sampling_params": {"max_tokens": 8}}).encode()
        request = urllib.request.Request(url, body, headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {server.key(tag)}"})
        return json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]

    one = generate(prompt)
    content = one["logprobs"]["content"]   # vLLM's shape: one {"token": "token_id:<id>", "logprob"} per token
    assert len(one["token_ids"]) == len(content) > 0
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in one["token_ids"]]
    assert [c["logprob"] for c in content] == ep.calls[0].log_probs
    extra = tok("\nuser says hi", add_special_tokens=False)["input_ids"]
    two = generate(prompt + one["token_ids"] + extra)
    assert [c.merged for c in ep.calls] == [False, True]
    assert ep.sequences[0].response_mask == [1] * len(one["token_ids"]) + [0] * len(extra) + [1] * len(two["token_ids"])
    client = openai.OpenAI(base_url=server.base_url(tag), api_key=server.key(tag), max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=ROW["prompt"], max_tokens=8, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == tok.decode(ep.calls[-1].completion_ids, skip_special_tokens=True)
    stop = streamed[2:4] if len(streamed) >= 4 else None
    if stop:
        cut = client.chat.completions.create(model="m", messages=ROW["prompt"], max_tokens=8, stop=[stop])
        assert cut.choices[0].message.content == streamed[:streamed.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_a_too_large_body_names_what_sets_the_limit():
    """The 413 says where its limit comes from: `rlctl serve --max-body-bytes` on the server, a fixed
    limit on the agent endpoint (which has no such flag: naming it there sent users looking for one)."""
    from rlctl.api.guards import too_large
    from rlctl.api.http import OpenAIServer

    assert "--max-body-bytes" in too_large(10, 5, OpenAIServer.body_limit_source).message
    agent = too_large(10, 5, AgentServer.body_limit_source).message
    assert "agent endpoint" in agent and "--max-body-bytes" not in agent
