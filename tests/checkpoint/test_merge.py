"""`merge_run` on real checkpoints (1 and 2 workers, full and LoRA, tied and untied embeddings).

The merged folder is loaded the way users load it (from_pretrained, + PeftModel for adapters) and
its log-probs on a probe batch are compared with the ones the live workers computed after their
optimizer step: the whole path workers -> DCP shards -> merge -> HF folder is checked end to end.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ckpt_runs import RESPONSE, run_config

from rlctl.checkpoint import merge
from rlctl.checkpoint.merge import export_hf, merge_run
from rlctl.errors import CheckpointError, UsageError

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

CASES = ["full-tied-1w", "lora-untied-1w", "full-untied-2w", "lora-tied-2w"]


def probe_log_prob(model, run) -> np.ndarray:
    from rlctl.workers.compute.logprob import response_log_probs

    t = {k: torch.from_numpy(v) for k, v in run.probe.items()}
    with torch.no_grad():
        out = response_log_probs(model.eval(), t["input_ids"], t["attention_mask"], RESPONSE)
    return out["log_prob"].numpy()


def load(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


def weight_keys(folder) -> set[str]:
    from safetensors import safe_open

    keys = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            keys |= set(f.keys())
    return keys


@pytest.mark.parametrize("name", CASES)
def test_merged_folder_reproduces_the_live_workers(trained_runs, tmp_path, name):
    run = trained_runs[name]
    shards = list((run.run_dir / "checkpoints" / "step_1" / "actor" / "model").glob("shard-*.safetensors"))
    assert len(shards) == run.workers                  # 2 ranks' shards load into this one process
    result = merge_run(run.run_dir, tmp_path / "hf")
    out = tmp_path / "hf"
    assert result.out == out and result.step == 1 and result.warning is None
    assert result.lora == ("merge" if run.lora else "none") and result.dtype == "float32"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]          # no temporary folder left
    v = result.verification
    assert v["written_max_abs_diff"] <= v["tolerance"] and v["trained_max_abs_diff"] <= 1e-4

    merged = probe_log_prob(load(out), run)
    assert np.abs(merged - run.live_log_prob).max() <= 1e-4               # what the workers held
    assert np.abs(run.live_log_prob - run.base_log_prob).max() > 1e-2     # ...which training moved

    config = json.loads((out / "config.json").read_text())
    keys = weight_keys(out)
    assert ("lm_head.weight" in keys) == (not config["tie_word_embeddings"])  # no duplicate when tied
    assert config["tie_word_embeddings"] == (name.split("-")[1] == "tied") and not any("lora" in k for k in keys)
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(
        result.files)
    from transformers import AutoTokenizer

    chat = [{"role": "user", "content": "hi"}]
    written, base = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(run.model_dir)
    assert written.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        base.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [258, 256]
    # the run's settings travel with the weights (rlctl eval OUT scores as training did) ...
    from rlctl.serve.eval import reward_settings

    assert "rlctl_training.toml" in result.files
    assert reward_settings(out, None)[2] == run_config(run.model_dir, lora=run.lora, workers=1).data.max_response_length
    # ... and every file is readable by others (an inference server may run as another user)
    from rlctl.utils.atomic_files import _UMASK

    assert all(p.stat().st_mode & 0o777 == 0o666 & ~_UMASK for p in out.iterdir() if p.is_file())


@pytest.mark.parametrize("name", ["lora-untied-1w", "lora-tied-2w"])
def test_lora_adapter_folder_has_true_r_and_alpha(trained_runs, tmp_path, name):
    from peft import PeftModel

    run = trained_runs[name]
    result = merge_run(run.run_dir, tmp_path / "adapter", lora="adapter")
    out = tmp_path / "adapter"
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16.0) and adapter["base_model_name_or_path"] == str(run.model_dir)
    assert result.lora == "adapter" and "tokenizer.json" in result.files and "config.json" not in result.files
    assert all("lora_" in k for k in weight_keys(out))
    model = PeftModel.from_pretrained(load(run.model_dir), out)
    assert np.abs(probe_log_prob(model, run) - run.live_log_prob).max() <= 1e-4


def test_bfloat16_export_and_sharded_weights(trained_runs, tmp_path):
    run = trained_runs["full-untied-2w"]
    result = merge_run(run.run_dir, tmp_path / "bf16", dtype="bfloat16", max_shard_size="100KB")
    out = tmp_path / "bf16"
    assert result.dtype == "bfloat16" and json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("model-*.safetensors"))) > 2
    v = result.verification
    assert v["written_max_abs_diff"] == 0.0 and 0 < v["trained_max_abs_diff"] < 0.05  # bf16 rounding, no more
    model = load(out, torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert np.abs(probe_log_prob(model.float(), run) - run.live_log_prob).max() < 0.05


def _corrupt_after_save(monkeypatch, corrupt):
    original = merge._save_rounded

    def save_then_corrupt(model, folder, dtype, **kwargs):
        original(model, folder, dtype, **kwargs)
        corrupt(folder)

    monkeypatch.setattr(merge, "_save_rounded", save_then_corrupt)


def _scale_weight(folder, key="model.layers.1.mlp.down_proj.weight", factor=1.01):
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    tensors[key] = tensors[key] * factor
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_verification_catches_a_corrupted_export_and_keeps_the_old_out(trained_runs, tmp_path, monkeypatch):
    """A 1% change of one weight matrix fails the merge (exit 3); with --force the previous OUT
    stays untouched, and no temporary folder is left."""
    run = trained_runs["full-tied-1w"]
    _corrupt_after_save(monkeypatch, _scale_weight)
    with pytest.raises(CheckpointError, match="merge verification failed: the written folder vs") as err:
        merge_run(run.run_dir, tmp_path / "hf")
    assert err.value.exit_code == 3 and list(tmp_path.iterdir()) == []
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("previous export")
    with pytest.raises(CheckpointError):
        merge_run(run.run_dir, tmp_path / "hf", force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"] and (tmp_path / "hf" / "keep.txt").is_file()


def test_verification_catches_a_wrong_lora_scaling(trained_runs, tmp_path, monkeypatch):
    run = trained_runs["lora-untied-1w"]

    def double_alpha(folder):
        path = folder / "adapter_config.json"
        adapter = json.loads(path.read_text())
        path.write_text(json.dumps({**adapter, "lora_alpha": adapter["lora_alpha"] * 2}))

    _corrupt_after_save(monkeypatch, double_alpha)
    with pytest.raises(CheckpointError, match="merge verification failed"):
        merge_run(run.run_dir, tmp_path / "adapter", lora="adapter")
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_and_refuses_without_it(trained_runs, tmp_path):
    run = trained_runs["full-tied-1w"]
    out = tmp_path / "hf"
    out.mkdir()
    (out / "old.txt").write_text("x")
    with pytest.raises(UsageError, match="is not empty"):
        merge_run(run.run_dir, out)
    merge_run(run.run_dir, out, force=True)
    assert not (out / "old.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_export_hf_for_serve_fills_an_empty_folder(trained_runs, tmp_path):
    run = trained_runs["lora-tied-2w"]
    (tmp_path / "serve").mkdir()
    folder = export_hf(run.run_dir, tmp_path / "serve", step=1)
    assert folder == tmp_path / "serve" and (folder / "config.json").is_file()
    assert np.abs(probe_log_prob(load(folder), run) - run.live_log_prob).max() <= 1e-4


@pytest.mark.parametrize("name", ["full-untied-2w", "lora-tied-2w"])
def test_two_worker_checkpoint_resumes_on_one_worker(trained_runs, name):
    """resources.workers may change on resume (a harmless change in compat): DCP reshards the
    2-rank model + optimizer shards into 1 rank and the policy is exactly the trained one."""
    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    run = trained_runs[name]
    worker = ActorRolloutRefWorker(run_config(run.model_dir, lora=run.lora, workers=1), total_steps=4)
    meta = worker.load_checkpoint(str(run.run_dir / "checkpoints" / "step_1" / "actor"))
    assert meta["world_size"] == 2 and worker.actor.train_steps == 1 and worker.actor.optimizer.state
    resumed = worker.compute_log_prob(Batch(run.probe))["old_log_prob"]
    assert np.abs(resumed - run.live_log_prob).max() <= 1e-5
