"""Sealed episodes and requests that fail alone, on test_endpoint.py's endpoint (the tiny tool model behind
LocalTurns, real HTTP on loopback, the official `openai` client and httpx as agents use them).

An episode's calls are its own: a key and a never-reused tag per episode, a call of an ended episode
refused and never generated or recorded, max_calls counting the calls in flight. A bad request is a
4xx to that call; the agent's other calls, the other episodes and the next rollout go on."""

from __future__ import annotations

import json
import os
import queue
import threading

import numpy as np
import pytest
import torch
from test_endpoint import ROW, endpoint, policy  # noqa: F401  (fixtures)

from rlctl.agent.engine import AgentEngine, EngineLimits
from rlctl.agent.episodes import Episode
from rlctl.agent.runner import AgentRunner, LastLine, _take_result
from rlctl.api.requests import Request, SamplingParams
from rlctl.config.rollout_tables import AgentConfig

openai = pytest.importorskip("openai")

AGENTS = '''
import json, os, uuid
import httpx

async def keyed(client, row):
    """Notes the URL and key it was given, then makes one call."""
    with open(os.path.join(os.environ["SEEN_DIR"], uuid.uuid4().hex), "w") as f:
        json.dump([str(client.base_url), client.api_key], f)
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=2)
    return 1.0

BAD = {
    "out_of_vocab": {"token_ids": [1, 10**7]},
    "negative_id": {"token_ids": [-1]},
    "bool_id": {"token_ids": [True]},
    "stop_number": {"token_ids": [1, 2], "sampling_params": {"stop": 5}},
    "stop_list_of_numbers": {"token_ids": [1, 2], "sampling_params": {"stop": [1, 2]}},
    "too_many_stops": {"token_ids": [1, 2], "sampling_params": {"stop": ["x"] * 17}},
    "stop_id_out_of_vocab": {"token_ids": [1, 2], "sampling_params": {"stop_token_ids": [10**7]}},
    "max_tokens_bool": {"token_ids": [1, 2], "sampling_params": {"max_tokens": True}},
}

async def bad_requests(client, row):
    """Sends every kind of bad token request, then good calls; returns the statuses it got."""
    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + "/inference/v1/generate"
    headers = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
    statuses = {}
    async with httpx.AsyncClient(timeout=60) as http:
        for name, body in BAD.items():
            statuses[name] = (await http.post(url, content=json.dumps(body), headers=headers)).status_code
        deep = '{"token_ids": [1], "x": ' + "[" * 100 + "]" * 100 + "}"
        statuses["deep_json"] = (await http.post(url, content=deep, headers=headers)).status_code
        big = json.dumps({"token_ids": [1], "pad": "x" * (5 << 20)})
        statuses["big_body"] = (await http.post(url, content=big, headers=headers)).status_code
        good = await http.post(url, content=json.dumps({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}),
                               headers=headers)
        statuses["good"] = good.status_code
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=2)
    return {"reward": 1.0, **{k: float(v) for k, v in statuses.items()}}
'''


@pytest.fixture()
def agents(endpoint):  # noqa: F811
    (endpoint[2] / "seal_agents.py").write_text(AGENTS)
    return endpoint


def run_agents(endpoint, name: str, episodes: int) -> list[Episode]:  # noqa: F811
    engine, server, base = endpoint
    eps = [Episode(index=i, row=json.loads(json.dumps(ROW))) for i in range(episodes)]
    engine.begin(seed=0, mode="val")
    AgentRunner(AgentConfig(function=f"seal_agents.py:{name}"), base, server, engine).run(eps)
    assert engine.error is None
    return eps


def test_each_episode_gets_its_own_url_and_key_and_no_key_enters_the_environment(agents, tmp_path, monkeypatch):
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    monkeypatch.setenv("SEEN_DIR", str(seen_dir))
    engine = agents[0]
    for _ in range(2):   # two rollouts: a tag is never given twice
        eps = run_agents(agents, "keyed", 3)
        assert [(e.failure, len(e.calls)) for e in eps] == [("", 1)] * 3
    seen = [json.loads(p.read_text()) for p in seen_dir.iterdir()]
    urls, keys = {u for u, _ in seen}, {k for _, k in seen}
    assert len(seen) == len(urls) == len(keys) == 6
    assert not keys & set(os.environ.values()) and not any(k in v for k in keys for v in os.environ.values())
    generated = engine.generated_calls
    for url, key in seen:   # every one of them ended: refused, and nothing generated
        with pytest.raises(openai.APIStatusError) as gone:
            openai.OpenAI(base_url=url, api_key=key, max_retries=0).chat.completions.create(
                model="m", messages=ROW["prompt"], max_tokens=2)
        assert gone.value.status_code == 410
    assert engine.generated_calls == generated


def test_a_bad_request_is_refused_alone_and_the_rollouts_go_on(agents):
    """An out-of-vocabulary id or a non-string stop on the token endpoint used to reach the policy and end
    the run (exit 4): now each is a 400 to its call, and the same episode's good calls are answered."""
    eps = run_agents(agents, "bad_requests", 2)
    for ep in eps:
        assert ep.failure == "" and ep.reward == 1.0 and len(ep.calls) == 2, ep.failure
        statuses = dict(ep.metrics)
        assert statuses.pop("big_body") == 413 and statuses.pop("good") == 200
        assert set(statuses.values()) == {400}, statuses
    again = run_agents(agents, "bad_requests", 1)   # the next rollout too
    assert again[0].reward == 1.0


