"""reasoning-gym's procedural tasks (`rlctl data prep reasoning-gym:TASK`), scored by reasoning-gym itself.

reasoning-gym (the `reasoning-gym` package, `pip install 'rlctl[envs]'`) generates seeded problems
for ~100 tasks (`leg_counting`, `chain_sum`, `countdown`, `sudoku`, ...), each with its own
`score_answer(answer, entry)`. Prep writes them offline as verl rows; the built-in reward hands the
model's answer to that same `score_answer`, so a score here is reasoning-gym's score.

    reasoning-gym:chain_sum                      one task, its default difficulty
    reasoning-gym:chain_sum --args '{"max_digits": 1}'        the task's config (its dataclass's fields)
    reasoning-gym:chain_sum=3,leg_counting=1     a composite: rows in the share of the weights (default 1);
                                                 --args then maps each task to its config

Rows: `data_source = "reasoning_gym/<task>"` (a composite's rows each name their own task), the
user message is reasoning-gym's question, a blank line and ANSWER_INSTRUCTION; the ground truth is
the entry's `answer`; extra_info keeps `task`, `config` (the task's config as JSON) and `metadata`
(the entry's metadata as JSON), which many scorers read. `--size N` distinct questions (default
1000) are drawn from reasoning-gym's dataset of seed `--seed` (a composite's i-th task: seed + i),
item 0, 1, ...; a question drawn twice is dropped, and a seeded `--val-fraction` (default 0.1) of
them is the test split, so no test question is in train.

Answer extraction (`extract_answer`): the text inside the response's last `<answer>...</answer>`
pair, reasoning-gym's own convention, else the response's last non-empty line; stripped of the
whitespace around it. A small model rarely writes the tags (SmolLM2-135M-Instruct: 7 of 192 samples
held any '<'), so the prompt asks for the answer alone and the last line is read when there are no
tags (an answer of several lines, such as an ARC grid, needs the tags). `reward.function =
"reasoning_gym_strict"` reads the tags only (no pair: no answer), as
reasoning-gym's `extract_answer` does. score = `score_answer(answer, entry)` in [0, 1] (partial credit
is the task's own: chain_sum pays len(answer) / len(response line) for a line that holds the right
number; no answer, or one the task's scorer raises on, scores 0), or `reward.format_score` for an
answer that scores 0; `acc` = score 1; `format` = an answer was found; `tagged` = in the tags.
"""

from __future__ import annotations

import ast
import functools
import json
import re

from rlctl.data.sources import Generated, PrepSource, rule_row, seeded_splits
from rlctl.errors import UsageError

NAME = "reasoning-gym"                  # `rlctl data prep reasoning-gym:TASK`
PREFIX = "reasoning_gym/"               # data_source = PREFIX + task
DATA_SOURCES = ()                       # any task: routed by its prefix
DATA_SOURCE_PREFIXES = (PREFIX,)
DEFAULT_SIZE = 1000
DEFAULT_VAL_FRACTION = 0.1
MAX_DRAWS = 4                           # items tried per wanted row before a small task stops short
ANSWER_INSTRUCTION = "Give only the final answer."
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INSTALL_HINT = "install it with `pip install 'rlctl[envs]'` (or `pip install reasoning-gym`)."


