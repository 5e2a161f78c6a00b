"""The sources `rlctl data prep` knows: how to find their files and turn a record into a row.

A source is a `Task`: which columns hold the question and the answer, how the ground truth is
extracted, and the prompt instruction. GSM8K and MATH follow verl's preprocessing exactly
(same instruction, same ground truth, same data_source), so verl scores stay comparable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rlctl.data.readers import SUFFIXES
from rlctl.errors import DataError, UsageError
from rlctl.rewards.scorers.gsm8k import ground_truth_from_solution
from rlctl.rewards.scorers.math import last_boxed

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
CODE_INSTRUCTION = ("Write a Python program that reads standard input and writes standard output; "
                    "put it in a ```python block.")
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
# `--tools`: a system message offers built-in tools and says how to end, in the task's answer format
# (verl's gsm8k_multiturn_w_tool.py does the same for its tool; the user message stays as above)
TOOL_OFFERS = {"python": "the `python` tool runs a Python program you write and returns what it prints "
                         "(print the values you need)",
               "calculator": "the `calculator` tool evaluates an arithmetic expression such as `4821 * 37`"}
FINAL_ANSWER_FORMATS = {"gsm8k": "as `#### <number>`, e.g. `#### 42`", "math": "within \\boxed{}"}
SPLIT_NAMES = ("train", "test", "validation", "valid", "val", "dev")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


class RowError(Exception):
    """A record that cannot become a row; `kind` is what the summary counts it under."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class Task:
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


def tool_system_prompt(source: str, tools: tuple[str, ...]) -> str:
    """The system message of a tool-use prompt: which tools there are, and the final-answer format that
    the source's built-in reward reads (`#### <number>` for gsm8k), so the reward scores it unchanged."""
    offers = "; ".join(TOOL_OFFERS[t] for t in tools)
    return ("You are a math expert. Solve the problem step by step. You can call tools: "
            f"{offers}. Use {'it' if len(tools) == 1 else 'them'} for the calculations, then give the final "
            f"answer on the last line {FINAL_ANSWER_FORMATS[source]}.")


def _gsm8k_truth(answer: str) -> str:
    truth = ground_truth_from_solution(answer)
    if truth is None:
        raise RowError("no #### answer", "answer has no '#### <number>' line")
    return truth


def _math_truth(solution: str) -> str:
    truth = last_boxed(solution)
    if truth is None:
        raise RowError("no \\boxed answer", "solution has no complete \\boxed{...} answer")
    if not truth.strip():
        raise RowError("no \\boxed answer", "the solution's \\boxed{} is empty")
    return truth.strip()


def _code_truth(answer) -> str:
    """verl's code ground truth: a JSON string {"inputs": [...], "outputs": [...]}, checked now."""
    from rlctl.rewards.scorers.code import parse_cases

    try:
        data = json.loads(answer) if isinstance(answer, str) else answer
        parse_cases(data)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise RowError("bad tests", str(e).splitlines()[0][:200]) from None
    return json.dumps(data)


def _plain_truth(answer: str) -> str:
    return answer.strip()


def make_task(name: str, *, prompt_col: str | None = None, answer_col: str | None = None,
              instruction: str | None = None, system: str | None = None,
              data_source: str | None = None, default_data_source: str = "custom") -> Task:
    """The Task for a source name; column/instruction options override the built-in defaults."""
    if name == "gsm8k":
        base = Task("gsm8k", "openai/gsm8k", "math", "question", "answer", _gsm8k_truth,
                    GSM8K_INSTRUCTION, hub_id="openai/gsm8k", hub_patterns=("main/*.parquet",))
    elif name == "math":
        base = Task("math", "DigitalLearningGmbH/MATH-lighteval", "math", "problem", "solution", _math_truth,
                    MATH_INSTRUCTION, hub_id="DigitalLearningGmbH/MATH-lighteval",
                    hub_patterns=("data/*.parquet",))
    elif name == "code":
        base = Task("code", "rlctl/code", "code", "question", "tests", _code_truth, CODE_INSTRUCTION,
                    suffixes=(".jsonl", ".json", ".parquet"), structured_answer=True)
    elif name in ("jsonl", "csv", "parquet"):
        suffixes = (".jsonl", ".json") if name == "jsonl" else (f".{name}",)
        base = Task(name, default_data_source, "general", "question", "answer", _plain_truth,
                    hub_patterns=tuple(f"*{s}" for s in suffixes), suffixes=suffixes)
    else:
        raise DataError(f"unknown source {name!r}")
    overrides = {"prompt_col": prompt_col, "answer_col": answer_col, "instruction": instruction,
                 "system": system, "data_source": data_source}
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


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


