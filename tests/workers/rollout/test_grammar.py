"""Grammar masks (rlctl.workers.rollout.grammar) on the tiny byte-level tokenizer: free rows keep their
very logits, constrained rows can only write their grammar, and what they write parses."""

from __future__ import annotations

import json

import pytest
import torch

from rlctl.workers.rollout import grammar

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def compiler(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tok, grammar.GrammarCompiler(tok, 260, [tok.eos_token_id])


def _decode_under(compiler, spec: dict, seed: int, steps: int = 300) -> str:
    """Sample a random walk over the vocabulary under `spec` until it writes EOS."""
    tok, comp = compiler
    matcher = comp.matcher(json.dumps(spec))
    gen, out = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        logits = grammar.constrained(torch.randn(1, 260, generator=gen), [matcher])
        token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        grammar.accept([matcher], [token])
        if token == tok.eos_token_id:
            return tok.decode(out)
        out.append(token)
    raise AssertionError(f"no EOS within {steps} tokens: {tok.decode(out)!r}")


def test_free_rows_keep_their_logits_and_constrained_rows_are_masked(compiler):
    tok, comp = compiler
    logits = torch.randn(3, 260)
    assert grammar.constrained(logits, [None, None, None]) is logits
    masked = grammar.constrained(logits, [None, comp.matcher('{"type":"json_object"}'), None])
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    assert masked[1].isfinite().nonzero().flatten().tolist() == [tok.convert_tokens_to_ids("{")]


def test_random_walks_under_a_tool_grammar_write_a_valid_call(compiler):
    params = {"type": "object", "properties": {"n": {"type": "integer"}, "word": {"type": "string", "maxLength": 5}},
              "required": ["n", "word"]}
    spec = {"type": "tool_call", "tools": [{"name": "f", "parameters": params}, {"name": "g", "parameters": None}]}
    for seed in range(8):
        text = _decode_under(compiler, spec, seed)
        assert text.startswith(grammar.CALL_OPEN) and text.endswith(grammar.CALL_CLOSE)
        call = json.loads(text[len(grammar.CALL_OPEN):-len(grammar.CALL_CLOSE)])   # strict: no raw control bytes
        assert call["name"] in ("f", "g") and isinstance(call["arguments"], dict)
        if call["name"] == "f":
            assert set(call["arguments"]) == {"n", "word"} and len(call["arguments"]["word"]) <= 5


def test_a_schema_the_library_cannot_follow_is_a_value_error():
    with pytest.raises(ValueError):
        grammar.build_grammar(json.dumps({"type": "json_schema", "schema": {"$ref": "#/nowhere"}}))


def test_a_token_outside_the_grammar_is_an_error(compiler):
    _, comp = compiler
    matcher = comp.matcher('{"type":"json_object"}')
    with pytest.raises(RuntimeError, match="outside its row's grammar"):
        grammar.accept([matcher], [ord("x")])
