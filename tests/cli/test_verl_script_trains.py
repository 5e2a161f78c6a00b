"""verl launch scripts converted by `rlctl config from-verl` train: convert -> validate -> train 2
steps on CPU on GSM8K rows where verl's scripts read them ($HOME/data/gsm8k): a GRPO launch in the
shape of verl's examples/grpo_trainer scripts (rlctl's CPU engine and small batches given after it,
as its $@), and an SFT launch (torchrun + verl.trainer.fsdp_sft_trainer) reading the
question and answer from extra_info as verl's gsm8k SFT example does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import rlctl_here

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"


def _project(tmp_path, gsm8k_dir, monkeypatch) -> Path:
    proj, home = tmp_path / "proj", tmp_path / "home"
    proj.mkdir()
    monkeypatch.setenv("HOME", str(home))   # the script reads $HOME/data/gsm8k, where verl's data prep writes
    prep = rlctl_here("data", "prep", "gsm8k", "--source", gsm8k_dir, "--limit", "8",
                      "--out", home / "data" / "gsm8k", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    return proj


@pytest.mark.slow
def test_a_converted_verl_grpo_script_trains(tmp_path, tiny_model_dir, gsm8k_dir, ray_cluster, monkeypatch):
    proj = _project(tmp_path, gsm8k_dir, monkeypatch)
    made = rlctl_here("config", "from-verl", FIXTURES / "run_qwen_gsm8k_grpo.sh", "--model", tiny_model_dir,
                      "actor_rollout_ref.rollout.name=hf",
                      "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
                      "data.max_response_length=16", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                      "trainer.n_gpus_per_node=0", "trainer.total_training_steps=2", "trainer.val_before_train=False",
                      "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=console", cwd=proj)
    assert made.returncode == 0, made.stderr
    assert rlctl_here("config", "validate", cwd=proj).returncode == 0
    train = rlctl_here("train", cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (proj / "runs/qwen2_7b_function_rm/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]


@pytest.mark.slow
def test_a_converted_verl_sft_script_trains(tmp_path, tiny_model_dir, gsm8k_dir, ray_cluster, monkeypatch):
    proj = _project(tmp_path, gsm8k_dir, monkeypatch)
    made = rlctl_here("config", "from-verl", FIXTURES / "sft_torchrun_gsm8k.sh", "1", "runs", "--model",
                      tiny_model_dir, "trainer.n_gpus_per_node=0", "data.train_batch_size=4",
                      "trainer.total_training_steps=2", "data.truncation=right", cwd=proj)
    assert made.returncode == 0, made.stderr
    assert rlctl_here("config", "validate", cwd=proj).returncode == 0
    train = rlctl_here("train", cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (proj / "runs/gsm8k-sft-qwen/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2] and rows[0]["train/loss"] > 0
