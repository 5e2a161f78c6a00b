"""One sample, whatever wrote it, as one plain dict the terminal and HTML views both read; the filter language.

    step, i          the training step and the sample's place in it (eval: step 0, i = line)
    uid, source      the prompt's group id (GRPO's n samples share it) and data_source
    score, acc       the reward and its accuracy (None when not logged)
    length           response tokens (None when only text was logged), chars   response characters
    turns, calls, errors   assistant turns, tool calls and failed tool calls (0 single-turn)
    failure          why the sample's agent episode failed ("" when it did not, or it is no agent's)
    prompt           the prompt's text (its messages joined): "the same prompt across steps" keys on it
    messages         [{role, content, gen, tool_calls?}] the whole conversation; gen = written by the model
    segments         [[mask, text], ...] the response decoded in runs of equal response_mask (1 = generated,
                     0 = tool / interaction text and template glue); None without the run's tokenizer
    mask_runs        [[mask, tokens], ...] the same runs as token counts (rollout logs only)
    extra            the other fields the writer logged (turn_scores, policy_version, ground_truth, ...)
    file, tokens     the rollout log holding the sample (line i) and which per-token arrays it has
                     ("log_probs", "advantages"): read back for one sample by rlctl.view.data.token_record
"""

from __future__ import annotations

import json
import math
import operator
import re

_KNOWN = {"step", "uid", "data_source", "score", "acc", "response_length", "prompt_ids", "response_ids", "response_mask", "messages",
          "num_turns", "tool_calls", "prompt", "response", "log_probs", "advantages", "index", "sample", "correct",
          "agent_failure"}


def rollout_sample(rec: dict, step: int, i: int, file: str, *, length: int, runs: list[list[int]],
                   tokens: list[str] = ()) -> dict:
    """A line of rollouts/step_<N>.jsonl (rlctl.controller.rollout_log), its token arrays summarised by the
    reader (rlctl.view.data.read_rollout_file): `length` response tokens, the mask's `runs`, which per-token
    arrays it has (`tokens`); they stay on disk (`file`, line `i`). The reader may add decoded `segments`."""
    calls = rec.get("tool_calls") or []
    sample = _base(step, i, rec, _messages(rec.get("messages") or []))
    sample.update(length=length, mask_runs=runs, calls=len(calls), file=file,
                  errors=sum(bool(c.get("error")) for c in calls if isinstance(c, dict)), tokens=list(tokens),
                  turns=int(rec.get("num_turns") or sum(m["role"] == "assistant" for m in sample["messages"])))
    if not calls:   # older logs had no tool_calls: count the conversation's tool turns
        sample["calls"] = sum(len(m.get("tool_calls") or []) for m in sample["messages"])
        sample["errors"] = sum(m["role"] == "tool" and str(m["content"]).startswith("error") for m in sample["messages"])
    return _finish(sample)


def run_slices(ids: list[int], runs: list[list[int]]) -> list[list[int]]:
    """The response's ids cut at the mask's runs: [[ids of run 1], [ids of run 2], ...]."""
    out, start = [], 0
    for _m, n in runs:
        out.append(ids[start:start + n])
        start += n
    return out


def segments(ids: list[int] | None, runs: list[list[int]], decode) -> list[list] | None:
    """[[mask, text], ...]: the response decoded run by run of equal response_mask (`decode`: a batch decoder)."""
    if not ids or decode is None:
        return None
    return [[m, text] for (m, _n), text in zip(runs, decode(run_slices(ids, runs)))]


def logged_sample(row: dict, step: int, i: int) -> dict:
    """A line of samples.jsonl: the decoded prompt (chat template included: split back into its
    messages) and response; `acc` and `response_length` (tokens) where the run logged them."""
    messages = [*template_messages(str(row.get("prompt", ""))),
                {"role": "assistant", "content": str(row.get("response", "")), "gen": True}]
    sample = _base(step, i, row, messages)
    if isinstance(row.get("response_length"), int):
        sample["length"] = row["response_length"]
    return _finish(sample)


# Chat templates' turn markers: ChatML (Qwen, SmolLM2, rlctl's tiny models) and Llama 3.
_TURNS = (re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|$)", re.S),
          re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|$)", re.S))


def template_messages(text: str) -> list[dict]:
    """A prompt decoded with its chat template, as the messages it was made of (the generation
    prompt's empty assistant turn dropped); text in no known template: one user message."""
    for pattern in _TURNS:
        turns = pattern.findall(text)
        if turns:
            if turns[-1][0] == "assistant" and not turns[-1][1].strip():
                turns = turns[:-1]
            return [{"role": role, "content": content.strip("\n"), "gen": False} for role, content in turns]
    return [{"role": "user", "content": text, "gen": False}]


