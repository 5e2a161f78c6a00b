"""`rlctl config from-verl` over launch scripts in the shapes verl's examples/ take (written here,
tests/fixtures/verl): SFT under torchrun, `if` / `case` branches, empty environment defaults, `+key`
additions, recipe entry points, non-trainer tools, and the algorithms whose verl semantics the
conversion keeps (CISPO, SAPO, GDPO, OPD, rollout correction) and verl's batch arithmetic."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from support.cli import rlctl_here

from rlctl.cli.config_cmd import known_algorithms
from rlctl.config.from_verl import checked, convert, to_toml
from rlctl.config.loader import load_config
from rlctl.config.verl_script import read_launch
from rlctl.errors import UsageError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"
# scripts that stop before verl's trainer or run another tool: what they answer instead
REFUSED = {"merge_checkpoint.sh": "rlctl merge", "recipe_unknown.sh": "no 'flowrl' algorithm"}
ARGS = {"sft_torchrun_gsm8k.sh": ["8", "checkpoints/sft"]}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("MODEL_PATH", "STEPS", "NNODES", "SLURM_GPUS_PER_NODE", "BACKEND", "SP_SIZE", "LOSS", "ENTRYPOINT",
                 "NUM_TRAINERS", "STUDENT", "TEACHER"):
        monkeypatch.delenv(name, raising=False)


def convert_launch(words: list[str]):
    """What `rlctl config from-verl WORDS` writes: (text, typed values, conversion)."""
    conversion = convert(read_launch(words), known_algorithms())
    typed = checked(conversion)
    return to_toml(typed, conversion, words[0]), typed, conversion


def _convert(name: str, *args: str):
    text, typed, conversion = convert_launch([str(FIXTURES / name), *(args or ARGS.get(name, []))])
    return text, typed, {key: why for key, _, why in conversion.not_honoured}


def _problems(text: str, tmp_path: Path) -> list[str]:
    from rlctl.validate import validate

    path = tmp_path / "rlctl.toml"
    path.write_text(text)
    problems, _ = validate(load_config(path, [], strict=False), machine=False)
    return [str(p) for p in problems if p.severity == "error"]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.sh")))
def test_every_script_converts_to_toml_that_parses_and_validates(name, tmp_path):
    if name in REFUSED:
        with pytest.raises(UsageError, match=REFUSED[name]):
            _convert(name)
        return
    text, typed, _ = _convert(name)
    assert tomllib.loads(text)   # the loader's parser: what it writes always parses
    assert _problems(text, tmp_path) == []


def test_sft_torchrun_script_is_an_sft_config(tmp_path):
    text, typed, skipped = _convert("sft_torchrun_gsm8k.sh", "4", "ckpt", "trainer.total_epochs=3")
    assert typed["run.kind"] == "sft" and typed["resources.gpus_per_node"] == 4   # torchrun --nproc_per_node=$1
    assert (typed["sft.prompt_key"], typed["sft.prompt_dict_keys"]) == ("extra_info", ["question"])
    assert typed["sft.response_dict_keys"] == ["answer"]                         # a +key rlctl has: honoured
    assert typed["actor.lr"] == 1e-4 and typed["run.output_dir"] == "ckpt" and typed["run.total_epochs"] == 3
    assert "run.total_steps" not in typed and "trainer.total_training_steps" in skipped   # ${STEPS:-}: empty
    assert "use_remove_padding" in skipped
    with pytest.raises(UsageError, match="stops before its trainer .*Usage: sft_torchrun_gsm8k.sh"):
        convert_launch([str(FIXTURES / "sft_torchrun_gsm8k.sh")])   # bash would print its usage and exit 1


def test_sft_engine_script_follows_the_branch_bash_takes(monkeypatch):
    _, typed, skipped = _convert("sft_engine_branches.sh")
    assert typed["actor.lr"] == 2e-5 and typed["actor.ulysses_sequence_parallel_size"] == 2   # the fsdp branch
    assert typed["run.name"] == "sft-fsdp-sp2" and typed["sft.micro_batch_max_tokens"] == 65536
    assert typed["resources.gpus_per_node"] == 8 and "engine.tensor_model_parallel_size" not in skipped
    assert {"engine", "engine.strategy", "optim.betas", "data.pad_mode"} <= set(skipped)
    monkeypatch.setenv("BACKEND", "megatron")
    _, typed, skipped = _convert("sft_engine_branches.sh")
    assert typed["actor.lr"] == 9e-9 and "engine.tensor_model_parallel_size" in skipped


def test_sapo_case_block_and_empty_environment_defaults():
    text, typed, skipped = _convert("sapo_case_blocks.sh")
    assert typed["actor.policy_loss"] == "sapo" and typed["actor.loss_params"] == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert tomllib.loads(text)["actor"]["loss_params"] == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert typed["resources.gpus_per_node"] == 8 and typed["resources.nodes"] == 1   # '' -> verl's defaults
    assert "verl's default 8" in skipped["trainer.n_gpus_per_node"]
    assert "naive manager does not pass it" in skipped["reward.reward_kwargs.format_score"]   # +key: never fatal
    assert typed["reward.overlong.buffer_len"] == 512
    assert "critic.model.ulysses_sequence_parallel_size" not in skipped            # the gae branch is not taken


def test_cispo_absolute_bound_threshold_string_and_trtllm():
    _, typed, skipped = _convert("cispo_rollout_corr.sh")
    assert typed["actor.policy_loss"] == "cispo" and typed["actor.clip_ratio_low"] == 10.0
    assert typed["algorithm.rollout_correction.rollout_is_threshold"] == 4.0
    assert typed["rollout.engine"] == "vllm" and "TensorRT-LLM" in skipped["actor_rollout_ref.rollout.name"]
    assert typed["model.dtype"] == "bfloat16"
    assert "Megatron" in skipped["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"]
    assert "GPUs it finds" in skipped["trainer.device"]
    _, typed, _ = _convert("cispo_rollout_corr.sh", "vllm", "data.train_batch_size=32")   # ${@:2}
    assert typed["data.batch_size"] == 32


def test_a_lower_bound_of_one_or_more_is_refused_for_a_clipping_loss(tmp_path):
    text, _, _ = convert_launch(["actor_rollout_ref.actor.clip_ratio_low=10", "algorithm.adv_estimator=grpo",
                                 "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.model.path=m"])
    assert any("actor.clip_ratio_low: 10.0 must be < 1" in p for p in _problems(text, tmp_path))


def test_on_policy_distillation_becomes_rlctls_opd():
    _, typed, skipped = _convert("opd_arrays.sh")
    assert typed["distill.teacher"] == "Qwen/Qwen2.5-7B-Instruct" and typed["distill.loss"] == "k3"
    assert typed["distill.topk"] == 64 and typed["rollout.n"] == 1
    assert typed["algorithm.name"] == "reinforce_plus_plus" and "no groups" in skipped["algorithm.adv_estimator"]


def test_gdpo_reward_keys_from_hydra_additions_and_sglang_tp():
    _, typed, skipped = _convert("gdpo_recipe_sglang.sh")
    assert typed["algorithm.name"] == "gdpo"
    assert typed["algorithm.params"] == {"reward_keys": ["accuracy_reward", "format_reward"],
                                         "reward_weights": [1.0, 0.5]}
    assert typed["rollout.engine"] == "vllm" and typed["rollout.tensor_parallel_size"] == 2
    assert "tensor-parallel 1" in skipped["actor_rollout_ref.rollout.name"]
    assert "+key addition" in skipped["experiment.tracker.tag"]   # ++key: added or forced, never fatal


@pytest.mark.parametrize("name, says", [("merge_checkpoint.sh", "`rlctl merge RUN_DIR --to-hf OUT`"),
                                        ("recipe_unknown.sh", "recipe.flowrl.main_flowrl is verl's flowrl recipe")])
def test_non_trainer_and_unknown_recipe_are_one_line(name, says, tmp_path):
    result = rlctl_here("config", "from-verl", FIXTURES / name, "--out", tmp_path / "x.toml")
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.toml").exists()


def test_not_a_trainer_is_its_own_error():
    from rlctl.config.verl_script import NotATrainer

    with pytest.raises(NotATrainer, match="model merger"):
        convert_launch([str(FIXTURES / "merge_checkpoint.sh")])


# verl's batch arithmetic: per_rank = ppo_mini_batch_size * n // (GPUs // ulysses_sp), floored
_BASE = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=m", "trainer.nnodes=1"]


def test_verl_floors_where_rlctl_needs_whole_prompts(tmp_path):
    words = _BASE + ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=10",
                     "actor_rollout_ref.rollout.n=5", "trainer.n_gpus_per_node=8"]
    text, typed, conversion = convert_launch(words)
    # verl: 10 x 5 // 8 = 6 per rank, 48 sequences an update; rlctl: 8 prompts x 5 = 40 split over 8
    assert typed["actor.mini_batch_size"] == 8
    assert any("floors 10 x n 5 over 8 data-parallel ranks to 6" in why for _, _, why in conversion.not_honoured)
    assert _problems(text, tmp_path) == []


def test_micro_batch_fitted_to_each_workers_share_with_sequence_parallel(tmp_path):
    words = _BASE + ["algorithm.adv_estimator=gae", "data.train_batch_size=256", "critic.ppo_mini_batch_size=256",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=256", "trainer.n_gpus_per_node=8",
                     "critic.ppo_micro_batch_size_per_gpu=64", "critic.ulysses_sequence_parallel_size=2",
                     "critic.model.path=m", "critic.optim.lr=1e-5"]
    text, typed, _ = convert_launch(words)
    assert typed["critic.micro_batch_size"] == 32   # verl: 64 per dp rank of 4; rlctl: 32 per each of 8 workers
    assert _problems(text, tmp_path) == []


@pytest.mark.parametrize("extra, says", [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.n_gpus_per_node=8"],
     "4 x rollout.n=1 // 8 data-parallel ranks = 0: verl refuses this launch too"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
      "trainer.n_gpus_per_node=8"], "= 4 per rank, not a multiple of"),
])
def test_where_verl_refuses_the_arithmetic_so_does_the_conversion(extra, says):
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        convert_launch(_BASE + ["data.train_batch_size=32"] + extra)


def test_megatron_data_parallel_size_is_gpus_over_model_parallel():
    words = _BASE + ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                     "actor_rollout_ref.rollout.n=5", "trainer.n_gpus_per_node=8", "trainer.nnodes=2",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]
    megatron = ["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"]
    _, typed, _ = convert_launch(words + megatron)   # verl: 64 x 5 // (16 / 8) = 160 per rank, 16 divides it
    assert typed["actor.mini_batch_size"] == 64 and typed["actor.micro_batch_size"] == 4   # rlctl: 20 per worker
    with pytest.raises(UsageError, match="= 20 per rank, not a multiple of"):   # FSDP: 16 data-parallel ranks
        convert_launch(words)


def test_a_table_value_is_written_as_a_toml_table():
    """verl's policy_loss.<knob> becomes [actor.loss_params]: written through tomlkit, it parses."""
    text, typed, _ = convert_launch(_BASE + ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
                                             "actor_rollout_ref.actor.policy_loss.tau_pos=1.0",
                                             "trainer.experiment_name=a \"quoted\" name # not a comment"])
    parsed = tomllib.loads(text)
    assert parsed["actor"]["loss_params"] == {"tau_pos": 1.0}
    assert parsed["run"]["name"] == 'a "quoted" name # not a comment'


@pytest.mark.parametrize("words, held", [
    (["[", "fsdp", "=", "fsdp", "]"], True), (["[[", "megatron", "==", "meg*", "]]"], True),
    (["[", "a", "!=", "a", "]"], False), (["[", "-z", "", "]"], True), (["[", "-n", "", "]"], False),
    (["[", "1", "-lt", "2", "]"], True), (["test", "3", "-ge", "4"], False),
    (["[", "-f", "x", "]"], None), (["command", "-v", "nvidia-smi"], None)])
def test_conditions_rlctl_can_read(words, held):
    from rlctl.config.verl_flow import condition

    assert condition(words) is held


def test_an_unreadable_condition_counts_as_taken(tmp_path):
    """`if command -v x` cannot be evaluated: both branches' assignments apply, the last wins (as before)."""
    script = tmp_path / "run.sh"
    script.write_text("if command -v nvidia-smi; then\n  N=8\nelse\n  N=0\nfi\n"
                      "if [ -f /nonexistent ]; then exit 1; fi\n"
                      "python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$N\n")
    assert read_launch([str(script)]).overrides == [("trainer.n_gpus_per_node", "0")]
