"""What validate says about actor.expert_parallel_size / actor.router_replay
(rlctl.workers.parallel.expert_checks): what is built passes, what is not is refused in one line each."""

from __future__ import annotations

import dataclasses

import pytest

from rlctl.config.checks import CheckContext
from rlctl.config.schema import Config, ModelConfig
from rlctl.workers.parallel.expert_checks import KEY, check_expert_model, check_expert_parallel, check_router_replay_model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_moe")
    build_tiny_model(out, arch="qwen3_moe", layers=1, hidden=32, heads=4, kv_heads=2, intermediate=64)
    return out


def _config(path, **changes) -> Config:
    c = Config(model=ModelConfig(path=str(path)))
    for section, values in changes.items():
        c = dataclasses.replace(c, **{section: dataclasses.replace(getattr(c, section), **values)})
    return c


def test_ep_fits_the_workers_and_the_experts_and_a_dense_model_is_refused(moe_dir, tiny_model_dir, tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    ok = _config(moe_dir, actor={"expert_parallel_size": 2}, resources={"workers": 2})
    assert check_expert_parallel(ok, ctx) == [] and check_expert_model(ok, ctx) == []
    assert check_expert_parallel(_config(tiny_model_dir), ctx) == []   # off: nothing read
    odd = check_expert_parallel(_config(moe_dir, actor={"expert_parallel_size": 2}, resources={"workers": 3}), ctx)
    assert [p.key for p in odd] == ["actor.expert_parallel_size"] and "3 training ranks" in odd[0].message
    three = _config(moe_dir, actor={"expert_parallel_size": 3}, resources={"workers": 3})
    assert "4 experts" in check_expert_model(three, ctx)[0].message    # 4 experts over 3 ranks
    dense = check_expert_model(_config(tiny_model_dir, actor={"expert_parallel_size": 2}), ctx)
    assert len(dense) == 1 and "has no experts" in dense[0].message


def test_ep_counts_the_gpus_as_ranks_and_leaves_out_a_separate_rollout_groups(moe_dir, tmp_path):
    """On GPUs the ranks are nodes x GPUs per node (resources.workers stays 1), less the rollout
    group's GPUs when it runs apart, as validate counts them for sequence parallelism."""
    ctx = CheckContext(base_dir=tmp_path, raw={})
    gpus = {"workers": 1, "nodes": 1, "gpus_per_node": 8}
    four = {"expert_parallel_size": 4}
    assert check_expert_parallel(_config(moe_dir, actor={"expert_parallel_size": 8}, resources=gpus), ctx) == []
    assert check_expert_parallel(_config(moe_dir, actor=four, resources={**gpus, "nodes": 2}), ctx) == []
    apart = _config(moe_dir, actor=four, resources={**gpus, "rollout_workers": 2}, rollout={"mode": "one_step_off"})
    odd = check_expert_parallel(apart, ctx)   # 6 actor GPUs beside the rollout's 2
    assert [p.key for p in odd] == ["actor.expert_parallel_size"] and "6 training ranks" in odd[0].message
    fits = _config(moe_dir, actor=four, resources={**gpus, "rollout_workers": 4}, rollout={"mode": "one_step_off"})
    assert check_expert_parallel(fits, ctx) == []


def test_what_expert_parallelism_does_not_cover_yet_is_refused(moe_dir, tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    ep = {"expert_parallel_size": 2}
    lora = dataclasses.replace(Config().model.lora, rank=8)
    with_sp = {**ep, "ulysses_sequence_parallel_size": 2, "moe_aux_loss_coef": 0.0}
    cases = [("rollout.engine", {"rollout": {"engine": "sglang"}}), ("model.lora.rank", {"model": {"lora": lora}}),
             ("actor.ulysses_sequence_parallel_size", {"actor": with_sp}),   # sp and ep together, RL and SFT
             ("actor.ulysses_sequence_parallel_size", {"actor": with_sp, "run": {"kind": "sft"}})]
    for key, change in cases:
        problems = check_expert_parallel(_config(moe_dir, resources={"workers": 2}, **{"actor": ep, **change}), ctx)
        assert [p.key for p in problems] == [key] and "not supported yet" in problems[0].message, key
    for built in ({"mode": "one_step_off"}, {"mode": "async"}):   # the export gathers the experts
        assert check_expert_parallel(_config(moe_dir, actor=ep, resources={"workers": 2}, rollout=built), ctx) == []
    vllm = check_expert_parallel(_config(moe_dir, actor=ep, resources={"workers": 2}, rollout={"engine": "vllm"}), ctx)
    assert [(p.key, p.severity) for p in vllm] == [("rollout.engine", "warning")]   # built; its layout stated
    assert "each rank's engine holds every expert" in vllm[0].message


def test_the_aux_loss_coefficient_is_the_models_off_or_a_weight(moe_dir, tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    for fine in (-1.0, 0.0, 0.01):
        assert check_expert_parallel(_config(moe_dir, actor={"moe_aux_loss_coef": fine}), ctx) == [], fine
    odd = check_expert_parallel(_config(moe_dir, actor={"moe_aux_loss_coef": -0.5}), ctx)
    assert [p.key for p in odd] == ["actor.moe_aux_loss_coef"] and "use -1" in odd[0].message


def test_the_aux_loss_with_sequence_parallelism_is_refused_for_an_moe_model_only(moe_dir, tiny_model_dir, tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    sp = {"ulysses_sequence_parallel_size": 2}
    refused = check_expert_model(_config(moe_dir, actor=sp), ctx)
    assert [p.key for p in refused] == ["actor.moe_aux_loss_coef"] and "sequence parallelism" in refused[0].message
    assert check_expert_model(_config(moe_dir, actor={**sp, "moe_aux_loss_coef": 0.0}), ctx) == []
    assert check_expert_model(_config(tiny_model_dir, actor=sp), ctx) == []   # a dense model has no router


def test_what_is_built_passes(moe_dir, tmp_path):
    """SFT, gradient checkpointing and the reference refresh run with the experts split
    (tests/sft/test_sft_expert_parallel.py, tests/workers/test_expert_parallel_engine.py)."""
    ctx = CheckContext(base_dir=tmp_path, raw={})
    built = {"run": {"kind": "sft"}, "model": {"gradient_checkpointing": True},
             "algorithm": {"ref_update_every": 2}}
    for section, change in built.items():
        c = _config(moe_dir, actor={"expert_parallel_size": 2}, resources={"workers": 2}, **{section: change})
        assert check_expert_parallel(c, ctx) == [], section


def test_sft_runs_with_expert_parallelism_and_its_machine_pass_reads_the_experts(moe_dir, tiny_model_dir, tmp_path):
    from rlctl.config.loader import load_config
    from rlctl.project import write_project
    from rlctl.validate import validate

    ctx = CheckContext(base_dir=tmp_path, raw={})
    sft = _config(moe_dir, actor={"expert_parallel_size": 2}, resources={"workers": 2}, run={"kind": "sft"})
    assert check_expert_parallel(sft, ctx) == []
    for model, refused in ((moe_dir, False), (tiny_model_dir, True)):
        write_project(tmp_path / model.name, "sft-arith-cpu", str(model))
        loaded = load_config(tmp_path / model.name / "rlctl.toml", ["actor.expert_parallel_size=2"])
        problems = [p for p in validate(loaded)[0] if p.key == "actor.expert_parallel_size"]
        assert len(problems) == refused and all("has no experts" in p.message for p in problems), problems


def test_router_replay_needs_an_moe_model_and_a_log_prob_pass_to_replay(moe_dir, tiny_model_dir, tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    replay = {"router_replay": True}
    for ep in (1, 2):
        ok = _config(moe_dir, actor={**replay, "expert_parallel_size": ep}, resources={"workers": 2})
        assert check_expert_parallel(ok, ctx) == [] and check_router_replay_model(ok, ctx) == [], ep
    assert check_router_replay_model(_config(tiny_model_dir), ctx) == []   # off: nothing read
    dense = check_router_replay_model(_config(tiny_model_dir, actor=replay), ctx)
    assert [p.key for p in dense] == ["actor.router_replay"] and "has no experts" in dense[0].message
    bypass = dataclasses.replace(Config().algorithm.rollout_correction, bypass_mode=True)
    cases = {"run.kind": {"run": {"kind": "sft"}},
             "actor.ulysses_sequence_parallel_size": {"actor": {**replay, "ulysses_sequence_parallel_size": 2}},
             "algorithm.rollout_correction.bypass_mode": {"algorithm": {"rollout_correction": bypass}}}
    for key, change in cases.items():
        problems = check_expert_parallel(_config(moe_dir, **{"actor": replay, **change}), ctx)
        assert [p.key for p in problems] == [key] and "actor.router_replay" in problems[0].message, key


def _moe_config_dir(tmp_path, model_type: str, **experts):
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  **experts)
    config.save_pretrained(tmp_path / model_type)
    return tmp_path / model_type, config


def test_only_the_tested_moe_families_are_split_and_gpt_oss_banks_with_biases_are_refused(tmp_path, monkeypatch):
    """gpt-oss keeps per-expert biases [E, ...] beside its banks: ep would leave them whole and index
    them by local expert ids. Validate refuses every family not tested at ep = 2, in one line, and
    split_experts refuses a bank with parameters it does not slice."""
    from transformers import AutoModelForCausalLM

    from rlctl.errors import ConfigError
    from rlctl.workers.parallel import expert_parallel

    ctx = CheckContext(base_dir=tmp_path, raw={})
    ep = {"expert_parallel_size": 2}
    gpt_oss, config = _moe_config_dir(tmp_path, "gpt_oss", num_local_experts=4, num_experts_per_tok=2)
    deepseek, _ = _moe_config_dir(tmp_path, "deepseek_v3", n_routed_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=16, n_group=1, topk_group=1)
    for folder, name in ((gpt_oss, "gpt_oss"), (deepseek, "deepseek_v3")):
        problems = check_expert_model(_config(folder, actor=ep, resources={"workers": 2}), ctx)
        assert [p.key for p in problems] == [KEY] and f"not {name}" in problems[0].message, problems
        assert "qwen3_moe" in problems[0].message and "\n" not in problems[0].message
    groups = expert_parallel.ExpertGroups(2, 0, 2, None, None)   # no exchange runs: refused before
    with pytest.raises(ConfigError, match="tested on"):
        expert_parallel.split_experts(AutoModelForCausalLM.from_config(config), groups)
    monkeypatch.setattr(expert_parallel, "TESTED_FAMILIES", (*expert_parallel.TESTED_FAMILIES, "gpt_oss"))
    with pytest.raises(ConfigError, match=r"per-expert parameters .*\(gate_up_proj_bias, down_proj_bias\)"):
        expert_parallel.split_experts(AutoModelForCausalLM.from_config(config), groups)