class GatedTurns:
    """The real LocalTurns, holding each generation until the test lets it go (to act while a call is
    being generated)."""

    def __init__(self, turns):
        self.turns, self.world_size = turns, turns.world_size
        self.started, self.release = threading.Event(), threading.Event()

    def generate_turn(self, *args, **kwargs):
        self.started.set()
        assert self.release.wait(60)
        return self.turns.generate_turn(*args, **kwargs)


@pytest.fixture()
def gated(policy):  # noqa: F811
    _, tok, turns, eos, pad = policy
    gate = GatedTurns(turns)
    engine = AgentEngine(gate, tok, limits=EngineLimits(1024, 256, 2, 30.0), eos_ids=eos, pad_id=pad)
    engine.begin(seed=0, mode="val")
    yield engine, gate, engine.encode_chat(ROW["prompt"])
    gate.release.set()
    engine.stop()


def _call(engine, tag: str, prompt: list[int]) -> Request:
    request = Request(list(prompt), SamplingParams(max_tokens=2), queue.Queue(), tag=tag)
    assert engine.submit(request)
    return request


def test_max_calls_counts_the_calls_being_generated(gated):
    engine, gate, prompt = gated   # max_calls = 2
    ep = Episode(index=0, row=ROW)
    with engine.lock:
        engine.open("a", ep)
    first = _call(engine, "a", prompt)
    assert gate.started.wait(30)   # the first call is being generated, not yet recorded
    second, third = _call(engine, "a", prompt), _call(engine, "a", prompt)
    refused = third.events.get(timeout=10)
    assert (refused.status, ep.failure) == (429, "max_calls")
    gate.release.set()
    assert first.events.get(timeout=60).error is None and second.events.get(timeout=60).error is None
    assert len(ep.calls) == 2


def test_an_ended_episodes_calls_are_dropped_waiting_or_being_generated(gated):
    engine, gate, prompt = gated   # max_wait_s = 30: a call waits for the other running episode
    ended, other = Episode(index=0, row=ROW), Episode(index=1, row=ROW)
    with engine.lock:
        engine.open("ended", ended)
        engine.open("other", other)
    waiting = _call(engine, "ended", prompt)
    with engine.lock:
        engine.close("ended")
    assert waiting.events.get(timeout=10).status == 410
    sampled = _call(engine, "other", prompt)
    assert gate.started.wait(30)   # "other" is the only running episode: its call is being generated
    with engine.lock:
        engine.close("other")
    gate.release.set()
    assert sampled.events.get(timeout=60).status == 410
    assert ended.calls == other.calls == [] and engine.generated_calls == 0


@pytest.mark.parametrize("result, reward, failure", [
    (np.float32(0.5), 0.5, ""), (torch.tensor(0.25), 0.25, ""), (np.int64(2), 2.0, ""),
    ({"reward": torch.tensor(1.0, requires_grad=True), "tries": np.int32(3)}, 1.0, ""),
    (float("inf"), None, "returned reward inf"), (np.float64("nan"), None, "returned reward nan"),
    (torch.tensor(float("-inf")), None, "returned reward -inf"),
    (np.bool_(True), None, f"returned a {type(np.bool_(True)).__name__} as its reward, not a number"),
    (torch.tensor([1.0, 2.0]), None, "returned a Tensor as its reward, not a number"),
])
def test_numpy_and_torch_scalar_rewards_count_and_non_finite_ones_fail(result, reward, failure):
    ep = Episode(index=0, row=ROW)
    _take_result(ep, result)
    assert (ep.reward, ep.failure) == (reward, failure)
    if isinstance(result, dict):
        assert ep.metrics == {"tries": 3.0}


def test_a_commands_stdout_is_read_in_bounded_memory():
    """However much a command prints, the reader holds the line being read and the last whole one, each
    at most `limit` bytes: 16 MiB of output in 64 KiB chunks, with a 6 MiB line among them."""
    limit, held = 1 << 10, []
    out = LastLine(limit)
    text = b"".join([b"noise %d\n" % i for i in range(200_000)] + [b"x" * (6 << 20), b"\n", b"\n",
                                                                  b'{"reward": 0.5}\n', b"  \n"])
    for start in range(0, len(text), 1 << 16):
        out.feed(text[start:start + (1 << 16)])
        held.append(out.held())
    out.close()
    assert max(held) <= 2 * limit
    assert (out.last, out.last_cut) == (b'{"reward": 0.5}', False)
    long = LastLine(limit)
    long.feed(b"1.0\n" + b"y" * (3 << 20))   # a last line with no newline, past the limit
    long.close()
    assert long.last == b"y" * limit and long.last_cut and long.held() <= limit


def test_the_verifiers_agent_sends_its_episodes_key_without_the_environment():
    """verifiers' train client reads a key from an environment variable; concurrent episodes each have
    their own, so the key goes in the client config's header and os.environ is left alone."""
    pytest.importorskip("verifiers.v1", reason="rlctl[envs] is not installed (pip install -e '.[envs]')")
    from verifiers.v1.clients.base import build_async_openai

    from rlctl.agent.verifiers_agent import model_context

    before = dict(os.environ)
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/e/tag/v1", api_key="rlctl-episode-key")
    context = model_context(client, {}, None)
    assert dict(os.environ) == before
    sent = build_async_openai(context.client)   # the client verifiers builds from that config
    assert sent.default_headers["Authorization"] == "Bearer rlctl-episode-key"
