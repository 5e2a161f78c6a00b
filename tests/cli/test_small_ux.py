"""The smaller things a new user trips over, each through the real CLI entry (in this process): a
one-line message that says what to do, and the documented exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.errors import Interrupted
from rlctl.project import write_project
from support.cli import rlctl_here


def one_line(result, code: int) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1, (result.returncode, result.stderr[-2000:])
    return lines[0]


@pytest.fixture
def project(tmp_path, tiny_model_dir) -> Path:
    write_project(tmp_path / "p", "grpo-arith-cpu", str(tiny_model_dir))
    return tmp_path / "p"


@pytest.mark.parametrize("word, name", [("actor_rollout_ref.actor.optim.lr=1e-6", "actor.lr"),
                                        ("actor.learning_rate=1e-6", "actor.lr"),
                                        ("data.train_batch_size=8", "data.batch_size"),
                                        ("trainer.total_training_steps=5", "run.total_steps"),
                                        ("algorithm.adv_estimator=grpo", "algorithm.name"),
                                        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
                                         "actor.micro_batch_max_tokens"),
                                        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
                                         "actor.micro_batch_max_tokens"),
                                        ("critic.use_dynamic_bsz=true", "critic.micro_batch_max_tokens")])
def test_verl_and_trl_names_suggest_rlctl_s_name(word, name):
    key = word.split("=")[0]
    loaded = load_config(None, [word, "model.path=m"], strict=False)
    problems = [p.placed("rlctl.toml", loaded.lines) for p in loaded.problems if p.key == key]
    assert problems == [f"overrides: {key}: unknown key (did you mean {name!r}? rlctl's name for it)"]


def test_a_setting_without_equals_is_named(tmp_path):
    line = one_line(rlctl_here("train", "run.total_steps", "2", cwd=tmp_path), 2)
    assert "a setting needs `=`" in line and "run.total_steps=VALUE" in line


def test_an_unclosed_bracket_is_named(tmp_path):
    (tmp_path / "rlctl.toml").write_text('[run]\nname = "x"\n[data]\ntrain_files = ["a.parquet"\n')
    line = one_line(rlctl_here("config", "validate", "rlctl.toml", cwd=tmp_path), 2)
    assert "never closed" in line and "\\x00" not in line


def test_data_prep_did_you_mean(tmp_path):
    assert "did you mean 'gsm8k'?" in one_line(rlctl_here("data", "prep", "gsm8kk", cwd=tmp_path), 2)


def test_eval_of_a_missing_file_names_data(tmp_path, tiny_model_dir):
    line = one_line(rlctl_here("eval", tiny_model_dir, "--data", "missing.parquet", cwd=tmp_path), 3)
    assert "--data missing.parquet" in line and "train_files" not in line


def test_resume_of_a_non_run_says_resume(tmp_path):
    assert "rlctl resume runs/<name>" in one_line(rlctl_here("resume", tmp_path, cwd=tmp_path), 2)


def test_init_keeps_an_absolute_model_path(tmp_path, tiny_model_dir):
    assert rlctl_here("init", tmp_path / "q", "--recipe", "grpo-arith-cpu", "--model", tiny_model_dir).returncode == 0
    assert f'path = "{tiny_model_dir}"' in (tmp_path / "q" / "rlctl.toml").read_text()


def test_config_option_as_trl_users_type_it(project):
    ok = rlctl_here("config", "validate", "--config", "p/rlctl.toml", "--skip-machine", cwd=project.parent)
    assert ok.returncode == 0 and "prompts per step" in ok.stdout, ok.stderr
    bad = rlctl_here("config", "validate", "--config", "p/rlctl.toml", "--skip-machine", "actor.lr=-1",
                     cwd=project.parent)   # the word beside --config is an override
    assert bad.returncode == 2 and "overrides: actor.lr: must be > 0" in bad.stderr, bad.stderr
    two = one_line(rlctl_here("config", "validate", "p/rlctl.toml", "-c", "p/rlctl.toml", cwd=project.parent), 2)
    assert "two config files" in two


def test_a_user_s_stop_is_not_an_error(project, monkeypatch):
    """The run itself is replaced (the real stop is tests/cli/test_interrupt.py's): what the CLI prints."""
    import rlctl.controller.run as run

    def stop(*_, **__):
        e = Interrupted("stopped by Ctrl-C at a safe point")
        e.hint = "continue with: rlctl resume runs/x"
        raise e

    monkeypatch.setattr(run, "start_training", stop)
    line = one_line(rlctl_here("train", cwd=project), 130)
    assert line == "stopped by Ctrl-C at a safe point; continue with: rlctl resume runs/x"


def test_a_ctrl_c_before_the_run_starts_says_interrupted(project, monkeypatch):
    """A KeyboardInterrupt in a command (a Ctrl-C while `rlctl train` still validates, before its
    own stop handling is armed): typer turns it into a silent exit 130; rlctl says so in one line."""
    import rlctl.controller.run as run

    def ctrl_c(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "start_training", ctrl_c)
    assert one_line(rlctl_here("train", cwd=project), 130) == "interrupted"
