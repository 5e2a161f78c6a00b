"""SFT samples: parquet/jsonl rows -> chat messages -> token ids with a loss mask.

Two row shapes, verl's columns unchanged:
  single-turn  `sft.prompt_key` (a string, or a list of {role, content} messages) + `sft.response_key`
               (a string); `*_dict_keys` descend into struct columns (verl: prompt_key = "extra_info",
               prompt_dict_keys = ["question"]).
  multi-turn   `sft.messages_key` ("messages"): a list of {role, content}, assistant `tool_calls`
               and `tool` messages; an optional `sft.tools_key` column holds the tool schemas.
A file with the messages column is read as multi-turn, any other as single-turn.

Every sample is rendered once with the tokenizer's chat template. The loss mask marks the
assistant's tokens: for each assistant message, the characters between the template's text for
the turns before it plus the generation prompt (`<|im_start|>assistant\\n`) and the text with it
included, minus the whitespace after its closing special token. So an assistant turn counts its
content, its tool calls and its end-of-turn token (`<|im_end|>`), never the header or the "\\n"
the template puts between turns; tool results and user turns never count. Characters map to
tokens through the tokenizer's offsets, so the ids are exactly `apply_chat_template(...)`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlctl.errors import DataError


@dataclass(frozen=True)
class SFTSample:
    input_ids: np.ndarray   # int64 [L]
    loss_mask: np.ndarray   # float32 [L]: 1 where the token is a training target


@dataclass
class SFTSet:
    samples: list[SFTSample]
    truncated: int = 0
    no_target: int = 0      # samples without a single target token (dropped)


# --- reading rows --------------------------------------------------------------------------------
def read_sft_file(path: Path) -> tuple[list[str], list[dict]]:
    """(column names, rows as dicts) of a parquet or jsonl file; DataError when unreadable.

    Not rlctl.data.dataset.read_table: SFT files carry any columns (no verl-schema check), may be
    jsonl, and are read one at a time; their error messages point at `data prep --sft`."""
    if not path.is_file():
        raise DataError(f"{path} does not exist", hint="prepare SFT data with `rlctl data prep arith --sft`.")
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise DataError(f"{path}:{n} is not JSON: {e}", hint="one JSON object per line.") from None
        columns = sorted({k for r in rows for k in r})
        return columns, rows
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a data error with its reason
        raise DataError(f"{path} is not a readable parquet file: {e}", hint="rewrite it with `rlctl data prep`.") from None
    return table.column_names, table.to_pylist()


def conversations(path: Path, sft) -> list[tuple[list[dict], list | None]]:
    """Every row of `path` as (messages, tools or None), per the [sft] column keys."""
    columns, rows = read_sft_file(path)
    if not rows:
        raise DataError(f"{path} has no rows", hint="prepare SFT data with `rlctl data prep ... --sft`.")
    if sft.messages_key in columns:
        return [(_messages(path, i, row[sft.messages_key], sft.messages_key), _tools(row.get(sft.tools_key)))
                for i, row in enumerate(rows)]
    missing = [k for k in (sft.prompt_key, sft.response_key) if k not in columns]
    if missing:
        raise DataError(f"{path} has no {' or '.join(repr(m) for m in missing)} column and no "
                        f"{sft.messages_key!r} column (columns: {', '.join(columns)})",
                        hint="set sft.prompt_key / sft.response_key (or sft.messages_key) to its columns, or write "
                             "SFT data with `rlctl data prep SOURCE --sft`.")
    out = []
    for i, row in enumerate(rows):
        prompt = _descend(path, i, row[sft.prompt_key], sft.prompt_key, sft.prompt_dict_keys)
        response = _descend(path, i, row[sft.response_key], sft.response_key, sft.response_dict_keys)
        if not isinstance(response, str):
            raise DataError(f"{path} row {i}: the response ({sft.response_key}) is {type(response).__name__}, "
                            "not text", hint="point sft.response_key (and response_dict_keys) at a string.")
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = _messages(path, i, prompt, sft.prompt_key)
        out.append((messages + [{"role": "assistant", "content": response}], None))
    return out


def _descend(path: Path, i: int, value, column: str, keys) -> object:
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise DataError(f"{path} row {i}: column {column!r} has no key {key!r} "
                            f"(it holds {sorted(value) if isinstance(value, dict) else type(value).__name__})",
                            hint="fix sft.prompt_dict_keys / sft.response_dict_keys.")
        value = value[key]
    return value


def _messages(path: Path, i: int, value, column: str) -> list[dict]:
    if isinstance(value, str):   # a JSON-encoded list, as some exporters write it
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{path} row {i}: column {column!r} is not a non-empty list of chat messages",
                        hint="each message is {\"role\": ..., \"content\": ...}.")
    out = []
    for m in value:
        if not isinstance(m, dict) or "role" not in m:
            raise DataError(f"{path} row {i}: column {column!r} holds {m!r}, not a {{role, content}} message")
        msg = {"role": m["role"], "content": m.get("content") or ""}
        calls = m.get("tool_calls")
        if calls:   # arguments as the template expects them: a dict (JSON text is decoded)
            msg["tool_calls"] = [_tool_call(c) for c in calls]
        for extra in ("name", "tool_call_id"):
            if m.get(extra):
                msg[extra] = m[extra]
        out.append(msg)
    return out


def _tool_call(call: dict) -> dict:
    fn = dict(call.get("function") or call)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass   # not JSON: the template renders the text as it is
    return {"type": "function", "function": {"name": fn.get("name", ""), "arguments": args if args is not None else {}}}


def _tools(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    return list(value) if value else None


# --- tokenizing with the assistant mask ----------------------------------------------------------
def render(tokenizer, messages: list[dict], tools, *, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], tools, text: str) -> list[tuple[int, int]]:
    """Character spans of `text` (the whole rendered chat) that are the assistant's own tokens."""
    specials = [t for t in tokenizer.all_special_tokens if t] + list(getattr(tokenizer, "added_tokens_encoder", {}))
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], tools, generation_prompt=True) if i else ""
        upto = render(tokenizer, messages[:i + 1], tools)
        if not (text.startswith(before) and text.startswith(upto)) or len(upto) < len(before):
            raise DataError(f"the chat template renders the turns before assistant message {i} differently once "
                            "later turns follow, so the assistant's tokens cannot be told apart",
                            hint="set sft.assistant_only_loss = false, or use a model whose template keeps "
                                 "earlier turns unchanged.")
        end = len(upto)
        stripped = upto.rstrip()
        if len(stripped) < end and any(stripped.endswith(s) for s in specials):
            end = len(stripped)   # the "\n" between turns belongs to no one
        spans.append((len(before), end))
    return spans


