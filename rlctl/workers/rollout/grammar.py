"""Grammar-constrained decoding: forced tool calls and JSON output, decoded so the answer parses.

A constraint travels with its request or row as a JSON spec (rlctl.api.constraints builds it):

    {"type": "json_object"}                      any JSON object
    {"type": "json_schema", "schema": {...}}     JSON valid for that schema
    {"type": "tool_call", "tools": [{"name", "parameters"}, ...]}
        one hermes call of one of the tools, `<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>`,
        A valid for N's parameters (the form the chat template renders and the hermes parser reads)

Each decode step, every constrained row's matcher writes its bitmask of allowed tokens (int32
[ceil(V / 32)]), the row's logits outside it become -inf, the row samples, and its matcher accepts
the token. Once the grammar is complete only the EOS ids are allowed, so the row ends itself.
Rows without a constraint are not touched (their logits are the very tensor they had).

xgrammar (what vLLM and SGLang use) builds the masks: it runs on CPU, a mask costs tens of
microseconds per row (docs/benchmarks.md), and a spec's grammar is the same one vLLM compiles, so
both engines accept the same outputs. JSON is written compactly (`", "` and `": "`, json.dumps'
defaults, as the chat templates render calls): free whitespace lets a weak model loop on spaces.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch
    import xgrammar

CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
# xgrammar 0.2.8 writes a string with minLength / maxLength as `[^"\\\r\n]{m,n}`, which lets raw control
# characters in (JSON forbids them: json.loads refuses the answer); its other strings exclude \0-\x1f
_LOOSE_CHAR, _JSON_CHAR = r'[^\"\\\r\n]', r'[^\0-\x1f\"\\]'
_CACHED = 64   # compiled grammars kept per compiler (an agent run repeats a handful of specs)


def build_grammar(spec: str) -> "xgrammar.Grammar":
    """The xgrammar Grammar of a spec (see the module doc); raises ValueError when a schema is not
    one xgrammar can follow."""
    import xgrammar as xgr

    s = json.loads(spec)
    try:
        if s["type"] == "json_object":
            return _json(xgr, {"type": "object"}, strict=False)
        if s["type"] == "json_schema":
            return _json(xgr, s["schema"])
        if s["type"] == "tool_call":
            calls = [_json(xgr, _call_schema(t["name"], t.get("parameters"))) for t in s["tools"]]
            return xgr.Grammar.concat(_literal(xgr, CALL_OPEN), xgr.Grammar.union(*calls),
                                      _literal(xgr, CALL_CLOSE))
    except RuntimeError as e:   # xgrammar's conversion errors name the schema part it cannot follow
        raise ValueError(str(e).strip().splitlines()[-1]) from None
    raise ValueError(f"unknown grammar spec type {s.get('type')!r}")


def _json(xgr, schema: dict, strict: bool = True):
    # strict: no properties or items beyond the schema's (xgrammar's default, as in vLLM); any JSON
    # object (json_object mode, a tool without parameters) takes any properties
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=strict)
    ebnf = str(grammar)
    return xgr.Grammar.from_ebnf(ebnf.replace(_LOOSE_CHAR, _JSON_CHAR)) if _LOOSE_CHAR in ebnf else grammar


def _call_schema(name: str, parameters: dict | None) -> dict:
    arguments = parameters if parameters else {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"]}


def _literal(xgr, text: str):
    return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


def vocab_size_of(model) -> int:
    """The width of the model's logits (its output embedding's rows; may exceed the tokenizer's)."""
    return int(model.get_output_embeddings().weight.shape[0])


class GrammarCompiler:
    """Compiles specs for one tokenizer and vocabulary (the logits' width), keeping the last few.

    eos_ids are the tokens that end a row: the only ones allowed once a grammar is complete."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        import xgrammar as xgr

        self.vocab_size, self.eos_ids = int(vocab_size), [int(e) for e in eos_ids]
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.eos_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._compiled: OrderedDict[str, object] = OrderedDict()

    def matcher(self, spec: str) -> "xgrammar.GrammarMatcher":
        """A fresh matcher (one row's state) for `spec`."""
        import xgrammar as xgr

        compiled = self._compiled.pop(spec, None)
        if compiled is None:
            compiled = self._compiler.compile_grammar(build_grammar(spec))
        self._compiled[spec] = compiled
        while len(self._compiled) > _CACHED:
            self._compiled.popitem(last=False)
        return xgr.GrammarMatcher(compiled, override_stop_tokens=self.eos_ids)


def constrained(logits: "torch.Tensor", matchers: Sequence) -> "torch.Tensor":
    """logits [B, V] with each constrained row's disallowed tokens at -inf, as a new tensor;
    `logits` itself when no row has a matcher (matchers[b] None = row b is free)."""
    rows = [b for b, m in enumerate(matchers) if m is not None and not m.is_terminated()]
    if not rows:
        return logits
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(matchers), logits.shape[-1])
    for b in rows:
        matchers[b].fill_next_token_bitmask(bitmask, b)
    out = logits.clone()
    xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=rows)
    return out


def accept(matchers: Sequence, tokens: Sequence[int]) -> None:
    """Advance each constrained row's matcher by the token it sampled."""
    for m, token in zip(matchers, tokens):
        if m is not None and not m.is_terminated() and not m.accept_token(int(token)):
            raise RuntimeError(f"token {int(token)} was sampled outside its row's grammar")


def grammar_args(batch) -> dict:
    """generate()'s `grammars` from a generate_turn batch's optional `grammar` column (one spec per
    row, "" for none: rlctl.agent.engine); {} when the caller constrains nothing."""
    if "grammar" not in batch:
        return {}
    return {"grammars": [str(g) or None for g in batch["grammar"]]}
