"""Resume compatibility: breaking config/file changes refuse (exit 3), harmless ones are notices."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from rlctl.checkpoint.compat import check_resume, flatten, run_fingerprint, saved_fingerprint
from rlctl.config.loader import config_to_dict
from rlctl.config.schema import Config, DataConfig, ModelConfig
from rlctl.errors import CheckpointError


@pytest.fixture
def project(tmp_path, tiny_model_dir):
    """A project folder with its own copy of the tiny model and two data files."""
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"PAR1 rows of the training set PAR1")
    (tmp_path / "data" / "val.parquet").write_bytes(b"PAR1 rows of the validation set PAR1")
    return tmp_path


def config(**sections) -> dict:
    base = Config(model=ModelConfig(path="model"), data=DataConfig(train_files=("data/train.parquet",),
                                                                   val_files=("data/val.parquet",)))
    for name, values in sections.items():
        base = dataclasses.replace(base, **{name: dataclasses.replace(getattr(base, name), **values)})
    return config_to_dict(base)


def with_key(cfg: dict, key: str, value) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items()}
    *path, leaf = key.split(".")
    node = out
    for part in path:
        node[part] = dict(node[part])
        node = node[part]
    node[leaf] = value
    return out


def test_identical_runs_resume_silently(project):
    saved = run_fingerprint(config(), project)
    assert set(saved["fingerprints"]) == {"model", "tokenizer", "train_files", "reward_function", "plugins",
                                          "teachers"}
    assert saved["fingerprints"]["teachers"] is None   # no distillation
    assert saved["fingerprints"]["model"].startswith("sha256:") and saved["fingerprints"]["reward_function"] is None
    assert check_resume(saved, run_fingerprint(config(), project)) == []


@pytest.mark.parametrize("key, value", [
    ("run.total_steps", 500), ("run.total_epochs", 3), ("run.save_every", 7), ("run.keep_last", 0),
    ("run.val_every", 5), ("run.loggers", ["console"]), ("run.log_samples", 0), ("reward.timeout_s", 60.0),
    ("reward.workers", 8), ("resources.workers", 4), ("resources.address", "auto"),
    ("actor.micro_batch_size", 1), ("actor.micro_batch_max_tokens", 2048), ("rollout.engine", "vllm"),
    ("rollout.val_temperature", 0.6),
    ("data.val_files", ["data/train.parquet"]), ("model.gradient_checkpointing", True),
])
def test_harmless_changes_are_notices(project, key, value):
    saved = run_fingerprint(config(), project)
    notices = check_resume(saved, run_fingerprint(with_key(config(), key, value), project))
    assert len(notices) == 1 and notices[0].startswith(f"{key}: ") and "->" in notices[0]


@pytest.mark.parametrize("key, value", [
    ("model.lora.rank", 8), ("model.dtype", "bfloat16"), ("algorithm.name", "rloo"), ("algorithm.kl_coef", 0.1),
    ("data.batch_size", 16), ("data.max_prompt_length", 128), ("data.max_response_length", 64),
    ("data.shuffle", False), ("rollout.n", 4), ("rollout.temperature", 0.7), ("actor.lr", 1e-5),
    ("actor.ppo_epochs", 2), ("actor.mini_batch_size", 2), ("reward.function", "math"),
    ("reward.format_score", 0.1), ("run.seed", 1),
])
def test_breaking_changes_refuse_with_exit_3(project, key, value):
    saved = run_fingerprint(config(), project)
    with pytest.raises(CheckpointError, match=f"break the run: {key}: ") as err:
        check_resume(saved, run_fingerprint(with_key(config(), key, value), project))
    assert err.value.exit_code == 3 and "\n" not in str(err.value)


def test_every_breaking_difference_is_listed_at_once(project):
    saved = run_fingerprint(config(), project)
    current = with_key(with_key(config(), "rollout.n", 8), "algorithm.name", "rloo")
    with pytest.raises(CheckpointError) as err:
        check_resume(saved, run_fingerprint(with_key(current, "run.total_steps", 9), project))
    assert "algorithm.name: grpo -> rloo; rollout.n: 1 -> 8" in err.value.message
    assert "total_steps" not in err.value.message


def test_data_contents_not_names_decide(project):
    saved = run_fingerprint(config(), project)
    shutil.copy(project / "data" / "train.parquet", project / "data" / "moved.parquet")
    moved = with_key(config(), "data.train_files", ["data/moved.parquet"])
    assert check_resume(saved, run_fingerprint(moved, project)) == [
        "data.train_files: ['data/train.parquet'] -> ['data/moved.parquet'] (same contents, moved)"]
    (project / "data" / "train.parquet").write_bytes(b"PAR1 other rows PAR1")
    with pytest.raises(CheckpointError, match=r"data.train_files: the contents changed \(sha256:"):
        check_resume(saved, run_fingerprint(config(), project))


def test_model_and_tokenizer_files_are_fingerprinted(project, tiny_untied_model_dir):
    saved = run_fingerprint(config(), project)
    shutil.copytree(project / "model", project / "model_copy")
    assert "same contents, moved" in check_resume(saved, run_fingerprint(with_key(config(), "model.path",
                                                                                 "model_copy"), project))[0]
    # Same path, other weights: the folder was overwritten with another model.
    shutil.copy(tiny_untied_model_dir / "model.safetensors", project / "model" / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.path: the contents changed"):
        check_resume(saved, run_fingerprint(config(), project))
    # Only the tokenizer's chat template changed.
    shutil.copy(project / "model_copy" / "model.safetensors", project / "model" / "model.safetensors")
    (project / "model" / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    with pytest.raises(CheckpointError, match="the tokenizer files changed"):
        check_resume(saved, run_fingerprint(config(), project))


def test_reward_file_contents_are_fingerprinted(project):
    (project / "reward.py").write_text("def compute_score(*a, **k):\n    return 1.0\n")
    cfg = with_key(config(), "reward.function", "reward.py:compute_score")
    saved = run_fingerprint(cfg, project)
    assert saved["fingerprints"]["reward_function"].startswith("sha256:")
    (project / "reward.py").write_text("def compute_score(*a, **k):\n    return 0.0\n")
    with pytest.raises(CheckpointError, match="reward.function: the contents changed"):
        check_resume(saved, run_fingerprint(cfg, project))


def test_plugin_file_contents_are_fingerprinted(project):
    (project / "algos.py").write_text("# registers nothing yet\n")
    cfg = with_key(config(), "algorithm.plugins", ["algos.py"])
    saved = run_fingerprint(cfg, project)
    assert saved["fingerprints"]["plugins"].startswith("sha256:")
    assert check_resume(saved, run_fingerprint(cfg, project)) == []
    (project / "algos.py").write_text("# an estimator changed\n")
    with pytest.raises(CheckpointError, match="algorithm.plugins: the contents changed"):
        check_resume(saved, run_fingerprint(cfg, project))
    old = {**saved, "fingerprints": {k: v for k, v in saved["fingerprints"].items() if k != "plugins"}}
    old["config"] = {**old["config"], "algorithm": {k: v for k, v in old["config"]["algorithm"].items()
                                                    if k != "plugins"}}
    assert check_resume(old, run_fingerprint(config(), project)) == [      # a checkpoint from before the setting
        "algorithm.plugins: (not set) -> [] (a newer setting, at its default)"]


def test_critic_settings_matter_only_with_a_critic(project):
    grpo = run_fingerprint(config(), project)
    assert "this algorithm has no critic" in check_resume(
        grpo, run_fingerprint(with_key(config(), "critic.lr", 1e-3), project))[0]
    gae = config(algorithm={"name": "gae"})
    with pytest.raises(CheckpointError, match=r"critic.lr: 1e-05 -> 0.001"):
        check_resume(run_fingerprint(gae, project), run_fingerprint(with_key(gae, "critic.lr", 1e-3), project))


def test_cosine_schedule_notice_on_longer_runs(project):
    cosine = config(actor={"lr_schedule": "cosine"})
    notice = check_resume(run_fingerprint(cosine, project),
                          run_fingerprint(with_key(cosine, "run.total_steps", 100), project))[0]
    assert notice.endswith("actor.lr_schedule is cosine, so the learning-rate curve changes from here on")


def test_keys_added_or_removed_by_other_versions(project):
    saved = run_fingerprint(config(), project)
    del saved["config"]["data"]["val_batch_size"]          # a checkpoint from before that key existed
    saved["config"]["run"]["retired_key"] = 1               # and one with a key since removed
    notices = check_resume(saved, run_fingerprint(config(), project))
    assert notices == ["data.val_batch_size: (not set) -> 64 (a newer setting, at its default)",
                       "run.retired_key: 1 -> (not set) (no longer a setting; ignored)"]
    del saved["config"]["data"]["max_prompt_length"]
    with pytest.raises(CheckpointError, match="data.max_prompt_length"):
        check_resume(saved, run_fingerprint(with_key(config(), "data.max_prompt_length", 64), project))


def test_saved_fingerprint_reads_manifest_meta(project):
    fp = run_fingerprint(config(), project)
    assert saved_fingerprint({"meta": {"fingerprint": fp}}) == fp
    assert saved_fingerprint({"meta": {}}) is None and saved_fingerprint({}) is None
    assert flatten({"a": {"b": {"c": (1, 2)}}}) == {"a.b.c": [1, 2]}


def test_another_teacher_set_is_refused(project):
    """distill: the teachers' names and model files are hashed; other weights at the same path, or a
    teacher added, stop the resume (the distill.* keys alone would not see new weights)."""
    shutil.copytree(project / "model", project / "teacher")
    saved = run_fingerprint(config(distill={"teacher": "teacher"}), project)
    assert saved["fingerprints"]["teachers"].startswith("sha256:")
    assert check_resume(saved, run_fingerprint(config(distill={"teacher": "teacher"}), project)) == []
    weights = project / "teacher" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(CheckpointError, match="distillation teachers changed"):
        check_resume(saved, run_fingerprint(config(distill={"teacher": "teacher"}), project))
    with pytest.raises(CheckpointError, match="distill.teachers.b"):
        check_resume(saved, run_fingerprint(config(distill={"teachers": {"a": "teacher", "b": "model"}}), project))