def eval_sample(row: dict, i: int) -> dict:
    """A line of `rlctl eval --out`: the prompt's messages and the response (or the whole conversation)."""
    if isinstance(row.get("messages"), list):
        messages = _messages(row["messages"])
    else:
        prompt = row.get("prompt") if isinstance(row.get("prompt"), list) else \
            [{"role": "user", "content": str(row.get("prompt", ""))}]
        messages = _messages([*prompt, {"role": "assistant", "content": str(row.get("response", ""))}])
    sample = _base(0, i, row, messages)
    if sample["acc"] is None and isinstance(row.get("correct"), bool):
        sample["acc"] = float(row["correct"])
    calls = row.get("tool_calls") or []
    sample.update(length=row.get("response_tokens") if isinstance(row.get("response_tokens"), int) else None,
                  calls=len(calls), errors=sum(bool(c.get("error")) for c in calls if isinstance(c, dict)),
                  turns=int(row.get("num_turns") or 1))
    return _finish(sample)


def _base(step: int, i: int, row: dict, messages: list[dict]) -> dict:
    return {"step": step, "i": i, "uid": row.get("uid"), "source": str(row.get("data_source") or ""),
            "score": _number(row.get("score")), "acc": _number(row.get("acc")), "length": None,
            "turns": 1, "calls": 0, "errors": 0, "failure": str(row.get("agent_failure") or ""),
            "messages": messages, "segments": None, "mask_runs": None,
            "file": None, "tokens": [],
            "extra": {k: _finite(v) for k, v in row.items() if k not in _KNOWN}}


def _finish(sample: dict) -> dict:
    first_gen = next((k for k, m in enumerate(sample["messages"]) if m["gen"]), len(sample["messages"]))
    sample["prompt"] = "\n".join(str(m["content"]) for m in sample["messages"][:first_gen])
    sample["chars"] = sum(len(str(m["content"])) for m in sample["messages"][first_gen:])
    return sample


def _messages(raw: list) -> list[dict]:
    """Chat messages with `gen` set on the assistant turns after the prompt (what the policy wrote)."""
    out = []
    for m in raw:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "?"))
        content = m.get("content")
        if isinstance(content, list):   # multimodal parts: keep the text ones
            content = " ".join(str(p.get("text", f"<{p.get('type', 'part')}>")) for p in content if isinstance(p, dict))
        msg = {"role": role, "content": "" if content is None else str(content), "gen": role == "assistant"}
        if m.get("tool_calls"):
            msg["tool_calls"] = [_call_text(c) for c in m["tool_calls"]]
        out.append(msg)
    return out


def _call_text(call) -> str:
    fn = call.get("function", call) if isinstance(call, dict) else {}
    args = fn.get("arguments", "")
    return f"{fn.get('name', '?')}({args if isinstance(args, str) else json.dumps(args)})"


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _finite(value):
    """JSON-safe: NaN / inf (a failed turn score read back from an eval file) become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# -- filtering and sorting: the same words in the terminal's filter box and the HTML page's ---------------

FIELDS = {"reward": "score", "score": "score", "acc": "acc", "len": "length", "length": "length", "turns": "turns",
          "calls": "calls", "errors": "errors", "step": "step", "source": "source"}
_OPS = {">=": operator.ge, "<=": operator.le, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
        "=": operator.eq, ":": operator.eq}
_TERM = re.compile(r"^([a-z]+)(>=|<=|!=|>|<|=|:)(.+)$")
SORT_KEYS = ("step", "score", "acc", "length", "turns", "errors", "source")


def parse_filter(text: str):
    """A predicate over samples from words like `reward>0.5 acc=1 source:gsm8k len<200 errors>0 calculator`:
    `field op value` words compare (source: a substring), every other word must appear in the text.
    ValueError names a word that compares a number field with something that is not a number."""
    tests = []
    for word in text.split():
        match = _TERM.match(word.lower())
        if not match or match.group(1) not in FIELDS:
            needle = word.lower()
            tests.append(lambda s, n=needle: n in search_text(s))
            continue
        key, op, value = FIELDS[match.group(1)], _OPS[match.group(2)], match.group(3)
        if key == "source":
            tests.append(lambda s, v=value, o=op: (v in s["source"].lower()) == (o is not operator.ne))
            continue
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{word!r}: {match.group(1)} compares with a number, e.g. {match.group(1)}>0.5") from None
        tests.append(lambda s, k=key, o=op, x=number: s.get(k) is not None and o(s[k], x))
    return lambda sample: all(t(sample) for t in tests)


def search_text(sample: dict) -> str:
    if "_text" not in sample:
        sample["_text"] = "\n".join([sample["source"], sample.get("failure", "")] +
                                    [str(m["content"]) + " " + " ".join(m.get("tool_calls", []))
                                     for m in sample["messages"]]).lower()
    return sample["_text"]


def sort_samples(samples: list[dict], key: str, reverse: bool = False) -> list[dict]:
    """Sorted by `key` (one of SORT_KEYS), samples without a value last; ties keep (step, i) order."""
    have = [s for s in samples if s.get(key) is not None]
    return sorted(have, key=lambda s: s[key], reverse=reverse) + [s for s in samples if s.get(key) is None]


def prompt_history(samples: list[dict], prompt: str) -> list[dict]:
    """Every sample of the same prompt, by step: how the answers to one question changed."""
    return sorted((s for s in samples if s["prompt"] == prompt), key=lambda s: (s["step"], s["i"]))
