"""model.lora.sync = "adapter": the tensors that travel are exactly peft's adapter file (names and
values), the folder vLLM loads is written whole or not at all, and every case the adapter cannot
carry is one validate warning that the run pushes merged weights."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from support.cli import rlctl_here

from rlctl.models.lora_adapter import read_adapter
from rlctl.workers.rollout.adapter_sync import (adapter_config, adapter_tensors, model_refusal, push_weights,
                                                write_adapter)

TOML = """
[model]
path = "{model}"
lora = {{rank = 8, alpha = 16, sync = "adapter"}}
[data]
train_files = ["train.parquet"]
[rollout]
n = 2
"""


def _peft(model_dir, targets="all-linear"):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False))


class _Engine:
    """Records what push_weights hands an engine (the real engines are tested in tests/controller)."""

    def update_adapter(self, tensors, config, version):
        self.adapter = (tensors, config, version)

    def update_weights(self, items):
        self.weights = dict(items)


def test_the_pushed_adapter_is_peft_s_own_file_and_reads_back(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from rlctl.config.schema import LoraConfig

    model = _peft(tiny_model_dir)
    model.save_pretrained(tmp_path / "peft")
    saved = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    ours = dict(adapter_tensors(model))
    assert sorted(ours) == sorted(saved) and all(torch.equal(ours[k], saved[k]) for k in saved)
    config = adapter_config(model, LoraConfig(rank=8, alpha=16.0), str(tiny_model_dir))
    folder = write_adapter(tmp_path / "root", "policy-v3", ours, config)
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["policy-v3"]   # no temporary left
    mine, theirs = read_adapter("a", folder), read_adapter("b", tmp_path / "peft")
    assert mine.rank == 8 and all(torch.equal(mine.weights[m][1], theirs.weights[m][1]) for m in theirs.weights)


def test_push_weights_sends_the_adapter_or_the_merged_model_and_counts_bytes(tiny_model_dir):
    from rlctl.config.loader import load_config  # noqa: F401 - the config class below is the real one
    from rlctl.config.schema import Config, LoraConfig, ModelConfig

    model = _peft(tiny_model_dir, ["q_proj", "v_proj"])
    config = Config(model=ModelConfig(path=str(tiny_model_dir), lora=LoraConfig(rank=8, alpha=16.0)))
    engine = _Engine()
    adapter = push_weights(engine, model, config, adapter=True, version=5, dtype=torch.float32)
    merged = push_weights(engine, model, config, adapter=False, version=5, dtype=torch.float32)
    tensors, cfg, version = engine.adapter
    assert version == 5 and cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["r"] == 8
    assert adapter["weight_sync_mb"] == pytest.approx(sum(t.numel() * 4 for t in tensors.values()) / 1e6)
    assert merged["weight_sync_mb"] == pytest.approx(sum(t.numel() * 4 for t in engine.weights.values()) / 1e6)
    assert adapter["weight_sync_mb"] < merged["weight_sync_mb"] / 10


def test_the_adapter_cannot_carry_lora_on_the_head_or_expert_banks(tiny_model_dir, tiny_moe_dir):
    from rlctl.workers.compute.lora import adapted_modules, meta_model

    assert model_refusal(_peft(tiny_model_dir)) is None
    assert "output head (lm_head)" in model_refusal(_peft(tiny_model_dir, ["q_proj", "lm_head"]))
    moe = meta_model(str(tiny_moe_dir))
    assert "MoE expert banks" in model_refusal(moe, adapted_modules(moe, ["all-linear"]))
    dense = meta_model(str(tiny_model_dir))
    assert model_refusal(dense, adapted_modules(dense, ["all-linear"])) is None


@pytest.mark.parametrize("overrides, why", [
    (["rollout.engine=sglang"], "sglang engine takes merged weights"),
    (["rollout.engine=vllm", 'model.lora.target_modules=["q_proj", "lm_head"]'], "output head (lm_head)"),
    (["rollout.engine=vllm", "rollout.tensor_parallel_size=2"], "tensor-parallel vLLM engine"),
])
def test_validate_says_in_one_warning_that_the_run_pushes_merged(tmp_path, tiny_model_dir, overrides, why):
    pq.write_table(pa.table({"data_source": ["x"] * 8}), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(TOML.format(model=tiny_model_dir))
    report = json.loads(rlctl_here("config", "validate", *overrides, "--format", "json", cwd=tmp_path).stdout)
    mine = [w for w in report["warnings"] if "model.lora.sync" in w]
    assert len(mine) == 1 and why in mine[0] and "the run pushes merged weights" in mine[0], report


def test_a_plain_lora_run_on_vllm_or_hf_gets_no_warning(tmp_path, tiny_model_dir):
    pq.write_table(pa.table({"data_source": ["x"] * 8}), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(TOML.format(model=tiny_model_dir))
    for engine, mode in (("hf", "sync"), ("vllm", "sync"), ("vllm", "one_step_off"), ("hf", "async")):
        report = json.loads(rlctl_here("config", "validate", f"rollout.engine={engine}", f"rollout.mode={mode}",
                                       "--format", "json", cwd=tmp_path).stdout)
        assert not [w for w in report.get("warnings", []) if "model.lora.sync" in w], report


def test_train_start_prints_the_warning_once(tmp_path, vllm_tiny_model_dir, capsys):
    from rlctl.config.loader import load_config
    from rlctl.controller.run import _check

    pq.write_table(pa.table({"data_source": ["x"] * 8}), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(TOML.format(model=vllm_tiny_model_dir))
    _check(load_config(tmp_path / "rlctl.toml", ["rollout.engine=vllm", 'model.lora.target_modules=["lm_head"]']))
    lines = [line for line in capsys.readouterr().err.splitlines() if "model.lora.sync" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "pushes merged weights" in lines[0]


class _AdapterCopyEngine:
    """Stands in for vLLM with LoRA on (the real one: tests/controller/test_lora_sync_vllm.py): its own
    copy of model.path's weights, which only adapters change. Each push is read back from the very
    folder vLLM would load (write_adapter -> read_adapter) and applied unmerged (rlctl.models.
    lora_slots, the built-in server's mechanism); sleeping drops the adapter, so a missed push shows."""

    owns_weights = True

    def __init__(self, model_dir, eos, tmp):
        from transformers import AutoModelForCausalLM

        from rlctl.models.lora_slots import LoraSlots

        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.slots, self.eos, self.tmp, self.events = LoraSlots(self.model, slots=1, max_rank=8), eos, tmp, []

    def update_adapter(self, tensors, config, version):
        folder = write_adapter(self.tmp, f"policy-v{version}", tensors, config)
        self.slots.put(1, read_adapter("policy", folder).weights)
        self.events.append(f"adapter v{version}")

    def update_weights(self, weights=None):
        raise AssertionError("adapter sync must not push merged weights")

    def generate(self, prompt_ids, **kw):
        from test_weight_sync import CopyEngine

        with self.slots.rows([1] * (len(prompt_ids) * kw["n"])), torch.no_grad():
            return CopyEngine.generate(self, prompt_ids, **kw)

    def sleep(self):
        self.slots.clear(1)

    def wake(self):
        pass


def test_the_actor_pushes_only_the_adapter_and_the_engine_follows_every_update(tiny_untied_model_dir, tmp_path):
    import numpy as np
    from test_weight_sync import config, prompts

    from rlctl.controller.drift import rollout_drift
    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(config(tiny_untied_model_dir, lora=True), total_steps=4)
    engine = worker._rollout = _AdapterCopyEngine(tiny_untied_model_dir, worker.eos_ids, tmp_path)
    worker._adapter_sync = True
    first = worker.generate(prompts(), seed=7)
    for step in range(2):
        first = first.union(worker.compute_log_prob(first))
        advantages = np.where(first["response_mask"] > 0, np.linspace(-1, 1, 4)[:, None], 0).astype(np.float32)
        worker.update_actor(Batch({**first.tensors, "advantages": advantages}))
        first = worker.generate(prompts(), seed=8 + step)   # woken: the new version's adapter, nothing else
        assert 0 < first.meta["weight_sync_mb"] < 0.1 and first.meta["weight_sync_s"] > 0
        drift = rollout_drift(first.union(worker.compute_log_prob(first)))
        assert drift["rollout/logprob_diff_max"] < 1e-4, drift
    assert engine.events == ["generate", "adapter v1", "generate", "adapter v2", "generate"]


def test_the_rollout_group_gets_only_the_adapter_and_follows_every_update(tiny_untied_model_dir):
    """rollout.mode = "one_step_off" / "async": the actor exports the adapter alone, the rollout rank's
    copy (the base with a peft adapter) takes it, and its log-probs of what it samples equal the
    actor's after real updates; what it exports for an async checkpoint is the same push."""
    import dataclasses

    import numpy as np
    from test_weight_sync import config, prompts

    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker
    from rlctl.workers.roles.rollout_worker import RolloutWorker
    from rlctl.workers.rollout.adapter_sync import is_adapter_push, push_mb

    cfg = config(tiny_untied_model_dir, lora=True)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=dataclasses.replace(
        cfg.model.lora, sync="adapter")), rollout=dataclasses.replace(cfg.rollout, engine="hf", mode="one_step_off"))
    actor, rollout = ActorRolloutRefWorker(cfg, total_steps=4), RolloutWorker(cfg)
    assert rollout.adapter_sync
    params_mb = sum(p.numel() * 4 for p in actor.actor.module.parameters()) / 1e6
    for version in range(3):
        push = actor.export_weights()
        assert is_adapter_push(push) and 0 < push_mb(push) < 0.1 * params_mb
        assert rollout.update_weights(push, version=version) == version
        last = {k: v.copy() for k, v in push["adapter"].items()}   # the arrays are the actor's own tensors
        rows = rollout.generate(prompts(), seed=version)
        mask = rows["response_mask"] > 0
        mine = actor.compute_log_prob(rows)["old_log_prob"]
        assert np.abs(mine - rows["rollout_log_prob"])[mask].max() < 1e-5   # the copy holds this version
        advantages = np.where(mask, np.linspace(-1, 1, len(rows))[:, None], 0).astype(np.float32)
        actor.update_actor(Batch({**rows.tensors, "old_log_prob": mine, "advantages": advantages}))
        moved = actor.compute_log_prob(rows)["old_log_prob"]
        assert np.abs(moved - rows["rollout_log_prob"])[mask].max() > 1e-3   # a real update, not yet pushed
    saved = rollout.export_weights()
    assert saved["adapter_config"] == push["adapter_config"] and all(
        np.array_equal(saved["adapter"][k], last[k]) for k in last)
