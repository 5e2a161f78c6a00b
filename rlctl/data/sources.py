"""The sources `rlctl data prep` reads: where their files are and how one record becomes a verl row.

A `FileSource` says which columns hold the question and the answer, how the ground truth is taken
from the answer, and the prompt instruction; a `Generated` source makes its rows offline. A
`PrepSource` is one `rlctl data prep SOURCE` choice: a built-in task declares its own in
rlctl/tasks/ (the task's adapter and scorer stay together there); this module knows no task, only
the user's own jsonl / csv / parquet files (`file_source`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlctl.data.readers import SUFFIXES
from rlctl.errors import DataError, UsageError

FILE_FORMATS = ("jsonl", "csv", "parquet")
SPLIT_NAMES = ("train", "test", "validation", "valid", "val", "dev")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


class RowError(Exception):
    """A record that cannot become a row; `kind` is what the summary counts it under."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class FileSource:
    """Records read from files (or the hub): which columns hold what, and the row they become."""

    name: str
    data_source: str
    ability: str
    prompt_col: str
    answer_col: str
    ground_truth: Callable[[str], str]  # answer text -> ground truth; raises RowError
    instruction: str = ""
    system: str = ""
    hub_id: str = ""
    hub_patterns: tuple = ()
    suffixes: tuple = SUFFIXES
    structured_answer: bool = False  # the answer may be a dict/list (code test cases), not only text
    image_col: str = ""              # vision data: the records' image list, kept as the row's `images`
    template: str = ""               # the user message, "...{question}...", in place of question + instruction
    adapter: Callable[[dict], dict] | None = None  # record -> record before conversion (a verl row's fields)
    one_split: str = ""              # every file is this split (a hub repo whose files are one set: AIME's test)


@dataclass(frozen=True)
class Generated:
    """Rows made offline and seeded, with no --source: `generate(seed, val_fraction) -> {split: rows}`."""

    data_source: str
    generate: Callable[[int, float], dict]
    default_val_fraction: float
    arrow_schema: Callable | None = None  # more columns than rlctl's row schema (calc-tools' transcripts)
    notes: Callable | None = None         # {split: rows} -> lines for the prep report (a no-image baseline)


def seeded_splits(items: list, seed: int, val_fraction: float, *, noun: str, hint: str) -> dict[str, list]:
    """`items` in a seeded random order, the first round(len * val_fraction) as "test" and the rest as
    "train" (an empty split left out): generated prep's --val-fraction. One that leaves no training
    item is a UsageError (exit 2) counting the items as `noun`, with `hint`."""
    order = list(items)
    random.Random(seed).shuffle(order)
    n_test = round(len(order) * val_fraction)
    if val_fraction and len(order) - n_test < 1:
        raise UsageError(f"--val-fraction {val_fraction} leaves no training rows ({len(order)} {noun})", hint=hint)
    return {split: chosen for split, chosen in (("train", order[n_test:]), ("test", order[:n_test])) if chosen}


@dataclass(frozen=True)
class PrepSource:
    """One `rlctl data prep SOURCE` choice a task offers, and what the prep may do with it."""

    name: str
    rows: FileSource | Generated
    help: str = ""                 # its words in `rlctl data prep --help`, after the name
    aliases: tuple = ()            # other names `rlctl data prep` takes for it
    no_sft: str = ""               # why `--sft` is refused ("" = rows hold a reference solution)
    final_answer_format: str = ""  # `--tools`: how the tool-use prompt asks for the answer ("" = no --tools)
    needs_source: tuple = ()       # (message, hint) of the UsageError when --source is missing


def plain_truth(answer: str) -> str:
    return answer.strip()


def file_source(name: str, data_source: str) -> FileSource:
    """The FileSource of the user's own files: `name` is one of FILE_FORMATS."""
    if name not in FILE_FORMATS:
        raise DataError(f"unknown source {name!r}")
    suffixes = (".jsonl", ".json") if name == "jsonl" else (f".{name}",)
    return FileSource(name, data_source, "general", "question", "answer", plain_truth,
                      hub_patterns=tuple(f"*{s}" for s in suffixes), suffixes=suffixes)


def _text(record: dict, column: str, structured: bool = False):
    if column not in record:
        raise RowError(f"missing {column}", f"no {column!r} field")
    value = record[column]
    if structured and isinstance(value, (list, dict)):
        return value
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise RowError(f"bad {column}", f"{column!r} is a {type(value).__name__}, expected text")
    text = "" if value is None else str(value)
    if not text.strip():
        raise RowError(f"empty {column}", f"{column!r} is empty")
    return text


