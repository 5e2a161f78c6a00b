"""What the training loop reads: validated rows from parquet files, prompt lengths, a fingerprint.

    read_table(files) -> pyarrow.Table        every file validated, then concatenated
    load_rows(files) -> list[dict]            the same rows as plain dicts (verl schema)
    render_prompts(prompts, tokenizer) -> list[str]   chat template + generation prompt
    prompt_token_lengths(prompts, tokenizer) -> list[int]
    files_fingerprint(files) -> str           content hash, for "is this the data I resumed with?"
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rlctl.errors import DataError


def read_parquet(path: str | os.PathLike):
    """One parquet file as a validated pyarrow Table; DataError naming the file and column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.data.schema import validate_table

    path = Path(path)
    if path.is_dir():
        raise DataError(f"data file {path} is a folder, not a parquet file", hint=_files_inside(path))
    if not path.is_file():
        raise DataError(f"data file {path} does not exist", hint="run `rlctl data prep` or fix data.train_files.")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path} is not a readable parquet file ({str(e).splitlines()[0]})") from None
    validate_table(table, source=str(path))
    return table


def _files_inside(folder: Path) -> str:
    """How to fix "a folder was given": name the parquet files in it (what `data prep` writes)."""
    found = sorted(str(p) for p in folder.glob("*.parquet") if p.is_file())
    if not found:
        return "pass a .parquet file (rlctl data prep writes <out>/train.parquet and test.parquet)."
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return f"pass one .parquet file, e.g. {', '.join(found[:3])}{more}."


def read_table(files):
    """All `files` (a path or a list of paths) validated and concatenated, in the order given.

    Files whose extra_info carries different fields are merged (missing fields become null).
    """
    import pyarrow as pa

    paths = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not paths:
        raise DataError("no data files given", hint="set data.train_files to one or more parquet files.")
    tables = [read_parquet(p) for p in paths]
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as e:
        raise DataError(f"data files {', '.join(map(str, paths))} do not share a schema ({e})") from None


def load_rows(files, image_key: str = "images") -> list[dict]:
    """Rows of `files` as dicts: data_source, prompt (list of {role, content}), ability,
    reward_model {style, ground_truth}, extra_info {...}; and, in vision-language data, the
    `image_key` column with its relative image paths made absolute (they are relative to their
    parquet file, which a row no longer knows: rlctl.data.images)."""
    import pyarrow.parquet as pq

    from rlctl.data.images import absolute_image_paths

    paths = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    rows = read_table(paths).to_pylist()
    if not rows or image_key not in rows[0]:
        return rows
    start = 0
    for path in paths:   # each file's rows, in read_table's order, against that file's folder
        n = pq.ParquetFile(path).metadata.num_rows
        absolute_image_paths(rows[start:start + n], image_key, Path(path).parent)
        start += n
    return rows


def render_prompts(prompts: list[list[dict]], tokenizer) -> list[str]:
    """The text a model sees for each prompt: its chat template with the generation prompt.

    A tokenizer without a chat template (a base model) gets the contents joined by newlines.
    """
    if not getattr(tokenizer, "chat_template", None):
        return ["\n".join(m["content"] for m in messages) for messages in prompts]
    if not prompts:
        return []
    return tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=False)


def prompt_token_lengths(prompts: list[list[dict]], tokenizer) -> list[int]:
    """Tokens per prompt after `render_prompts` (the template already holds the special tokens)."""
    texts = render_prompts(prompts, tokenizer)
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def files_fingerprint(files) -> str:
    """`sha256:<hex>` over the files' bytes in order: same data, same order -> same fingerprint."""
    paths = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    outer = hashlib.sha256()
    for path in paths:
        inner = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    inner.update(chunk)
        except OSError as e:
            raise DataError(f"cannot read data file {path} ({e.strerror})") from None
        outer.update(f"{inner.hexdigest()}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def chat_prompt_ids(messages: list, tokenizer, tools: list[dict] | None = None) -> list[int]:
    """The token ids the policy sees for one chat prompt: its chat template with the generation
    prompt (training and `rlctl eval` alike); `tools` are OpenAI function schemas the template
    renders into the prompt (multi-turn rollouts). A tokenizer without a template (a base model)
    reads the contents joined by newlines, as `rlctl data inspect` counts them."""
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer(render_prompts([messages], tokenizer)[0], add_special_tokens=False)["input_ids"]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, tools=tools or None)
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
