"""`rlctl data prep`: a source (hub, local files, or the synthetic task) -> verl parquet per split.

The choices are the built-in tasks' PrepSources (each task's PREP in rlctl.tasks.TASKS: gsm8k, ...),
the families a task names in FAMILIES (`reasoning-gym:TASK`: the part after the colon, `--size` and
`--args` make the PrepSource), and the user's own jsonl / csv / parquet files
(rlctl.data.sources.FILE_FORMATS).

With `sft=True` (`--sft`) each row also gets a `response` column: the reference solution (gsm8k's
worked answer, math's solution, arith's sum, your answer column), the SFT target; the RL columns
stay, so the same file serves `rlctl eval` and an RL run.

With `tools=("python",)` (`--tools python`, gsm8k and math) each prompt starts with a system message
offering those built-in tools and asking for the final answer in the source's format (`#### <number>`),
for multi-turn RL with `[rollout.multi_turn] tools` naming the same tools; the user message, ground
truth and data_source stay as without it, so the built-in reward scores the conversations unchanged.

Every record either becomes a row or a counted `Problem`; with on_error="fail" (the default)
any problem stops the prep with the first few shown, with "skip" they are dropped and counted
in the report. Duplicate rows (same messages and ground truth within a split) are always dropped
and counted. Each split is written to a temp file and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlctl.data.images import absolute_image_paths, with_images_column
from rlctl.data.readers import read_records, row_problem
from rlctl.data.sources import (FILE_FORMATS, SPLIT_NAMES, FileSource, Generated, PrepSource, RowError,
                                convert, file_source, locate)
from rlctl.errors import DataError, UsageError
from rlctl.rollouts.table import ENVIRONMENTS
from rlctl.tasks import TASKS

PREP_SOURCES = {p.name: p for task in TASKS for p in task.PREP}   # the built-in tasks' choices, in order
# "family:SPEC" sources: family -> (spec, args, size) -> PrepSource (reasoning-gym:TASK)
FAMILIES = {family: make for task in TASKS for family, make in getattr(task, "FAMILIES", {}).items()}
FAMILY_WORD = {"verifiers": "ID"}              # what follows the colon, where it is not a TASK
FAMILY_EXAMPLE = {"verifiers": "my-env"}
SOURCES = (*PREP_SOURCES, *FILE_FORMATS)
ALIASES = {alias: p.name for p in PREP_SOURCES.values() for alias in p.aliases}
# `--tools`: a system message offers built-in tools and says how to end, in the task's answer format
# (verl's gsm8k_multiturn_w_tool.py does the same for its tool; the user message stays as without it)
TOOL_OFFERS = {"python": "the `python` tool runs a Python program you write and returns what it prints "
                         "(print the values you need)",
               "calculator": "the `calculator` tool evaluates an arithmetic expression such as `4821 * 37`"}
SHOWN_PROBLEMS = 3


def source_help() -> str:
    """The SOURCE words of `rlctl data prep --help`: every task's choice, then the user's own files."""
    words = []
    for family in FAMILIES:
        words.append(f"{family}:{FAMILY_WORD.get(family, 'TASK')} (--size, --seed, --args; docs/environments.md)")
    for p in PREP_SOURCES.values():
        notes = "; ".join(filter(None, (p.help, f"alias: {', '.join(p.aliases)}" if p.aliases else "")))
        words.append(f"{p.name} ({notes})" if notes else p.name)
    return ", ".join(words) + f", or {' / '.join(FILE_FORMATS)} for your own files."


def tool_system_prompt(source: str, tools: tuple[str, ...]) -> str:
    """The system message of a tool-use prompt: which tools there are, and the final-answer format that
    the source's built-in reward reads (`#### <number>` for gsm8k), so the reward scores it unchanged."""
    offers = "; ".join(TOOL_OFFERS[t] for t in tools)
    return ("You are a math expert. Solve the problem step by step. You can call tools: "
            f"{offers}. Use {'it' if len(tools) == 1 else 'them'} for the calculations, then give the final "
            f"answer on the last line {PREP_SOURCES[source].final_answer_format}.")


@dataclass(frozen=True)
class PrepOptions:
    source: str | None = None          # a local file/folder or a hub dataset id
    out: Path | None = None            # default data/<name>/
    splits: tuple = ()                 # empty = every split there is
    limit: int | None = None           # keep the first N rows of each split
    seed: int = 0
    val_fraction: float | None = None  # None = the source's default (arith 0.1, files 0)
    on_error: str = "fail"
    prompt_col: str | None = None
    answer_col: str | None = None
    system: str | None = None
    instruction: str | None = None
    data_source: str | None = None
    force: bool = False
    sft: bool = False                  # also write `response` (the reference solution) for SFT
    tools: tuple = ()                  # built-in tools the system message offers (tool-use RL prompts)
    size: int | None = None            # a family's rows (reasoning-gym: questions drawn; None = its default)
    args: dict | None = None           # a family's settings (reasoning-gym: the task's config)


