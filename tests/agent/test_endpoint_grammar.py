"""Forced tool calls and structured output through the agent endpoint (real HTTP, the official `openai`
client, the real hf engine behind `LocalTurns`): an agent that sends tool_choice="required", a named
function and a json_schema response_format, as pydantic-ai and smolagents do, gets answers that parse,
and its calls are recorded token-exactly with the log-probs of the masked distribution they were drawn from."""

from __future__ import annotations

import json
import platform

import jsonschema
import numpy as np
import pytest
import torch

from rlctl.agent.engine import AgentEngine, EngineLimits
from rlctl.agent.endpoint import AgentServer
from rlctl.agent.episodes import Episode
from rlctl.agent.runner import AgentRunner
from rlctl.config.rollout_tables import AgentConfig
from rlctl.runtime.batch import Batch, object_array
from rlctl.workers.rollout.grammar import GrammarCompiler, constrained, vocab_size_of

pytest.importorskip("openai")
platform.processor()   # the client's headers run `uname -p` once: at collection, not in a test

ROW = {"data_source": "t", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
       "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {}}
# every value bounded (enums, booleans, a short string), so even greedy decoding of a model that never
# saw this tool ends the call
LOOKUP = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]},
                                           "metric": {"type": "boolean"}, "note": {"type": "string", "maxLength": 6}},
          "required": ["city", "metric", "note"]}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["4", "5"]}}, "required": ["answer"]}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}},
         {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]

AGENT = '''
import json, jsonschema

PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

def valid(instance, schema):
    try:
        jsonschema.validate(instance, schema)
        return 1.0
    except jsonschema.ValidationError:
        return 0.0

async def structured_agent(client, row):
    """A forced call, a named call, then a structured final answer; each scored by its schema."""
    scores = {}
    for key, choice in (("required", "required"), ("named", {"type": "function", "function": {"name": "lookup"}})):
        out = await client.chat.completions.create(model="m", messages=row["prompt"], tools=TOOLS,
                                                   tool_choice=choice, max_tokens=120)
        call = out.choices[0].message.tool_calls[0].function
        right = out.choices[0].finish_reason == "tool_calls" and (key == "required" or call.name == "lookup")
        scores[key] = float(right) * valid(json.loads(call.arguments), PARAMS[call.name])
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    final = await client.chat.completions.create(model="m", messages=row["prompt"], response_format=fmt,
                                                 max_tokens=60)
    scores["final"] = valid(json.loads(final.choices[0].message.content), ANSWER)
    return {"reward": min(scores.values()), **scores}
'''


@pytest.fixture(scope="module")
def policy(tool_model_dir):
    from rlctl.serve.eval_turns import LocalTurns
    from rlctl.serve.source import load_model
    from rlctl.workers.compute.models import eos_token_ids

    model, tok = load_model(tool_model_dir, "float32")
    eos = eos_token_ids(str(tool_model_dir), tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    return model, tok, LocalTurns(model, pad_token_id=pad, eos_token_ids=eos, temperature=0.0, tokenizer=tok), eos, pad


@pytest.fixture(scope="module")
def episodes(policy, tmp_path_factory):
    _, tok, turns, eos, pad = policy
    base = tmp_path_factory.mktemp("agent")
    (base / "agents.py").write_text(f"TOOLS = {TOOLS!r}\nANSWER = {ANSWER!r}\n" + AGENT)
    engine = AgentEngine(turns, tok, limits=EngineLimits(1024, 512, 4, 1.0), eos_ids=eos, pad_id=pad)
    server = AgentServer(engine)
    eps = [Episode(index=i, row=json.loads(json.dumps(ROW))) for i in range(2)]
    try:
        engine.begin(seed=0, mode="val")
        AgentRunner(AgentConfig(function="agents.py:structured_agent"), base, server, engine).run(eps)
        assert engine.error is None
    finally:
        server.close()
    return eps


def test_forced_and_structured_answers_parse_and_follow_their_schemas(episodes):
    for ep in episodes:
        assert ep.failure == "" and len(ep.calls) == 3, ep.failure
        assert ep.metrics == {"required": 1.0, "named": 1.0, "final": 1.0} and ep.reward == 1.0


def test_a_forced_call_is_recorded_token_exactly_with_its_masked_log_probs(episodes, policy):
    model, tok, turns, eos, _ = policy
    named = episodes[0].calls[1]
    spec = json.dumps({"type": "tool_call", "tools": [{"name": "lookup", "parameters": LOOKUP}]},
                      separators=(",", ":"))
    ids = np.asarray([named.prompt_ids], np.int64)
    out = turns.generate_turn(Batch({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                     "max_new_tokens": np.asarray([120]), "grammar": object_array([spec])}),
                              seed=0, n=1, width=120)
    assert out["responses"][0, :out["response_length"][0]].tolist() == named.completion_ids
    with torch.no_grad():
        logits = model(torch.tensor([named.prompt_ids + named.completion_ids])).logits[0, len(named.prompt_ids) - 1:-1]
    own = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(named.completion_ids)[:, None])[:, 0]
    # recorded: the log-prob under the masked, renormalised distribution each token was drawn from (as
    # vLLM reports it); the trainer's own is lower by log Z, the mass the grammar left allowed
    matcher = GrammarCompiler(tok, vocab_size_of(model), eos).matcher(spec)
    masked = []
    for row, token in zip(logits, named.completion_ids):
        masked.append(float(torch.log_softmax(constrained(row[None].float(), [matcher]), -1)[0, token]))
        assert matcher.accept_token(token)
    assert torch.allclose(torch.tensor(named.log_probs), torch.tensor(masked), atol=1e-4)
    gap = torch.tensor(masked) - own
    assert bool((gap >= -1e-5).all()) and float(gap.max()) > 0.1