def tokenize_conversation(tokenizer, messages: list[dict], tools=None, *,
                          assistant_only: bool = True) -> tuple[list[int], list[float]]:
    """(input_ids, loss_mask) of one chat; the ids equal apply_chat_template(..., tokenize=True)."""
    text = render(tokenizer, messages, tools)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if not assistant_only:
        return ids, [1.0] * len(ids)
    spans = assistant_spans(tokenizer, messages, tools, text)
    mask = [0.0] * len(ids)
    for t, (start, stop) in enumerate(enc["offset_mapping"]):
        if stop > start and any(a <= start < b for a, b in spans):
            mask[t] = 1.0
    return ids, mask


def build_samples(files: list[Path], tokenizer, sft) -> SFTSet:
    """Tokenize every row of `files`; apply sft.max_length / sft.truncation; drop target-less rows."""
    out = SFTSet(samples=[])
    for path in files:
        for i, (messages, tools) in enumerate(conversations(path, sft)):
            try:
                ids, mask = tokenize_conversation(tokenizer, messages, tools, assistant_only=sft.assistant_only_loss)
            except DataError as e:
                raise DataError(f"{path} row {i}: {e.message}", hint=e.hint) from None
            if len(ids) > sft.max_length:
                if sft.truncation == "error":
                    raise DataError(f"{path} row {i} is {len(ids)} tokens, over sft.max_length = {sft.max_length}",
                                    hint="raise sft.max_length, or set sft.truncation = \"right\" or \"left\".")
                keep = slice(0, sft.max_length) if sft.truncation == "right" else slice(len(ids) - sft.max_length, None)
                ids, mask = ids[keep], mask[keep]
                out.truncated += 1
            mask[0] = 0.0   # the first token has no predictor
            if not any(mask):
                out.no_target += 1
                continue
            out.samples.append(SFTSample(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.float32)))
    if not out.samples:
        raise DataError(f"no SFT sample with a target token in {', '.join(map(str, files))}",
                        hint="check that the data has assistant responses (sft.response_key / messages).")
    return out


def collate(samples: list[SFTSample], pad_token_id: int):
    """Right-padded rows: input_ids, attention_mask, loss_mask [B, L_max] (a rlctl Batch)."""
    from rlctl.runtime.batch import Batch

    width = max(len(s.input_ids) for s in samples)
    ids = np.full((len(samples), width), pad_token_id, dtype=np.int64)
    attn = np.zeros((len(samples), width), dtype=np.int64)
    loss = np.zeros((len(samples), width), dtype=np.float32)
    for r, s in enumerate(samples):
        n = len(s.input_ids)
        ids[r, :n], attn[r, :n], loss[r, :n] = s.input_ids, 1, s.loss_mask
    return Batch({"input_ids": ids, "attention_mask": attn, "loss_mask": loss})