@dataclass
class SplitRows:
    rows: list = field(default_factory=list)
    problems: list = field(default_factory=list)    # rows that could not be used
    duplicates: list = field(default_factory=list)  # rows dropped as repeats


def _family(name: str) -> tuple[str, str] | None:
    """("reasoning-gym", "chain_sum") for "reasoning-gym:chain_sum"; None for a name of no family."""
    family, colon, spec = name.partition(":")
    return (family, spec) if colon and family in FAMILIES else None


def _entry(name: str, opts: PrepOptions) -> PrepSource | None:
    """The PrepSource of a built-in task or a family's spec; None for the user's own files."""
    member = _family(name)
    if member is not None:
        family, spec = member
        return FAMILIES[family](spec, opts.args, opts.size)
    return PREP_SOURCES.get(name)


def _task_rows(name: str, opts: PrepOptions) -> FileSource | Generated | None:
    """A built-in task's FileSource or Generated rows; None for the user's own jsonl / csv / parquet."""
    entry = _entry(name, opts)
    return entry.rows if entry else None


def _check_options(name: str, opts: PrepOptions) -> None:
    if name in FAMILIES:
        word, example = FAMILY_WORD.get(name, "TASK"), FAMILY_EXAMPLE.get(name, "leg_counting")
        what = "an environment" if any(env.name == name for env in ENVIRONMENTS) else "a task"
        raise UsageError(f"{name} needs {what}: {name}:{word}", hint=f"e.g. rlctl data prep {name}:{example}.")
    if _family(name) is None and (opts.size is not None or opts.args is not None):
        raise UsageError(f"--size and --args are for {' / '.join(f'{f}:TASK' for f in FAMILIES)}, not {name}",
                         hint="the built-in tasks have a fixed size; use --limit to keep fewer rows.")
    if opts.size is not None and opts.size < 1:
        raise UsageError(f"--size {opts.size} must be at least 1")
    if name not in SOURCES and _family(name) is None:
        import difflib

        close = difflib.get_close_matches(name, list(SOURCES), n=1)
        raise UsageError(f"unknown source {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                         hint=f"choose one of {', '.join((*(f'{f}:TASK' for f in FAMILIES), *SOURCES))}.")
    if opts.on_error not in ("fail", "skip"):
        raise UsageError(f"--on-error {opts.on_error!r} is not fail or skip")
    if opts.val_fraction is not None and not 0 <= opts.val_fraction < 1:
        raise UsageError(f"--val-fraction {opts.val_fraction} is outside [0, 1)")
    if opts.limit is not None and opts.limit < 1:
        raise UsageError(f"--limit {opts.limit} must be at least 1")
    entry = _entry(name, opts)   # None: the user's own files
    if entry and isinstance(entry.rows, Generated) and opts.source:
        raise UsageError(f"the {name} task is generated offline and takes no --source")
    if opts.sft and entry and entry.no_sft:
        raise UsageError(f"--sft: {name} {entry.no_sft}",
                         hint="use --sft with gsm8k, math, arith or your own jsonl/csv/parquet with an answer column.")
    if opts.tools:
        _check_tools(name, opts)
    if entry and entry.needs_source and not opts.source:
        message, hint = entry.needs_source
        raise UsageError(message, hint=hint)


def _check_tools(name: str, opts: PrepOptions) -> None:
    unknown = [t for t in opts.tools if t not in TOOL_OFFERS]
    if unknown:
        raise UsageError(f"--tools: unknown tool(s) {', '.join(map(repr, unknown))}",
                         hint=f"built-in tools: {', '.join(TOOL_OFFERS)} (comma-separated).")
    with_tools = [p.name for p in PREP_SOURCES.values() if p.final_answer_format]
    if name not in with_tools:
        raise UsageError(f"--tools is for {' and '.join(with_tools)} prompts, not {name}",
                         hint="for your own files write the tool instructions with --system.")
    if opts.sft:
        raise UsageError("--tools with --sft: the reference solutions call no tool, so there is no tool-use "
                         "transcript to imitate", hint="prepare tool-use RL prompts without --sft.")
    if opts.system is not None:
        raise UsageError("--tools writes the system message; --system would replace it",
                         hint="use one of them.")


def _check_columns(task: FileSource, raw) -> None:
    """A column the mapping names but the file lacks is a usage mistake, not a bad row (a source whose
    adapter reads the records' own layout, such as verl rows, names no columns of the file)."""
    if not raw.records or task.adapter is not None:
        return
    for flag, column in (("--prompt-col", task.prompt_col), ("--answer-col", task.answer_col)):
        if column not in raw.columns:
            raise DataError(f"{raw.path} has no column {column!r} (columns: {', '.join(map(str, raw.columns))})",
                            hint=f"pass {flag} NAME to say which column holds it.")


def read_split(task: FileSource, split: str, paths: list[Path]) -> SplitRows:
    """Convert every record of a split's files, deduplicating on (messages, ground truth)."""
    out, seen = SplitRows(), {}
    raws = [read_records(path) for path in paths]
    for raw in raws:
        _check_columns(task, raw)
        out.problems.extend(raw.problems)
        if task.image_col:   # a path in the images column is relative to its own file
            absolute_image_paths([record for _, record in raw.records], task.image_col, raw.path.parent)
    records = [record for raw in raws for record in raw.records]
    for index, (where, record) in enumerate(records):  # index: the record's place in its split
        try:
            row = convert(task, record, split, index)
        except RowError as e:
            out.problems.append(row_problem(where, e.kind, e.detail))
            continue
        # images count too: geo3k asks "Find x." of many different figures
        key = (tuple((m["role"], m["content"]) for m in row["prompt"]), row["reward_model"]["ground_truth"],
               tuple(hashlib.sha256(image["bytes"]).digest() for image in row.get("images", ())))
        if key in seen:
            out.duplicates.append(row_problem(where, "duplicate", f"duplicate of {seen[key]}"))
        else:
            seen[key] = where
            out.rows.append(row)
    return out


def _carve_validation(splits: dict, fraction: float, seed: int) -> None:
    """Move a seeded random `fraction` of train into a new test split (source order kept)."""
    train = splits["train"].rows
    n_test = max(1, round(len(train) * fraction))
    if n_test >= len(train):
        raise DataError(f"--val-fraction {fraction} leaves no training rows ({len(train)} rows)")
    chosen = set(random.Random(seed).sample(range(len(train)), n_test))
    test = SplitRows(rows=[r for i, r in enumerate(train) if i in chosen])
    splits["train"].rows = [r for i, r in enumerate(train) if i not in chosen]
    for row in test.rows:
        row["extra_info"]["split"] = "test"
    splits["test"] = test


def _gather(name: str, opts: PrepOptions) -> tuple[str, FileSource | None, dict, list[str]]:
    """(origin, task, {split: SplitRows}, notes) before limits and writing."""
    notes = []
    rows = _task_rows(name, opts)
    if isinstance(rows, Generated):
        fraction = rows.default_val_fraction if opts.val_fraction is None else opts.val_fraction
        generated = rows.generate(opts.seed, fraction)
        notes += rows.notes(generated) if rows.notes else []
        return f"generated (seed {opts.seed})", None, {s: SplitRows(rows=r) for s, r in generated.items()}, notes
    stem = Path(opts.source).stem if opts.source else name
    system = tool_system_prompt(name, opts.tools) if opts.tools else opts.system
    overrides = {"prompt_col": opts.prompt_col, "answer_col": opts.answer_col, "instruction": opts.instruction,
                 "system": system, "data_source": opts.data_source}
    task = replace(rows or file_source(name, stem), **{k: v for k, v in overrides.items() if v is not None})
    origin, files, ignored = locate(task, opts.source)
    if ignored:
        notes.append(f"ignored {len(ignored)} file(s) not named after a split: "
                     + ", ".join(p.name for p in ignored[:5]))
    ordered = sorted(files, key=SPLIT_NAMES.index)  # train first, whatever the folder listing says
    splits = {split: read_split(task, split, files[split]) for split in ordered}
    if opts.tools:
        listed = ", ".join(f'"{t}"' for t in opts.tools)
        notes.append(f"the prompts offer {', '.join(opts.tools)}: train with [rollout.multi_turn] enable = true, "
                     f"tools = [{listed}]")
    if opts.val_fraction:
        if set(splits) == {"train"}:
            _carve_validation(splits, opts.val_fraction, opts.seed)
        else:
            notes.append("--val-fraction ignored: the source has its own evaluation split")
    return origin, task, splits, notes


def _pick_splits(splits: dict, wanted: tuple, origin: str) -> dict:
    """--splits names splits the source has; a name it lacks is a usage mistake (often a typo)."""
    missing = [s for s in wanted if s not in splits]
    if missing:
        raise UsageError(f"--splits: {', '.join(missing)} not in {origin} (found: {', '.join(splits)})",
                         hint=f"pass --splits with some of {', '.join(splits)}, or leave it out for all.")
    return {s: splits[s] for s in wanted}


def _fail_on_problems(splits: dict, origin: str) -> None:
    problems = [p for s in splits.values() for p in s.problems]
    if not problems:
        return
    shown = "; ".join(map(str, problems[:SHOWN_PROBLEMS]))
    more = f" (and {len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
    raise DataError(f"{len(problems)} bad row(s) in {origin}: {shown}{more}",
                    hint="fix them, or pass --on-error skip to drop and count them.")


def out_dir(name: str, opts: PrepOptions) -> Path:
    if opts.out is not None:
        return Path(opts.out)
    # a task is named after itself; a folder of the user's files (or code problems) after the source
    rows = _task_rows(name, opts)
    label = name if isinstance(rows, Generated) or (rows and rows.hub_id) else Path(opts.source or name).stem
    if _family(name):   # a folder name: reasoning-gym:chain_sum=2,gcd -> reasoning-gym-chain_sum-2-gcd
        label = re.sub(r"[^\w.-]+", "-", label).strip("-")
    if opts.tools:
        return Path("data") / "-".join((label, *opts.tools))   # data/gsm8k-python
    return Path("data") / (f"{label}-sft" if opts.sft else label)


def _write(out: Path, tables: dict, force: bool) -> dict[str, str]:
    """Each split to <out>/<split>.parquet, all or none; refuses to overwrite without --force."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.utils.atomic_files import write_files

    targets = {split: out / f"{split}.parquet" for split in tables}
    existing = [str(p) for p in targets.values() if p.is_file()]
    if existing and not force:
        raise UsageError(f"{', '.join(existing)} already exist(s)", hint="pass --force to overwrite, or --out DIR.")
    files = {}
    for split, table in tables.items():
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        files[targets[split].name] = sink.getvalue().to_pybytes()
    write_files(out, files, hint="pass --out a folder you can write to.")
    return {split: str(p) for split, p in targets.items()}


def prepare(name: str, opts: PrepOptions) -> dict:
    """Run a prep end to end and return the report (rows and skips per split, files, notes)."""
    import pyarrow as pa

    from rlctl.data.schema import arrow_schema

    name = ALIASES.get(name, name)
    _check_options(name, opts)
    origin, task, splits, notes = _gather(name, opts)
    if opts.splits:
        splits = _pick_splits(splits, opts.splits, origin)
    if opts.on_error == "fail":
        _fail_on_problems(splits, origin)
    for split, rows in splits.items():
        if not rows.rows:
            raise DataError(f"split {split!r} of {origin} has no usable rows ({len(rows.problems)} bad)",
                            hint="check the column mapping (--prompt-col/--answer-col) and the file.")
    limited = {s: max(0, len(r.rows) - opts.limit) if opts.limit else 0 for s, r in splits.items()}
    # a generated task may write more columns (calc-tools: the SFT `messages` and `tools`)
    generated = _task_rows(name, opts)
    own_schema = generated.arrow_schema if isinstance(generated, Generated) else None
    schema = (own_schema or arrow_schema)()
    if isinstance(generated, FileSource) and generated.image_col:
        schema = with_images_column(schema)
    if opts.sft:   # SFT data = the RL row + the response to imitate (eval and GRPO read the same file)
        schema = schema.append(pa.field("response", pa.string()))
        for rows in splits.values():
            for row in rows.rows:
                row["response"] = str(row["extra_info"]["answer"])
    tables = {s: pa.Table.from_pylist(r.rows[: opts.limit], schema=schema) for s, r in splits.items()}
    out = out_dir(name, opts)
    files = _write(out, tables, opts.force)
    data_source = (task or _entry(name, opts).rows).data_source
    return _report(name, origin, data_source, out, splits, tables, files, limited, notes)


def _report(name, origin, data_source, out, splits, tables, files, limited, notes) -> dict:
    per_split = {}
    for split, rows in splits.items():
        skipped = dict(Counter(p.kind for p in rows.problems + rows.duplicates))
        per_split[split] = {"rows": tables[split].num_rows, "file": files[split], "skipped": skipped,
                            "over_limit": limited[split]}
    shown = [str(p) for rows in splits.values() for p in rows.problems + rows.duplicates][:5]
    return {"source": name, "origin": origin, "data_source": data_source, "out": str(out),
            "splits": per_split, "skipped_examples": shown, "notes": notes}
