"""reasoning-gym tasks: `rlctl data prep reasoning-gym:TASK` rows and the built-in reward that scores them
with reasoning-gym's own `score_answer`, against the real package (rlctl[envs]; skipped without it,
a failure under CI=true)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pyarrow.parquet as pq
import pytest

from rlctl.cli.main import main
from rlctl.errors import UsageError
from rlctl.rewards.builtin import default_compute_score, scorer_for_source
from rlctl.tasks import reasoning_gym
from rlctl.tasks.prep import PrepOptions, prepare

if importlib.util.find_spec("reasoning_gym") is None:
    WHY = "reasoning-gym is not installed (pip install 'rlctl[envs]')"
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"CI=true but {WHY}")
    pytest.skip(WHY, allow_module_level=True)

# a count, a sum, a string, a sorted list, ARC grids (tuples in the metadata), a scorer that raises on
# text it cannot parse (prime_factorization), and one whose right answers are many (countdown)
TASKS = ["leg_counting", "chain_sum", "spell_backward", "number_sorting", "arc_agi", "prime_factorization",
         "countdown"]


def prep(spec: str, tmp_path, **kw) -> dict:
    kw.setdefault("size", 12)
    return prepare(f"reasoning-gym:{spec}", PrepOptions(out=tmp_path / spec.replace(",", "_"), force=True, **kw))


def rows(report: dict, split: str) -> list[dict]:
    return pq.read_table(report["splits"][split]["file"]).to_pylist()


def their_entry(row: dict, seed: int) -> dict:
    """The entry reasoning-gym itself generates for this row (same task, config, seed and index)."""
    import json

    import reasoning_gym as rg

    info = row["extra_info"]
    index = reasoning_gym.decode_metadata(info["metadata"])["source_index"]
    dataset = rg.create_dataset(info["task"], **json.loads(info["config"]), seed=seed, size=index + 1)
    entry = dataset[index]
    assert entry["question"] == info["question"] and entry["answer"] == row["reward_model"]["ground_truth"]
    return dataset, entry


def their_score(dataset, answer, entry) -> float:
    try:
        return float(dataset.score_answer(answer, entry))
    except Exception:   # reasoning-gym's scorer raised on a malformed answer: rlctl scores it 0
        return 0.0


@pytest.mark.parametrize("task", TASKS)
def test_the_builtin_agrees_with_reasoning_gyms_scorer(task, tmp_path):
    report = prep(task, tmp_path, size=6, seed=5, val_fraction=0.0)
    for row in rows(report, "train"):
        dataset, entry = their_entry(row, seed=5)
        truth = row["reward_model"]["ground_truth"]
        last_line = truth.strip().splitlines()[-1].strip()   # all of a one-line answer; an ARC grid's last row
        cases = {   # response -> the answer reasoning-gym's scorer gets: (default, strict)
            f"Let me think.\n<answer>{truth}</answer>": (truth, truth),                    # right
            f"<answer>draft</answer> then <answer> {truth} </answer>": (truth, truth),      # the last pair counts
            f"Working it out.\n{truth}\n\n": (last_line, None),                           # right, last line
            "<answer>not the answer 17</answer>": ("not the answer 17",) * 2,               # wrong
            f"<answer>{truth}x</answer>": (f"{truth}x",) * 2,                               # nearly right
            f"The answer is {truth}.": (f"The answer is {truth}.", None),                   # in a sentence
            f"<answer>{truth}": (f"<answer>{truth}".splitlines()[-1].strip(), None),        # malformed: unclosed
            " \n ": (None, None),                                                           # malformed: blank
        }
        for response, answers in cases.items():
            for function, answer in zip((default_compute_score, reasoning_gym.compute_score_strict), answers):
                ours = function(row["data_source"], response, truth, row["extra_info"])
                assert ours["score"] == pytest.approx(their_score(dataset, answer, entry)), (task, response)
                assert ours["format"] == float(answer is not None)
        right = default_compute_score(row["data_source"], f"<answer>{truth}</answer>", truth, row["extra_info"])
        assert right == {"score": 1.0, "acc": 1.0, "format": 1.0, "tagged": 1.0}, task


def test_rows_route_to_the_builtin_by_data_source(tmp_path):
    row = rows(prep("leg_counting", tmp_path), "train")[0]
    assert row["data_source"] == "reasoning_gym/leg_counting"
    assert scorer_for_source(row["data_source"]) is reasoning_gym.compute_score
    assert row["prompt"][-1]["content"].endswith(reasoning_gym.ANSWER_INSTRUCTION)
    assert row["extra_info"]["task"] == "leg_counting" and row["ability"] == "reasoning"


def test_format_score_pays_a_wrong_answer_that_was_found(tmp_path):
    row = rows(prep("leg_counting", tmp_path), "train")[0]
    truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
    score = reasoning_gym.compute_score
    assert score(row["data_source"], "<answer>-1</answer>", truth, info, format_score=0.1)["score"] == 0.1
    assert score(row["data_source"], "", truth, info, format_score=0.1)["score"] == 0.0
    strict = reasoning_gym.compute_score_strict
    assert strict(row["data_source"], "-1", truth, info, format_score=0.1)["score"] == 0.0
    assert score(row["data_source"], f"<answer>{truth}</answer>", truth, info, format_score=0.1)["score"] == 1.0


def test_prep_is_seeded_and_the_test_split_shares_no_question_with_train(tmp_path):
    first = prep("chain_sum", tmp_path / "a", size=60, seed=3, val_fraction=0.25)
    again = prep("chain_sum", tmp_path / "b", size=60, seed=3, val_fraction=0.25)
    other = prep("chain_sum", tmp_path / "c", size=60, seed=4, val_fraction=0.25)
    for split in ("train", "test"):
        assert rows(first, split) == rows(again, split)
    assert rows(first, "train") != rows(other, "train")
    train, test = ({r["extra_info"]["question"] for r in rows(first, s)} for s in ("train", "test"))
    assert (len(train), len(test)) == (45, 15) and not train & test


def test_a_small_task_stops_short_with_distinct_questions_and_says_so(tmp_path):
    # one- to two-term sums of one-digit numbers: fewer than 300 distinct questions exist
    args = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_negation": False}
    report = prep("chain_sum", tmp_path, size=300, args=args)
    questions = [r["extra_info"]["question"] for s in ("train", "test") for r in rows(report, s)]
    assert len(questions) == len(set(questions)) < 300
    assert any("distinct questions of the 300 asked for" in note for note in report["notes"])


def test_a_composite_splits_rows_by_weight_and_each_row_names_its_task(tmp_path):
    args = {"chain_sum": {"max_digits": 1}}
    report = prep("chain_sum=3,leg_counting", tmp_path, size=40, val_fraction=0.0, args=args)
    got = rows(report, "train")
    tasks = [r["extra_info"]["task"] for r in got]
    assert (tasks.count("chain_sum"), tasks.count("leg_counting")) == (30, 10)
    assert {r["data_source"] for r in got} == {"reasoning_gym/chain_sum", "reasoning_gym/leg_counting"}
    for row in got:
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], f"<answer>{truth}</answer>", truth,
                                     row["extra_info"])["score"] == 1.0


@pytest.mark.parametrize(("argv", "message"), [
    (["reasoning-gym:leg_countin"], "unknown reasoning-gym task 'leg_countin' (did you mean 'leg_counting'?)"),
    (["reasoning-gym"], "reasoning-gym needs a task"),
    (["reasoning-gym:chain_sum", "--args", "{max_digits: 1}"], "--args is not JSON"),
    (["reasoning-gym:chain_sum", "--args", "[1]"], "--args is a JSON list, not an object"),
    (["reasoning-gym:chain_sum", "--args", '{"max_digit": 1}'], "config {\"max_digit\": 1} is refused"),
    (["reasoning-gym:chain_sum=0"], "weight '0' of 'chain_sum' is not a positive number"),
    (["reasoning-gym:chain_sum,gcd", "--args", '{"max_digits": 1}'], "--args for a composite maps each"),
    (["arith", "--size", "10"], "--size and --args are for reasoning-gym:TASK"),
])
def test_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    assert main(["data", "prep", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_package_not_installed_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)   # `import reasoning_gym` raises ImportError
    with pytest.raises(UsageError, match=r"reasoning-gym is not installed.*rlctl\[envs\]"):
        reasoning_gym.generate("leg_counting", None, 4, 0, 0.1)
    assert main(["data", "prep", "reasoning-gym:leg_counting", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_recipe_validates_as_shipped_and_reads_what_its_prep_writes():
    from pathlib import Path

    from rlctl.config.loader import load_config
    from rlctl.tasks.prep import out_dir
    from rlctl.validate import validate

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "grpo-reasoning-gym-smollm2-cpu.toml"
    loaded = load_config(recipe)
    config = loaded.config
    problems, plan = validate(loaded, machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    # the header's prep command writes the files the recipe trains and validates on
    spec = recipe.read_text().split("# data: rlctl data prep ", 1)[1].split()[0]
    assert list(config.data.train_files) == [f"{out_dir(spec, PrepOptions(size=1000))}/train.parquet"]
    assert config.reward.function == "" and config.reward.timeout_s >= 60


@pytest.mark.slow
def test_the_recipe_trains_two_steps_on_reasoning_gym_rows(tmp_path, tiny_model_dir, ray_cluster):
    import json

    from support.cli import rlctl_here

    proj = tmp_path / "proj"
    assert rlctl_here("init", proj, "--recipe", "grpo-reasoning-gym-smollm2-cpu", "--model", tiny_model_dir).returncode == 0
    prep = rlctl_here("data", "prep", "reasoning-gym:chain_sum", "--size", "40", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    train = rlctl_here("train", "run.total_steps=2", "run.save_every=0", "data.val_files=[]", "rollout.n=2",
                       "data.batch_size=2", "actor.mini_batch_size=2", "actor.micro_batch_size=4",
                       "data.max_prompt_length=256",
                       "data.max_response_length=8", "resources.cpus_per_worker=1", cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (proj / "runs/grpo-reasoning-gym-smollm2-cpu/metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:   # reasoning-gym's scorer ran in the reward workers: its metrics are the step's
        assert 0.0 <= row["reward/mean"] <= 1.0 and row["reward/errors"] == 0
        assert {"reward/acc", "reward/format", "reward/tagged"} <= set(row)
