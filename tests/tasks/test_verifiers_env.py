"""`rlctl data prep verifiers:ID`: rows of a real verifiers environment (tests/support/vf_env.py, the verifiers
package of rlctl[envs]) and the one-line refusals. The environments' episodes: tests/agent/test_verifiers_agent.py.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from support.vf_env import write_package

from rlctl.errors import DataError, UsageError
from rlctl.tasks import verifiers_env
from rlctl.tasks.prep import PrepOptions, prepare


def test_a_missing_verifiers_package_is_one_line_exit_2(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)   # what `import verifiers` meets when it is not installed
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(UsageError, match="need the verifiers package") as e:
        verifiers_env.source("vf-calc", None, None)
    assert e.value.exit_code == 2 and "rlctl[envs]" in e.value.hint


def test_rlctls_scorer_refuses_verifiers_rows_and_names_the_agent():
    with pytest.raises(UsageError, match="rewarded by their verifiers environment") as e:
        verifiers_env.compute_score("verifiers/x", "4", "", {})
    assert 'rollout.agent.function = "verifiers"' in e.value.hint


@pytest.fixture(scope="module")
def vf_calc(tmp_path_factory):
    if not os.environ.get("CI"):
        pytest.importorskip("verifiers.v1", reason="rlctl[envs] is not installed (pip install -e '.[envs]')")
    root = write_package(tmp_path_factory.mktemp("vf_pkg"))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


@pytest.mark.slow   # importing verifiers takes 5-20 s
def test_prep_writes_the_tasks_with_their_data_and_the_offline_config(vf_calc, tmp_path):
    import pyarrow.parquet as pq

    report = prepare("verifiers:vf-calc", PrepOptions(out=tmp_path / "d", val_fraction=0.5, args={"num_tasks": 4}))
    assert report["data_source"] == "verifiers/vf-calc"
    train, test = (pq.read_table(tmp_path / "d" / f"{s}.parquet").to_pylist() for s in ("train", "test"))
    assert len(train) == 2 and len(test) == 2
    questions = {r["extra_info"]["question"] for r in train} | {r["extra_info"]["question"] for r in test}
    assert len(questions) == 4   # held out, not repeated
    row = train[0]
    assert row["data_source"] == "verifiers/vf-calc" and row["prompt"][0]["role"] == "user"
    spec = json.loads(row["extra_info"]["verifiers"])
    assert spec["config"]["taskset"] == {"id": "vf-calc", "num_tasks": 4}
    assert spec["config"]["agent"] == {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
    assert spec["task"]["prompt"] == row["prompt"][0]["content"] and spec["task"]["answer"]
    assert spec["renderer"] == verifiers_env.DEFAULT_RENDERER


@pytest.mark.slow
def test_unknown_ids_bad_args_and_failing_loads_are_one_line(vf_calc, tmp_path):
    with pytest.raises(UsageError, match="no such environment") as e:
        prepare("verifiers:no-such-env", PrepOptions(out=tmp_path / "a"))
    assert e.value.exit_code == 2
    with pytest.raises(DataError, match="failed to load") as e:   # a field the taskset does not have
        prepare("verifiers:vf-calc", PrepOptions(out=tmp_path / "b", args={"num_tasks": "many"}))
    assert e.value.exit_code == 3 and "\n" not in e.value.message
    with pytest.raises(DataError, match="cannot load its questions") as e:
        prepare("verifiers:vf-calc", PrepOptions(out=tmp_path / "c", args={"fail": "load"}))
    assert e.value.exit_code == 3
    with pytest.raises(UsageError, match="needs an environment"):
        prepare("verifiers:", PrepOptions(out=tmp_path / "d"))


def test_validate_refuses_verifiers_rows_without_the_built_in_agent(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.rollouts.checks import check_environment_rows
    from rlctl.config.checks import CheckContext
    from rlctl.config.loader import load_config
    from rlctl.project import write_project

    write_project(tmp_path / "p", "grpo-agent-smollm2-cpu", "models/m")
    pq.write_table(pa.table({"data_source": ["verifiers/vf-calc", "arith"]}), tmp_path / "p" / "rows.parquet")
    ctx = CheckContext(base_dir=tmp_path / "p", raw={})
    files = ['data.train_files=["rows.parquet"]', "data.val_files=[]"]
    without = load_config(tmp_path / "p" / "rlctl.toml", files + ['rollout.agent.function="agent.py:run"'])
    (problem,) = check_environment_rows(without.config, ctx)
    assert problem.key == "rollout.agent.function" and "verifiers/vf-calc" in problem.message
    with_agent = load_config(tmp_path / "p" / "rlctl.toml", files + ['rollout.agent.function="verifiers"'])
    assert check_environment_rows(with_agent.config, ctx) == []
    scorer = load_config(tmp_path / "p" / "rlctl.toml", files + ['rollout.agent.function="verifiers"',
                                                                 'rollout.agent.reward="sum"'])
    (problem,) = check_environment_rows(scorer.config, ctx)
    assert problem.key == "rollout.agent.reward"


def test_the_feedback_recipe_validates_and_reads_what_its_headers_prep_writes(tmp_path):
    import shlex
    from pathlib import Path

    from rlctl.rollouts.checks import check_environment_rows
    from rlctl.config.checks import CheckContext
    from rlctl.config.loader import load_config
    from rlctl.project import write_project
    from rlctl.tasks.prep import out_dir
    from rlctl.validate import validate

    package = str(Path(__file__).resolve().parents[2] / "examples" / "environments" / "sum_feedback")
    sys.path.insert(0, package)   # as `pip install -e` of it would make it importable
    try:
        write_project(tmp_path / "p", "grpo-verifiers-feedback-smollm2-cpu", "models/m")
        header = (tmp_path / "p" / "rlctl.toml").read_text().split("# data: rlctl data prep ", 1)[1].splitlines()[0]
        words = shlex.split(header)
        spec, val = words[0], float(words[words.index("--val-fraction") + 1])
        args = json.loads(words[words.index("--args") + 1])
        opts = PrepOptions(val_fraction=val, args=args)
        prepare(spec, PrepOptions(out=tmp_path / "p" / out_dir(spec, opts), val_fraction=val, args=args))
    finally:
        sys.path.remove(package)
    loaded = load_config(tmp_path / "p" / "rlctl.toml")
    problems, _ = validate(loaded, machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    assert check_environment_rows(loaded.config, CheckContext(base_dir=tmp_path / "p", raw={})) == []
    for files in (loaded.config.data.train_files, loaded.config.data.val_files):
        (path,) = files
        assert (tmp_path / "p" / path).is_file()