def convert(src: FileSource, record: dict, split: str, index: int) -> dict:
    """One verl row from one source record; raises RowError for a record that cannot be used."""
    if src.adapter is not None:
        record = src.adapter(record)
    question = _text(record, src.prompt_col)
    answer = _text(record, src.answer_col, src.structured_answer)
    truth = src.ground_truth(answer)
    if not isinstance(answer, str):
        answer = truth
    content = f"{question} {src.instruction}" if src.instruction else question
    if src.template:
        content = src.template.format(question=question)
    messages = ([{"role": "system", "content": src.system}] if src.system else [])
    messages.append({"role": "user", "content": content})
    row = rule_row(src.data_source, messages, src.ability, truth, split, index, question=question, answer=answer)
    if src.image_col:
        row["images"] = _images(record, src.image_col, messages)
    return row


def _images(record: dict, column: str, messages: list[dict]) -> list[dict]:
    """A record's images as self-contained {bytes, path} entries (a path's file is read in: the
    prepared file lives elsewhere), each decoded once and matched against the `<image>` markers."""
    from rlctl.data.images import decode_image, image_entry, marker_count

    entries = record.get(column)
    if not isinstance(entries, list):
        entries = [] if entries is None else [entries]
    if marker_count(messages) != len(entries):
        raise RowError("image/marker mismatch", f"{marker_count(messages)} <image> marker(s) but {len(entries)} "
                                                f"image(s) in {column!r}")
    out = []
    for i, entry in enumerate(entries):
        try:
            decode_image(entry, where=f"image {i}")
            out.append(image_entry(entry))
        except DataError as e:
            raise RowError("bad image", e.message) from None
    return out


def rule_row(data_source: str, prompt: list[dict], ability: str, truth: str, split: str, index: int, *,
             question: str, answer: str) -> dict:
    """One verl row scored by a rule against `truth` (DESIGN.md's parquet schema); extra_info keeps
    the split, the row's index in it, and the question and answer as the source gave them."""
    return {
        "data_source": data_source,
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def split_of(relative: Path) -> str | None:
    """The split a file belongs to: the first path part (or stem prefix) that names a split."""
    for part in (*relative.parent.parts, relative.name):
        head = re.split(r"[-_.]", part.lower(), maxsplit=1)[0]
        if head in SPLIT_NAMES:
            return head
    return None


def find_split_files(root: Path, src: FileSource) -> tuple[dict[str, list[Path]], list[Path]]:
    """({split: files}, ignored files) under a folder, by name; one file is its split, else train."""
    if root.is_file():
        return {src.one_split or split_of(Path(root.name)) or "train": [root]}, []
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in src.suffixes
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    by_split: dict[str, list[Path]] = {}
    ignored = []
    for path in files:
        split = src.one_split or split_of(path.relative_to(root))
        if split is None:
            ignored.append(path)
        else:
            by_split.setdefault(split, []).append(path)
    if not by_split:
        raise DataError(f"{root}: no {'/'.join(src.suffixes)} files named after a split "
                        f"({', '.join(SPLIT_NAMES)})", hint="name them e.g. train.jsonl and test.jsonl, "
                        "or pass one file as --source.")
    return by_split, ignored


def download(src: FileSource, hub_id: str, *, local_too: bool = False) -> Path:
    """Fetch the source's files from the Hugging Face hub (cached); DataError when offline.

    `local_too`: the id came from --source, so say that no local path has that name either.
    """
    from rlctl.models.hub import go_offline, probe_hub

    hub = probe_hub()
    if hub.state == "unreachable":
        go_offline()  # a cached copy is read at once; an uncached one fails at once, not after retries
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(hub_id, repo_type="dataset", allow_patterns=list(src.hub_patterns))
    except Exception as e:  # offline, unknown repo, auth, network: all end the same way for the user
        reason = (str(e).strip().split(". ")[0].splitlines() or [type(e).__name__])[0][:200]
        reason = f"the hub is {hub.describe()}" if hub.state == "unreachable" else reason
        local = "; no local file or folder has that name either" if local_too else ""
        raise DataError(f"could not download {hub_id} from the Hugging Face hub ({reason}){local}",
                        hint=f"offline? pass a local copy: rlctl data prep {src.name} --source PATH "
                             "(a folder with train/test jsonl or parquet files, or one file).") from None
    return Path(folder)


def locate(src: FileSource, source: str | None) -> tuple[str, dict[str, list[Path]], list[Path]]:
    """(where the data came from, {split: files}, ignored files) for --source PATH or a hub id."""
    if source and Path(source).expanduser().exists():
        root = Path(source).expanduser()
        return (str(root), *find_split_files(root, src))
    hub_id = source or src.hub_id
    if not hub_id:  # a missing option, not broken data: a usage error
        raise UsageError(f"rlctl data prep {src.name} needs --source PATH (a {'/'.join(src.suffixes)} file "
                         "or a folder of them)", hint=f"e.g. rlctl data prep {src.name} --source my_data"
                                                      f"{src.suffixes[0]}.")
    if not _HUB_ID.fullmatch(hub_id) or Path(hub_id).suffix.lower() in SUFFIXES:
        raise DataError(f"--source {hub_id}: no such file or folder", hint="check the path.")
    return (f"hf://{hub_id}", *find_split_files(download(src, hub_id, local_too=bool(source)), src))