def tagged_answer(solution_str: str) -> str | None:
    """The stripped text of the last `<answer>...</answer>` pair, or None when there is none."""
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def extract_answer(solution_str: str) -> str | None:
    """The last `<answer>` pair's text, else the last non-empty line; None for a blank response."""
    tagged = tagged_answer(solution_str)
    if tagged is not None:
        return tagged
    lines = [line.strip() for line in solution_str.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _library():
    try:
        import reasoning_gym
    except ImportError:
        raise UsageError("reasoning-gym is not installed", hint=INSTALL_HINT) from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every dataset reasoning-gym registers (its factory's table), sorted."""
    _library()
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != "composite")


def parse_tasks(spec: str) -> dict[str, float]:
    """"chain_sum=3,leg_counting" -> {"chain_sum": 3.0, "leg_counting": 1.0}; UsageError on a bad
    weight, a repeated or unknown task (with "did you mean")."""
    weights: dict[str, float] = {}
    for word in filter(None, (w.strip() for w in spec.split(","))):
        task, _, weight = word.partition("=")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            value = float("nan")
        if not value > 0:
            raise UsageError(f"reasoning-gym:{spec}: weight {weight!r} of {task!r} is not a positive number",
                             hint="write TASK=WEIGHT, e.g. reasoning-gym:chain_sum=3,leg_counting=1.")
        if task in weights:
            raise UsageError(f"reasoning-gym:{spec}: {task!r} is named twice", hint="name each task once.")
        weights[task] = value
    if not weights:
        raise UsageError("reasoning-gym: no task named",
                         hint="write reasoning-gym:TASK, e.g. reasoning-gym:leg_counting.")
    known = task_names()
    for task in weights:
        if task not in known:
            import difflib

            close = difflib.get_close_matches(task, known, n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"unknown reasoning-gym task {task!r}{guess}",
                             hint=f"reasoning-gym {_version()} has {len(known)} tasks: {', '.join(known)}.")
    return weights


def _version() -> str:
    from importlib.metadata import version

    return version("reasoning-gym")


def _configs(weights: dict[str, float], args: dict | None) -> dict[str, dict]:
    """Each task's config: --args itself for one task, --args[task] for a composite."""
    args = dict(args or {})
    if len(weights) == 1:
        return {next(iter(weights)): args}
    unknown = [k for k in args if k not in weights]
    bad = [k for k, v in args.items() if not isinstance(v, dict)]
    if unknown or bad:
        raise UsageError(f"--args for a composite maps each of its tasks to a config object; "
                         f"{'not tasks: ' + ', '.join(unknown) if unknown else 'not objects: ' + ', '.join(bad)}",
                         hint='e.g. --args \'{"chain_sum": {"max_digits": 1}}\'.')
    return {task: dict(args.get(task, {})) for task in weights}


def _dataset(task: str, config: dict, seed: int, size: int):
    """reasoning-gym's dataset; a config it rejects (unknown field, failed validation) is a UsageError."""
    rg = _library()
    try:
        return rg.create_dataset(task, **{**config, "seed": seed, "size": size})
    except (TypeError, ValueError, AssertionError) as e:
        raise UsageError(f"reasoning-gym {task}: config {json.dumps(config)} is refused: {e}",
                         hint=f"--args takes the fields of {task}'s config dataclass in reasoning-gym.") from None


def _shares(weights: dict[str, float], size: int) -> dict[str, int]:
    """Rows per task in proportion to the weights, summing to `size` (largest remainders first)."""
    total = sum(weights.values())
    exact = {t: size * w / total for t, w in weights.items()}
    counts = {t: int(v) for t, v in exact.items()}
    for t in sorted(exact, key=lambda t: counts[t] - exact[t])[: size - sum(counts.values())]:
        counts[t] += 1
    return counts


def _row(task: str, config: dict, entry: dict, split: str, index: int) -> dict:
    question, answer = str(entry["question"]), str(entry["answer"])
    content = f"{question.rstrip()}\n\n{ANSWER_INSTRUCTION}"
    row = rule_row(PREFIX + task, [{"role": "user", "content": content}], "reasoning", answer, split, index,
                   question=question, answer=answer)
    row["extra_info"].update(task=task, config=json.dumps(config, sort_keys=True),
                             metadata=encode_metadata(entry.get("metadata", {})))
    return row


def encode_metadata(metadata: dict) -> str:
    """JSON text, or a Python literal where JSON would change what a scorer compares (ARC's grids
    are tuples of tuples, which JSON makes lists); `decode_metadata` reads either back."""
    text = json.dumps(metadata, sort_keys=True, default=str)
    if json.loads(text) == metadata:
        return text
    try:
        literal = repr(metadata)
        if ast.literal_eval(literal) == metadata:
            return literal
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    return text   # neither keeps every type: JSON with str() of the rest


def decode_metadata(text: str) -> dict:
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def generate(spec: str, args: dict | None, size: int, seed: int, val_fraction: float) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: `size` distinct questions (fewer when a task has fewer), a seeded
    `val_fraction` of them held out as test. Raises UsageError for an unknown task or a bad config."""
    weights = parse_tasks(spec)
    configs = _configs(weights, args)
    entries, seen = [], set()
    for i, (task, count) in enumerate(_shares(weights, size).items()):
        dataset = _dataset(task, configs[task], seed + i, count * MAX_DRAWS)
        drawn = 0
        for index in range(count * MAX_DRAWS):
            if drawn == count:
                break
            entry = dataset[index]
            if entry["question"] in seen:
                continue
            seen.add(entry["question"])
            entries.append((task, entry))
            drawn += 1
    splits = seeded_splits(entries, seed, val_fraction, noun="questions",
                           hint="pass a larger --size or a smaller --val-fraction.")
    return {split: [_row(task, configs[task], entry, split, i) for i, (task, entry) in enumerate(chosen)]
            for split, chosen in splits.items()}


def arrow_schema():
    """rlctl's row schema with extra_info's task, config and metadata (JSON text) added."""
    import pyarrow as pa

    from rlctl.data.schema import arrow_schema as base

    return base(extra_info=tuple((name, pa.string()) for name in ("task", "config", "metadata")))


def notes(spec: str, args: dict | None, size: int, seed: int, splits: dict[str, list[dict]]) -> list[str]:
    """A task that gave fewer distinct questions than asked, and one whose items are not a function of
    the seed (reasoning-gym 0.1.25's list_functions draws its first item unseeded): said, not hidden."""
    out = []
    written = sum(len(rows) for rows in splits.values())
    if written < size:
        out.append(f"reasoning-gym gave {written} distinct questions of the {size} asked for "
                   f"(a task with few possible questions; see --args for its difficulty)")
    configs = _configs(parse_tasks(spec), args)
    for i, (task, config) in enumerate(configs.items()):
        dataset = _dataset(task, config, seed + i, 1)
        if dataset[0]["question"] != dataset[0]["question"]:
            out.append(f"reasoning-gym's {task} does not repeat its questions for a seed: another prep "
                       f"with the same --seed writes other rows (train and test stay disjoint)")
    return out


def source(spec: str, args: dict | None, size: int | None) -> PrepSource:
    """The PrepSource of `reasoning-gym:SPEC`; UsageError (exit 2) for a bad spec or a missing package."""
    size = DEFAULT_SIZE if size is None else size
    weights = parse_tasks(spec)
    _configs(weights, args)
    data_source = PREFIX + next(iter(weights)) if len(weights) == 1 else PREFIX + "*"
    seeds = []   # the seed of this prep, for its notes (Generated.notes sees only the rows)

    def rows_for(seed: int, fraction: float) -> dict[str, list[dict]]:
        seeds.append(seed)
        return generate(spec, args, size, seed, fraction)

    rows = Generated(data_source, rows_for, DEFAULT_VAL_FRACTION, arrow_schema=arrow_schema,
                     notes=lambda splits: notes(spec, args, size, seeds[-1], splits))
    return PrepSource(f"{NAME}:{spec}", rows, no_sft="rows have no worked solution, only the answer")


@functools.lru_cache(maxsize=64)
def _scorer(task: str, config: str):
    """The score_answer of reasoning-gym's dataset for (task, config JSON), built once per process."""
    try:
        return _dataset(task, json.loads(config) if config else {}, 0, 1).score_answer
    except UsageError as e:
        raise ValueError(e.message) from None   # a sample error for the reward runner


def score(solution_str: str, ground_truth: str, extra_info: dict | None, task: str, *,
          format_score: float = 0.0, strict: bool = False) -> dict:
    """reasoning-gym's score_answer on the extracted answer (see the module docstring)."""
    info = extra_info or {}
    entry = {"question": info.get("question", ""), "answer": str(ground_truth),
             "metadata": decode_metadata(info.get("metadata") or "")}
    tagged = tagged_answer(solution_str)
    answer = tagged if strict else extract_answer(solution_str)
    score_answer = _scorer(info.get("task") or task, info.get("config") or "")
    try:
        value = float(score_answer(answer, entry))
    except Exception:   # a scorer that cannot parse a malformed answer (prime_factorization: int("x"))
        value = 0.0
    acc = float(value == 1.0)
    if answer is not None and value == 0.0:
        value = float(format_score)
    return {"score": value, "acc": acc, "format": float(answer is not None), "tagged": float(tagged is not None)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """A reasoning_gym/<task> row scored by that task's own score_answer."""
    return score(solution_str, ground_truth, extra_info, data_source[len(PREFIX):], format_score=format_score)


def compute_score_strict(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0,
                         **_) -> dict:
    """As compute_score, reading the answer from `<answer>` tags only (reasoning-gym's extract_answer)."""
    return score(solution_str, ground_truth, extra_info, data_source[len(PREFIX):], format_score=format_score,
                 strict=True)


# reasoning_gym_strict: by name only (reward.function); the data_source picks `reasoning_gym`
REWARDS = {"reasoning_gym": compute_score, "reasoning_gym_strict": compute_score_strict}
PREP = ()
FAMILIES = {NAME: source}   # `rlctl data prep reasoning-gym:SPEC` -> its PrepSource
