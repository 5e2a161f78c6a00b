"""Config checks of [distill] (on-policy distillation), beside the teacher worker that reads them.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
check_distill looks at the keys alone; check_distill_teachers (the machine pass) loads each
teacher's tokenizer and config and reads the data's teacher_key values.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.config.checks import CheckContext, resolve_path
from rlctl.config.loader import Problem
from rlctl.config.schema import Config, distill_enabled, teacher_paths


def row_teacher_keys(rows, key: str) -> list:
    """Each row's distill.teacher_key value: its column when `rows` (a Batch or a dict of columns)
    has one, else extra_info[key]."""
    if key in rows:
        return list(rows[key])
    return [info.get(key) if isinstance(info, dict) else None for info in rows["extra_info"]]


def check_distill(c: Config, ctx: CheckContext) -> list[Problem]:
    d = c.distill
    if not distill_enabled(c):
        return []
    if c.run.kind == "sft":
        return [Problem("distill.teacher", "on-policy distillation is an RL run (the student samples); "
                                           "set run.kind = \"rl\" or remove [distill]")]
    problems = []
    if sum(map(bool, (d.teacher, d.teachers, d.teacher_url))) > 1:
        problems.append(Problem("distill.teacher", "set one of distill.teacher, [distill.teachers] and "
                                                   "distill.teacher_url, not several"))
    if d.teacher_url and not d.teacher_model:
        problems.append(Problem("distill.teacher_model", "distill.teacher_url needs the model name the server "
                                                         "expects (distill.teacher_model)"))
    if c.rollout.temperature != 1.0:
        problems.append(Problem("rollout.temperature", f"is {c.rollout.temperature}; distillation compares the "
                                "student's sampling distribution with the teacher's at temperature 1, so the "
                                "student must sample at temperature 1 too (set rollout.temperature = 1.0)"))
    if c.actor.use_kl_loss or c.algorithm.kl_in_reward:
        which = "actor.use_kl_loss" if c.actor.use_kl_loss else "algorithm.kl_in_reward"
        problems.append(Problem(which, "a KL to the reference policy beside distillation pulls the student back "
                                       "to its start while the teacher pulls it away; usually turn it off",
                                severity="warning"))
    if c.rollout.top_p < 1.0 or c.rollout.top_k:
        problems.append(Problem("rollout.top_p", "top_p / top_k truncate the student's sampling distribution; "
                                                 "its log-probs (and the reverse KL) are of the untruncated one",
                                severity="warning"))
    return problems


def check_distill_teachers(c: Config, ctx: CheckContext) -> list[Problem]:
    """Each teacher is a model folder (or cached hub id) with the student's vocabulary, and every
    training and validation row's teacher_key value names a teacher."""
    if not distill_enabled(c) or c.run.kind == "sft":
        return []
    problems = []
    for name, path in teacher_paths(c).items():
        key = f"distill.teachers.{name}" if c.distill.teachers else "distill.teacher"
        problems += _check_teacher(key, path, c, ctx)
    if c.distill.teachers:
        problems += _check_routing(c, ctx)
    return problems


def _check_teacher(key: str, path: str, c: Config, ctx: CheckContext) -> list[Problem]:
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model

    try:
        source = resolve_model(path, ctx.base_dir, key=key)
    except DataError as e:
        return [Problem(key, e.message.removeprefix(f"{key} ") + "; point it at a merged model folder with the "
                             "student's tokenizer (`rlctl merge RUN --to-hf models/teacher`) or a cached hub id")]
    if source.folder is None:
        return []   # on the hub: checked when the worker loads it
    if not (source.folder / "config.json").is_file():
        return [Problem(key, f"{path} has no config.json; a teacher is a Hugging Face model folder (a run folder: "
                             "`rlctl merge RUN --to-hf OUT`, then point at OUT)")]
    student = resolve_path(ctx.base_dir, c.model.path)
    if not student.is_dir():
        return []   # model.path's own check reports it
    return _vocab_problems(key, source.folder, student)


def _vocab_problems(key: str, teacher: Path, student: Path) -> list[Problem]:
    """The teacher reads the student's token ids: both tokenizers must map the same strings to the same ids."""
    from transformers import AutoTokenizer

    from rlctl.models.loading import quiet_transformers

    quiet_transformers()
    try:
        t_vocab, s_vocab = (AutoTokenizer.from_pretrained(str(p)).get_vocab() for p in (teacher, student))
    except (OSError, ValueError) as e:
        return [Problem(key, f"cannot load the tokenizer at {teacher}: {str(e).splitlines()[0]}")]
    if t_vocab != s_vocab:
        differ = sum(1 for tok, i in s_vocab.items() if t_vocab.get(tok) != i) + len(set(t_vocab) - set(s_vocab))
        return [Problem(key, f"the teacher's vocabulary differs from model.path's ({len(t_vocab)} vs "
                             f"{len(s_vocab)} tokens, {differ} differ): distillation scores the student's token "
                             "ids with the teacher, so both need the same tokenizer (a model of the same family)")]
    t_size = json.loads((teacher / "config.json").read_text()).get("vocab_size", 0)
    if t_size and t_size < len(s_vocab):
        return [Problem(key, f"the teacher's embedding has {t_size} rows, fewer than the {len(s_vocab)} tokens "
                             "of the shared tokenizer")]
    return []


def _check_routing(c: Config, ctx: CheckContext) -> list[Problem]:
    """Every row's teacher_key value is a teacher's name: one line per file with the unknown values."""
    import pyarrow.parquet as pq

    key, names, problems = c.distill.teacher_key, set(c.distill.teachers), []
    for file in (*c.data.train_files, *c.data.val_files):
        try:
            table = pq.read_table(resolve_path(ctx.base_dir, file)).to_pydict()
        except Exception:
            continue   # a missing or broken file is check_data_files' to report
        if key not in table and "extra_info" not in table:
            problems.append(Problem("distill.teacher_key", f"{file} has no column {key!r} (nor extra_info)"))
            continue
        unknown = sorted({str(v) for v in row_teacher_keys(table, key) if v not in names})
        if unknown:
            problems.append(Problem("distill.teacher_key", f"{file}: {key} value(s) {', '.join(map(repr, unknown[:5]))}"
                                    f"{' ...' if len(unknown) > 5 else ''} name no teacher of [distill.teachers] "
                                    f"({', '.join(sorted(names))}); add a teacher for each or fix the data"))
    return problems
