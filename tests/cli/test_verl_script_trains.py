"""A verl SFT launch (torchrun + verl.trainer.fsdp_sft_trainer, the shape of verl's examples/sft
scripts) converted by `rlctl config from-verl` trains: convert -> validate -> train 2 steps on CPU,
on GSM8K rows in verl's layout (the question and answer in extra_info, as verl's SFT example reads them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import rlctl_here

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"


@pytest.mark.slow
def test_a_converted_verl_sft_script_trains(tmp_path, tiny_model_dir, gsm8k_dir, ray_cluster, monkeypatch):
    proj, home = tmp_path / "proj", tmp_path / "home"
    proj.mkdir()
    monkeypatch.setenv("HOME", str(home))   # the script reads $HOME/data/gsm8k, where verl's data prep writes
    prep = rlctl_here("data", "prep", "gsm8k", "--source", gsm8k_dir, "--limit", "8",
                      "--out", home / "data" / "gsm8k", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    made = rlctl_here("config", "from-verl", FIXTURES / "sft_torchrun_gsm8k.sh", "1", "runs", "--model",
                      tiny_model_dir, "trainer.n_gpus_per_node=0", "data.train_batch_size=4",
                      "trainer.total_training_steps=2", "data.truncation=right", cwd=proj)
    assert made.returncode == 0, made.stderr
    assert rlctl_here("config", "validate", cwd=proj).returncode == 0
    train = rlctl_here("train", cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (proj / "runs/gsm8k-sft-qwen/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2] and rows[0]["train/loss"] > 0
