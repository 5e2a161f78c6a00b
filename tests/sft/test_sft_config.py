"""An SFT config: validate names the RL keys it ignores (warnings), checks its own keys, and bad SFT
data stops `rlctl train` with one line and exit 3 before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlctl.config.loader import load_config
from rlctl.validate import validate
from rlctl.project import write_project
from rlctl.recipes import get_recipe
from support.cli import rlctl_here

ROOT = Path(__file__).resolve().parents[2]


def test_sft_recipes_validate_and_list_as_sft():
    for name in ("sft-arith-cpu", "sft-arith-sp2-cpu", "sft-gsm8k"):
        problems, plan = validate(load_config(ROOT / "recipes" / f"{name}.toml"), machine=False)
        assert [p.format() for p in problems] == []
        assert dict(plan.rows())["run kind"].startswith("sft") and get_recipe(name).algorithm == "sft"


def test_config_validate_command_prints_the_sft_plan(tmp_path, tiny_model_dir, capsys):
    """The CLI, not only validate(): it reads the plan's GPU fields, which the SFT plan lacked once."""
    import json

    from rlctl.cli.main import main
    from rlctl.tasks.prep import PrepOptions, prepare

    write_project(tmp_path, "sft-arith-cpu", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=tmp_path / "data" / "arith-sft", sft=True))
    assert main(["config", "validate", str(tmp_path / "rlctl.toml"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["gpus_per_node"] == 0 and report["batch_plan"]["training rows"] == 360
    assert main(["config", "validate", str(tmp_path / "rlctl.toml"), "--skip-machine"]) == 0


def test_unused_rl_keys_are_warnings_and_sft_keys_are_checked():
    recipe = ROOT / "recipes" / "sft-arith-cpu.toml"
    loaded = load_config(recipe, ["rollout.n=4", "reward.function=arith", "algorithm.name=rloo",
                                  "actor.ppo_epochs=2", "data.max_prompt_length=64", "actor.lr=1e-4"])
    problems, _ = validate(loaded, machine=False)
    warned = {p.key for p in problems if p.severity == "warning"}
    assert warned == {"rollout.n", "reward.function", "algorithm.name", "actor.ppo_epochs", "data.max_prompt_length"}
    assert not [p for p in problems if p.severity == "error"]

    problems, _ = validate(load_config(recipe, ["data.batch_size=33", "run.best_metric=val/acc"]), machine=False)
    errors = {p.key: p.message for p in problems if p.severity == "error"}
    assert "over 2 workers" in errors["data.batch_size"] or "split evenly" in errors["data.batch_size"]
    assert "val/loss" in errors["run.best_metric"]

    # and the other way round: [sft] keys in an RL config are named as unused
    rl = load_config(ROOT / "recipes" / "grpo-arith-cpu.toml", ["sft.max_length=64"])
    assert [p.key for p in validate(rl, machine=False)[0] if p.severity == "warning"] == ["sft.max_length"]


def test_bad_sft_data_is_one_line_exit_3(tmp_path, tiny_model_dir):
    write_project(tmp_path, "sft-arith-cpu", str(tiny_model_dir))
    data = tmp_path / "data" / "arith-sft"
    data.mkdir(parents=True)
    rl_rows = [{"data_source": "x", "prompt": [{"role": "user", "content": "1+1?"}]}] * 40   # RL data: no response
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rl_rows), data / f"{split}.parquet")
    proc = rlctl_here("train", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no 'response' column" in lines[0] and "--sft" in lines[0], proc.stderr


def test_best_metric_is_checked_as_for_rl():
    """run.best_metric in an SFT config: SFT's metrics, lower is better, and run.val_every = 0 (the best is
    always the last step) warns as it does for GRPO."""
    recipe = ROOT / "recipes" / "sft-arith-cpu.toml"

    def problems(*overrides):
        found = validate(load_config(recipe, list(overrides)), machine=False)[0]
        return {p.key: p.message for p in found if p.severity == "error"}, [p.message for p in found
                                                                            if p.severity == "warning"]

    assert problems("run.best_metric=val/loss", "run.best_mode=min", "run.val_every=10") == ({}, [])
    errors, warnings = problems("run.best_metric=val/loss", "run.best_mode=min", "run.val_every=0")
    assert errors == {} and len(warnings) == 1 and "validates only at the last step" in warnings[0]
    errors, warnings = problems("run.best_metric=val/perplexity", "run.best_mode=max", "run.val_every=10")
    assert errors == {} and warnings == ["val/perplexity is better when lower: set run.best_mode = \"min\""]
    errors, _ = problems("run.best_metric=val/los", "run.val_every=10")
    assert "did you mean 'val/loss'?" in errors["run.best_metric"] and "val/perplexity" in errors["run.best_metric"]
    assert "not a metric" in problems("run.best_metric=val/math/acc", "run.val_every=10")[0]["run.best_metric"]
    assert "does not validate" in problems("run.best_metric=val/loss", "data.val_files=[]")[0]["run.best_metric"]


def test_sft_max_length_is_checked_against_the_models_context(tmp_path, tiny_model_dir):
    """The machine pass: sft.max_length (not data.max_prompt/response_length) against max_position_embeddings."""
    write_project(tmp_path, "sft-arith-cpu", str(tiny_model_dir))

    def problems(*overrides):
        return {p.key: p.message for p in validate(load_config(tmp_path / "rlctl.toml", list(overrides)))[0]
                if p.severity == "error"}

    assert problems("sft.max_length=4096")["sft.max_length"] == "4096 exceeds the model's context of 2048 tokens"
    found = problems("sft.max_length=2048", "data.max_response_length=4000")
    assert "sft.max_length" not in found and "data.max_response_length" not in found, found


def test_sft_sequence_parallel_size_is_checked_against_the_models_heads(tmp_path, tiny_model_dir):
    """The machine pass of an SFT config checks actor.ulysses_sequence_parallel_size as RL's does (tiny: 4 heads)."""
    write_project(tmp_path, "sft-arith-sp2-cpu", str(tiny_model_dir))

    def problems(*overrides):
        return {p.key: p.message for p in validate(load_config(tmp_path / "rlctl.toml", list(overrides)))[0]
                if p.severity == "error"}

    assert "actor.ulysses_sequence_parallel_size" not in problems()
    found = problems("actor.ulysses_sequence_parallel_size=8", "resources.workers=8")
    assert "4 attention heads" in found["actor.ulysses_sequence_parallel_size"], found
