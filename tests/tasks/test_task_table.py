"""The built-in task table: every task declares the same parts, no two claim one name, and the
tables built from it (prep choices, reward names, data_source routing) are what the CLI offers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from rlctl.data.sources import FileSource, Generated, PrepSource
from rlctl.rewards.builtin import BUILTINS, default_compute_score, scorer_for_source
from rlctl.tasks import TASKS
from rlctl.tasks.prep import ALIASES, PREP_SOURCES, SOURCES, source_help


def test_every_task_declares_its_data_sources_rewards_and_prep():
    for task in TASKS:
        assert callable(task.compute_score), task.__name__
        # a family (reasoning-gym:TASK) may claim its data_sources by prefix alone
        claimed = task.DATA_SOURCES or getattr(task, "DATA_SOURCE_PREFIXES", ())
        assert claimed and all(isinstance(s, str) for s in task.DATA_SOURCES), task.__name__
        assert task.REWARDS and all(callable(fn) for fn in task.REWARDS.values()), task.__name__
        # a scorer-only task (verl's numina_* and searchR1_* rows come prepared by verl's scripts) has PREP = ()
        assert isinstance(task.PREP, tuple) and all(isinstance(p, PrepSource) for p in task.PREP), task.__name__
        assert all(isinstance(p.rows, (FileSource, Generated)) for p in task.PREP), task.__name__


def test_no_two_tasks_claim_one_name():
    def repeated(names):
        return [name for name, n in Counter(names).items() if n > 1]

    assert repeated(p.name for task in TASKS for p in task.PREP) == []
    assert repeated(list(PREP_SOURCES) + list(ALIASES)) == []
    assert repeated(name for task in TASKS for name in task.REWARDS) == []
    assert repeated(source for task in TASKS for source in task.DATA_SOURCES) == []


def test_the_tables_built_from_the_tasks():
    assert list(PREP_SOURCES) == [p.name for task in TASKS for p in task.PREP]
    assert SOURCES[-3:] == ("jsonl", "csv", "parquet")
    assert list(BUILTINS) == [name for task in TASKS for name in task.REWARDS]
    for task in TASKS:
        for source in task.DATA_SOURCES:
            assert scorer_for_source(source) is task.compute_score
    for p in PREP_SOURCES.values():   # each choice is in --help, and its rows have a built-in reward
        assert p.name in source_help()
        assert scorer_for_source(p.rows.data_source)


def test_a_prepared_row_is_scored_by_its_task():
    from rlctl.tasks import arith

    row = arith.generate(0)["train"][0]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], truth, truth)["score"] == 1.0


@pytest.mark.slow
def test_tasks_and_builtin_rewards_import_no_heavy_library():
    probe = ("import json, sys; import rlctl.tasks, rlctl.tasks.prep, rlctl.rewards.builtin; "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'ray', 'transformers', 'pyarrow'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