def convert(task: Task, record: dict, split: str, index: int) -> dict:
    """One verl row from one source record; raises RowError for a record that cannot be used."""
    question = _text(record, task.prompt_col)
    answer = _text(record, task.answer_col, task.structured_answer)
    truth = task.ground_truth(answer)
    if not isinstance(answer, str):
        answer = truth
    content = f"{question} {task.instruction}" if task.instruction else question
    messages = ([{"role": "system", "content": task.system}] if task.system else [])
    messages.append({"role": "user", "content": content})
    return {
        "data_source": task.data_source,
        "prompt": messages,
        "ability": task.ability,
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


def find_split_files(root: Path, task: Task) -> tuple[dict[str, list[Path]], list[Path]]:
    """({split: files}, ignored files) under a folder, by name; one file is its split, else train."""
    if root.is_file():
        return {split_of(Path(root.name)) or "train": [root]}, []
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in task.suffixes
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    by_split: dict[str, list[Path]] = {}
    ignored = []
    for path in files:
        split = split_of(path.relative_to(root))
        if split is None:
            ignored.append(path)
        else:
            by_split.setdefault(split, []).append(path)
    if not by_split:
        raise DataError(f"{root}: no {'/'.join(task.suffixes)} files named after a split "
                        f"({', '.join(SPLIT_NAMES)})", hint="name them e.g. train.jsonl and test.jsonl, "
                        "or pass one file as --source.")
    return by_split, ignored


def download(task: Task, hub_id: str, *, local_too: bool = False) -> Path:
    """Fetch the source's files from the Hugging Face hub (cached); DataError when offline.

    `local_too`: the id came from --source, so say that no local path has that name either.
    """
    from rlctl.models.hub import go_offline, probe_hub

    hub = probe_hub()
    if hub.state == "unreachable":
        go_offline()  # a cached copy is read at once; an uncached one fails at once, not after retries
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(hub_id, repo_type="dataset", allow_patterns=list(task.hub_patterns))
    except Exception as e:  # offline, unknown repo, auth, network: all end the same way for the user
        reason = (str(e).strip().split(". ")[0].splitlines() or [type(e).__name__])[0][:200]
        reason = f"the hub is {hub.describe()}" if hub.state == "unreachable" else reason
        local = "; no local file or folder has that name either" if local_too else ""
        raise DataError(f"could not download {hub_id} from the Hugging Face hub ({reason}){local}",
                        hint=f"offline? pass a local copy: rlctl data prep {task.name} --source PATH "
                             "(a folder with train/test jsonl or parquet files, or one file).") from None
    return Path(folder)


def locate(task: Task, source: str | None) -> tuple[str, dict[str, list[Path]], list[Path]]:
    """(where the data came from, {split: files}, ignored files) for --source PATH or a hub id."""
    if source and Path(source).expanduser().exists():
        root = Path(source).expanduser()
        return (str(root), *find_split_files(root, task))
    hub_id = source or task.hub_id
    if not hub_id:  # a missing option, not broken data: a usage error
        raise UsageError(f"rlctl data prep {task.name} needs --source PATH (a {'/'.join(task.suffixes)} file "
                         "or a folder of them)", hint=f"e.g. rlctl data prep {task.name} --source my_data"
                                                      f"{task.suffixes[0]}.")
    if not _HUB_ID.fullmatch(hub_id) or Path(hub_id).suffix.lower() in SUFFIXES:
        raise DataError(f"--source {hub_id}: no such file or folder", hint="check the path.")
    return (f"hf://{hub_id}", *find_split_files(download(task, hub_id, local_too=bool(source)), task))
