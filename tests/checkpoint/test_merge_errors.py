"""`rlctl merge` on broken inputs: one-line errors, exit 3 (2 for usage), and nothing left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tomlkit

from rlctl.checkpoint.compat import run_fingerprint
from rlctl.checkpoint.manager import CheckpointManager
from rlctl.cli.main import main

SHARD = "actor/model/shard-00001-model-00001-of-00001.safetensors"


def rlctl(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_failure(code, err, tmp_path, expected_code=3, match=""):
    lines = err.strip().splitlines()
    assert code == expected_code and len(lines) == 1 and lines[0].startswith("error: "), err
    assert match in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def copy_run(trained_runs, tmp_path, name="full-tied-1w") -> Path:
    return Path(shutil.copytree(trained_runs[name].run_dir, tmp_path / "run"))


def resave(src: Path, dest: Path, *, model_path: Path, fingerprint: bool) -> Path:
    """A run whose checkpoint holds src's trained actor but names another model.path (as if the
    actor folder had been copied between runs), saved through the manager so it verifies."""
    step = src / "checkpoints" / "step_1"
    config = tomlkit.parse((step / "config.resolved.toml").read_text()).unwrap()
    config["model"]["path"] = str(model_path)
    shutil.copytree(src / "data", dest / "data")

    def write(tmp: Path) -> None:
        shutil.copytree(step / "actor", tmp / "actor")
        (tmp / "config.resolved.toml").write_text(tomlkit.dumps(config))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": 1}))

    meta = {"fingerprint": run_fingerprint(config, dest)} if fingerprint else {}
    CheckpointManager(dest / "checkpoints", 2, notify=lambda m: None).save(1, write, meta=meta)
    return dest


@pytest.mark.slow
def test_cli_merge_success_as_json(trained_runs, tmp_path, capsys):
    code, out, err = rlctl(capsys, "merge", trained_runs["lora-tied-2w"].run_dir, "--to-hf", tmp_path / "out",
                           "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["step"] == 1 and data["lora"] == "merge" and data["verification"]["trained_max_abs_diff"] <= 1e-4
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_run_without_checkpoints(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    code, _, err = rlctl(capsys, "merge", tmp_path / "run", "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="has no checkpoints")
    code, _, err = rlctl(capsys, "merge", tmp_path / "nowhere", "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="does not exist")


@pytest.mark.slow
def test_step_that_does_not_exist(trained_runs, tmp_path, capsys):
    code, _, err = rlctl(capsys, "merge", trained_runs["full-tied-1w"].run_dir, "--to-hf", tmp_path / "out",
                         "--step", "9")
    assert_clean_failure(code, err, tmp_path, match="checkpoint step 9 does not exist")
    assert "steps there: 1" in err


@pytest.mark.slow
@pytest.mark.parametrize("damage, message", [
    (lambda p: p.unlink(), f"{SHARD} is missing"),
    (lambda p: p.write_bytes(p.read_bytes()[:-1000]), f"{SHARD} is"),
    (lambda p: p.write_bytes(p.read_bytes()[:-8] + b"\x00" * 8), f"{SHARD} does not match its crc32"),
], ids=["missing", "truncated", "corrupted"])
def test_damaged_shard(trained_runs, tmp_path, capsys, damage, message):
    run = copy_run(trained_runs, tmp_path)
    damage(run / "checkpoints" / "step_1" / SHARD)
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out", "--step", "1")
    assert_clean_failure(code, err, tmp_path, match=f"checkpoint step_1 is broken: {message}")
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="no valid checkpoint in")


@pytest.mark.slow
def test_a_broken_newest_checkpoint_is_not_silently_replaced(trained_runs, tmp_path, capsys):
    """LATEST names step_2, whose shard is truncated; step_1 is fine. Resume would fall back with a
    warning; merge, meant for the newest weights, stops and names the step to merge instead."""
    import shutil

    run = copy_run(trained_runs, tmp_path)
    ckpts = run / "checkpoints"
    shutil.copytree(ckpts / "step_1", ckpts / "step_2")
    manifest = json.loads((ckpts / "step_2" / "MANIFEST.json").read_text())
    manifest["step"] = 2
    (ckpts / "step_2" / "MANIFEST.json").write_text(json.dumps(manifest))
    (ckpts / "LATEST").write_text("step_2\n")
    shard = ckpts / "step_2" / SHARD
    shard.write_bytes(shard.read_bytes()[:-1000])
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="the newest checkpoint cannot be merged: LATEST names step_2")
    assert "--step 1" in err
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out", "--step", "1")
    assert code == 0, err


@pytest.mark.slow
def test_model_folder_overwritten_since_training(trained_runs, tmp_path, tiny_model_dir, tiny_untied_model_dir,
                                                 capsys):
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    run = resave(trained_runs["full-tied-1w"].run_dir, tmp_path / "run", model_path=model, fingerprint=True)
    assert rlctl(capsys, "merge", run, "--to-hf", tmp_path / "ok")[0] == 0   # the same model: fine
    shutil.rmtree(tmp_path / "ok")
    shutil.copy(tiny_untied_model_dir / "model.safetensors", model / "model.safetensors")
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="step_1 was trained from a different model than")


@pytest.mark.slow
def test_checkpoint_from_a_model_with_other_tying(trained_runs, tmp_path, tiny_untied_model_dir, capsys):
    run = resave(trained_runs["full-tied-1w"].run_dir, tmp_path / "run", model_path=tiny_untied_model_dir,
                 fingerprint=False)
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="lacks trained weights of the model at model.path (lm_head.weight")
    run = resave(trained_runs["full-untied-2w"].run_dir, tmp_path / "run2",
                 model_path=trained_runs["full-tied-1w"].model_dir, fingerprint=False)
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="stores lm_head.weight and model.embed_tokens.weight separately")


@pytest.mark.slow
def test_checkpoint_from_a_model_of_another_size(trained_runs, tmp_path, capsys):
    from rlctl.models.tiny import build_tiny_model

    build_tiny_model(tmp_path / "small", layers=2, hidden=32, heads=4, kv_heads=2)
    run = resave(trained_runs["lora-untied-1w"].run_dir, tmp_path / "run", model_path=tmp_path / "small",
                 fingerprint=False)
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert_clean_failure(code, err, tmp_path, match="lora_A.default.weight has shape [8, 256] but the model at model.path has [8, 128]")


@pytest.mark.slow
def test_usage_errors_exit_2(trained_runs, tmp_path, capsys):
    run = trained_runs["full-tied-1w"].run_dir
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out", "--private")
    assert_clean_failure(code, err, tmp_path, expected_code=2, match="--private only applies with --push-to-hub")
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out", "--dtype", "int8")
    assert_clean_failure(code, err, tmp_path, expected_code=2, match="--dtype 'int8' is not one of")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    code, _, err = rlctl(capsys, "merge", run, "--to-hf", tmp_path / "out")
    assert code == 2 and "is not empty" in err and (tmp_path / "out" / "mine.txt").read_text() == "keep"


@pytest.mark.slow
def test_push_to_hub_offline_is_one_line_exit_3(trained_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = rlctl(capsys, "merge", trained_runs["full-tied-1w"].run_dir, "--to-hf", tmp_path / "out",
                         "--push-to-hub", "someone/tiny-merged", "--private")
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and lines[0].startswith("error: could not push")
    assert "the merged folder is complete at" in lines[0]
    assert (tmp_path / "out" / "model.safetensors").is_file()   # the merge itself succeeded


@pytest.mark.slow
def test_an_unwritable_destination_is_a_usage_error(trained_runs, tmp_path, capsys):
    """A --to-hf below a regular file fails as root too (ENOTDIR): one line naming it, exit 2."""
    (tmp_path / "a-file").write_text("")
    code, _, err = rlctl(capsys, "merge", trained_runs["full-tied-1w"].run_dir, "--to-hf", tmp_path / "a-file" / "x")
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert err.startswith(f"error: cannot write {tmp_path / 'a-file'}") and "Traceback" not in err, err
