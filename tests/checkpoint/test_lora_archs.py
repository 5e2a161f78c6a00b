"""LoRA covers the model it is given, whatever its layer names.

Tiny random models of seven architectures (hidden 32, 2 layers, rlctl's byte-level tokenizer):
Qwen2, Llama, Qwen3, Gemma3 and Phi-3 (fused qkv_proj / gate_up_proj) have nn.Linear
projections; Qwen3-MoE and Mixtral keep their experts in 3-D weight banks with a router, which
peft adapts through `target_parameters`. For every one: the default ("all-linear") adapts every
linear layer of every decoder block and every expert bank, never the output head or the
embeddings; the weight-sync path gives the merged weights under HF names. Through rlctl's own
actor step, checkpoint and merge (Phi-3, Qwen3-MoE): one step changes adapter weights only,
and both merge modes write folders that load back with the trained logits.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from ckpt_runs import fixed_batch, run_config, save_run

from rlctl.config.schema import LoraConfig
from rlctl.models.tiny import ARCHS, build_tiny_model
from support.gloo_ranks import run_ranks

LLAMA_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    return {a: build_tiny_model(root / a, arch=a, hidden=32, heads=4, kv_heads=2, layers=2, seed=5)["path"]
            for a in ARCHS}


def _base(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _lora(path, **kw):
    from rlctl.workers.compute.models import apply_lora

    torch.manual_seed(0)
    model = apply_lora(_base(path), LoraConfig(rank=4, alpha=8.0, **kw))
    with torch.no_grad():   # a trained adapter: B is zero at init, which would hide a missing merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model


@pytest.mark.parametrize("arch", list(ARCHS))
def test_default_adapts_every_linear_layer_and_expert_bank(arch_dirs, arch):
    base = _base(arch_dirs[arch])
    linear = {n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    banks = {n for n, p in base.named_parameters() if p.dim() == 3}
    assert linear and all(f".layers.{i}." in " ".join(linear) for i in range(2))
    assert bool(banks) == (arch in ("qwen3_moe", "mixtral"))
    model = _lora(arch_dirs[arch])
    assert LoraConfig().target_modules == ("all-linear",)
    adapted = {n.removeprefix("base_model.model.") for n in model.targeted_module_names}
    params = {n.removeprefix("base_model.model.") for n in model.targeted_parameter_names}
    assert linear - {n.rpartition(".")[0] for n in params} <= adapted   # every projection (a router via its weight)
    assert banks <= params                                                  # every expert bank of every layer
    assert not any(n.startswith(("lm_head", "model.embed_tokens")) for n in adapted | params)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_usual_llama_names_fit_only_where_the_model_has_them(arch_dirs, arch):
    from rlctl.workers.compute.lora import meta_model, mismatch_message

    message = mismatch_message(meta_model(arch_dirs[arch]), LLAMA_NAMES)
    if arch == "phi3":   # the case: o_proj and down_proj matched, the other five silently not
        assert message.startswith("q_proj, k_proj, v_proj, gate_proj, up_proj match no layer of Phi3ForCausalLM")
        assert "only o_proj, down_proj would get adapters" in message
        assert "did you mean qkv_proj, gate_up_proj" in message and '["all-linear"]' in message
    else:                # MoE: peft maps gate/up/down_proj onto the fused expert banks
        assert message is None
    assert mismatch_message(meta_model(arch_dirs[arch]), ("all-linear",)) is None


@pytest.mark.parametrize("arch", list(ARCHS))
def test_adapter_folder_lists_what_was_adapted_and_loads_back(arch_dirs, arch, tmp_path):
    from peft import PeftModel

    from rlctl.workers.compute.lora import pin_adapted_targets

    model = _lora(arch_dirs[arch]).eval()
    pin_adapted_targets(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    adapted = sorted(n.removeprefix("base_model.model.") for n in model.targeted_module_names
                     if not any(p.startswith(n + ".") for p in model.targeted_parameter_names))
    assert saved["target_modules"] == adapted
    ids = torch.tensor([[5, 70, 101, 33, 9, 258]])
    with torch.no_grad():
        trained = model(ids).logits
        loaded = PeftModel.from_pretrained(_base(arch_dirs[arch]), tmp_path).eval()(ids).logits
        merged = copy.deepcopy(model).merge_and_unload()(ids).logits
    assert torch.allclose(loaded, trained, atol=1e-5) and torch.allclose(merged, trained, atol=1e-5)


@pytest.mark.parametrize("arch", ["phi3", "qwen3_moe", "mixtral"])
def test_engine_weights_merge_every_adapter_under_hf_names(arch_dirs, arch):
    from rlctl.workers.rollout.weights import engine_weights

    model = _lora(arch_dirs[arch])
    weights = {k: v.clone() for k, v in engine_weights(model)}
    base = _base(arch_dirs[arch])
    assert set(weights) == set(base.state_dict()) - {"lm_head.weight"}     # tied: engines tie it themselves
    merged = copy.deepcopy(model).merge_and_unload().state_dict()          # peft's own merge
    assert max(float((weights[k] - merged[k]).abs().max()) for k in weights) < 1e-6
    changed = {k for k in weights if not torch.equal(weights[k], base.state_dict()[k])}
    assert {k for k in changed if "experts" in k} == {k for k in weights if "experts" in k}
    ids = torch.tensor([[5, 70, 101, 33]])
    base.load_state_dict(weights, strict=False)
    with torch.no_grad():
        assert torch.allclose(base(ids).logits, model.eval()(ids).logits, atol=1e-5)


@pytest.mark.parametrize("arch", ["phi3", "qwen3_moe"])
def test_a_step_trains_adapters_only_and_both_merges_load(arch_dirs, arch, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlctl.checkpoint.merge import merge_run
    from rlctl.checkpoint.trained import load_step_config, load_trained_model
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    model_dir = Path(arch_dirs[arch])
    config = run_config(model_dir, lora=True, workers=1)
    assert config.model.lora.target_modules == ("all-linear",)
    worker = ActorRolloutRefWorker(config, total_steps=4)
    before = {k: v.detach().clone() for k, v in worker.actor.module.state_dict().items()}
    worker.update_actor(fixed_batch(0))
    after = worker.actor.module.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if "lora_" in k}              # every adapter weight, nothing else
    assert any("experts" in k for k in changed) == (arch == "qwen3_moe")
    run_dir = tmp_path / "run"
    save_run(run_dir, config, worker.save_checkpoint)
    step = run_dir / "checkpoints" / "step_1"
    ids = torch.tensor(fixed_batch(1)["input_ids"][:1])
    with torch.no_grad():
        want = load_trained_model(step, load_step_config(step))(ids).logits
    adapter = merge_run(run_dir, tmp_path / "adapter", lora="adapter")
    merged = merge_run(run_dir, tmp_path / "merged", lora="merge")
    assert adapter.verification["trained_max_abs_diff"] < 1e-4 and merged.verification["trained_max_abs_diff"] < 1e-4
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["target_modules"] and all(n.startswith("model.layers.") for n in saved["target_modules"])
    with torch.no_grad():
        from_adapter = PeftModel.from_pretrained(_base(model_dir), tmp_path / "adapter").eval()(ids).logits
        from_merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(ids).logits
        untrained = _base(model_dir)(ids).logits
    assert torch.allclose(from_adapter, want, atol=1e-4) and torch.allclose(from_merged, want, atol=1e-4)
    assert not torch.allclose(untrained, want, atol=1e-4)


def _fsdp_rank(rank, model_dir, init_file, out_dir):
    import os

    import torch.distributed as dist

    from rlctl.workers.parallel.fsdp import shard, whole_weights
    from rlctl.workers.rollout.weights import engine_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model = _lora(model_dir)
    shard(model)
    ids = torch.tensor([[5, 70, 101, 33]])
    model(ids, labels=ids).loss.backward()                           # peft's bank wrappers train under FSDP2
    gathered = {k: v.clone() for k, v in engine_weights(model)}      # the actor's sync: one tensor at a time
    with whole_weights(model):
        whole = {k: v.clone() for k, v in engine_weights(model)}
    torch.save({"gathered": gathered, "whole": whole}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_moe_engine_weights_under_fsdp2(arch_dirs, tmp_path):

    from rlctl.workers.rollout.weights import engine_weights

    model_dir = arch_dirs["qwen3_moe"]
    run_ranks(_fsdp_rank, (model_dir, str(tmp_path / "pg"), str(tmp_path)), 2)
    expected = dict(engine_weights(_lora(model_dir)))
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for how in ("gathered", "whole"):
            assert set(got[how]) == set(expected)
            assert max(float((got[how][k] - expected[k]).abs().max()) for k in expected) < 1e-6, how
