"""`rlctl config from-verl`: verl launch scripts (fixtures in the form of verl's examples/ and recipe/
scripts) and overrides become an rlctl.toml; every key is mapped or listed; bad input is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import rlctl_here

from rlctl.cli.config_cmd import known_algorithms
from rlctl.config.from_verl import checked, convert, key_table, parse_value, to_toml
from rlctl.config.verl_rules import RULES, SAME, VERL_DEFAULTS
from rlctl.config.loader import LEAF_KEYS, load_config
from rlctl.config.verl_script import expand, read_launch
from rlctl.errors import UsageError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"
DOCS = Path(__file__).parents[2] / "docs" / "verl.md"


def _values(words, monkeypatch=None):
    conversion = convert(read_launch([str(w) for w in words]), known_algorithms())
    return checked(conversion), conversion


def test_dapo_recipe_script_maps_every_setting(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("TRAIN_FILE", raising=False)
    typed, conversion = _values([FIXTURES / "run_dapo_math.sh"])
    assert typed["data.train_files"] == ["/home/u/verl/data/dapo-math-17k.parquet"]   # ${VAR:-"${HOME}/..."}
    assert typed["data.max_prompt_length"] == 2048 and typed["data.max_response_length"] == 8192   # $((1024 * 8))
    assert (typed["actor.clip_ratio_low"], typed["actor.clip_ratio_high"]) == (0.2, 0.28)
    assert typed["algorithm.dynamic_sampling.enable"] is True and typed["algorithm.dynamic_sampling.max_gen_batches"] == 10
    assert typed["reward.overlong.buffer_len"] == 4096 and typed["reward.overlong.enable"] is True
    assert typed["actor.micro_batch_max_tokens"] == 2048 + 8192   # use_dynamic_bsz + ppo_max_token_len_per_gpu
    assert typed["rollout.val_n"] == 32 and typed["rollout.top_k"] == 0 and typed["rollout.engine"] == "vllm"
    assert typed["run.loggers"] == ["console", "wandb", "jsonl"]
    skipped = {key for key, _, _ in conversion.not_honoured}
    assert {"data.gen_batch_size", "actor_rollout_ref.actor.fsdp_config.param_offload",
            "actor_rollout_ref.rollout.val_kwargs.top_p", "trainer.resume_mode"} <= skipped
    assert all(why for _, _, why in conversion.not_honoured)


def test_script_arguments_reach_dollar_at_and_later_words_win(monkeypatch):
    monkeypatch.setenv("TRAIN_FILE", "/data/t.parquet")
    typed, _ = _values([FIXTURES / "run_dapo_math.sh", "trainer.total_epochs=3", "data.train_batch_size=64"])
    assert typed["run.total_epochs"] == 3 and typed["data.batch_size"] == 64
    assert typed["data.train_files"] == ["/data/t.parquet"]   # the environment beats the script's default


def test_grpo_example_script_and_verl_defaults(monkeypatch):
    monkeypatch.setenv("HOME", "/h")
    typed, conversion = _values([FIXTURES / "run_qwen_gsm8k_grpo.sh"])
    assert typed["rollout.engine"] == "vllm"   # ${1:-vllm} with no argument
    assert typed["actor.micro_batch_size"] == 40 and typed["actor.use_kl_loss"] is True
    assert typed["data.overlong_prompts"] == "filter" and typed["critic.pretrain_steps"] == 0
    assert "actor.micro_batch_max_tokens" not in typed   # no use_dynamic_bsz: off
    assert conversion.sources["run.val_before_train"] == "verl default" and typed["run.val_before_train"] is True


def test_newer_examples_with_override_arrays(monkeypatch):
    monkeypatch.setenv("HOME", "/h")
    monkeypatch.delenv("MODEL_PATH", raising=False)
    typed, conversion = _values([FIXTURES / "run_ppo_arrays.sh", "trainer.total_epochs=3"])
    assert typed["algorithm.name"] == "gae" and typed["data.train_files"] == ["/h/data/gsm8k/train.parquet"]
    assert typed["critic.model_path"] == "Qwen/Qwen2.5-0.5B-Instruct" and typed["critic.value_clip"] == 0.5   # +=( )
    assert typed["actor.micro_batch_max_tokens"] == (512 + 1024) * 2                     # nested $(( ( ) ))
    assert typed["critic.micro_batch_max_tokens"] == 32768                                # verl's default budget
    assert typed["run.name"] == "ppo arrays" and typed["run.total_epochs"] == 3          # "$@", then `| tee` ends it
    assert typed["actor.policy_loss"] == "vanilla"
    assert typed["critic.mini_batch_size"] == 64 and typed["data.overlong_prompts"] == "error"   # verl's, inherited


def test_a_critic_inherits_the_actors_token_budget_as_in_verl():
    typed, _ = _values(["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_dynamic_bsz=True",
                        "data.truncation=left"])
    assert typed["actor.micro_batch_max_tokens"] == 16384 and typed["critic.micro_batch_max_tokens"] == 32768
    assert typed["critic.mini_batch_size"] == 256 and typed["data.overlong_prompts"] == "truncate"


def test_overrides_alone_get_verl_defaults_where_rlctl_differs():
    typed, conversion = _values(["actor_rollout_ref.actor.optim.lr=3e-6", "+trainer.save_freq=-1"])
    assert typed["actor.lr"] == 3e-6 and typed["run.save_every"] == 0
    for key, (default, _) in VERL_DEFAULTS.items():
        assert typed[key] == default and conversion.sources[key] == "verl default"
    assert typed["algorithm.name"] == "gae"


def test_the_file_validates_and_names_its_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    typed, conversion = _values([FIXTURES / "run_dapo_math.sh"])
    text = to_toml(typed, conversion, "run_dapo_math.sh")
    assert "# actor_rollout_ref.actor.clip_ratio_high" in text and "#   data.gen_batch_size=1536:" in text
    (tmp_path / "rlctl.toml").write_text(text)
    loaded = load_config(tmp_path / "rlctl.toml")
    assert loaded.config.actor.clip_ratio_high == 0.28 and loaded.config.rollout.val_n == 32


@pytest.mark.parametrize("words, message", [
    (["data.train_batchsize=4"], "unknown verl key 'data.train_batchsize' (did you mean 'data.train_batch_size'?)"),
    (["data.train_batch_size=many"], "data.train_batch_size='many': expected an integer"),
    (["actor_rollout_ref.rollout.n=0"], "actor_rollout_ref.rollout.n=0"),
    (["nothing.sh"], "nothing.sh: no such script"),
])
def test_bad_input_is_one_line_exit_2(words, message, tmp_path):
    result = rlctl_here("config", "from-verl", *words, "--out", tmp_path / "x.toml")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.toml").exists()


def test_not_a_verl_command(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\npython3 train.py --lr 1e-6\n")
    with pytest.raises(UsageError, match="runs no verl trainer"):
        read_launch([str(script)])


def test_command_writes_the_file_and_lists_what_it_skips(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "rlctl.toml"
    result = rlctl_here("config", "from-verl", FIXTURES / "run_dapo_math.sh", "--model", "models/x", "--out", out)
    assert result.returncode == 0, result.stderr
    assert 'path = "models/x" # --model' in out.read_text()
    assert "does not honour" in result.stdout and "data.gen_batch_size" in result.stdout
    again = rlctl_here("config", "from-verl", "data.train_batch_size=8", "--out", out)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_shell_expansion(tmp_path):
    variables = {"A": "1"}
    assert expand("x=${A} y=${B:-2} z=$((A + 3)) w='$A'", variables, []) == "x=1 y=2 z=4 w='$A'"
    assert expand("${C:=5} $C ${1:-d} $2", variables, ["a"]) == "5 5 a "
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo \\\n  trainer.default_local_dir=$(pwd)/ckpt \\\n"
                      "  data.train_batch_size=4  # the batch\n")
    launch = read_launch([str(script)])
    assert launch.unresolved == ["trainer.default_local_dir"] and launch.overrides == [("data.train_batch_size", "4")]


def test_shell_forms_from_verls_recipe_scripts(tmp_path):
    """A last line that ends in a backslash, hydra's `--config-path DIR`, arithmetic on a variable a
    shell command set, a number for a text key (rollout_rs_threshold=1.01)."""
    script = tmp_path / "run.sh"
    script.write_text("n=$(nproc)\nnodes=$((n / 8))\n"
                      "python3 -m verl.trainer.main_ppo --config-path config --config-name ppo_trainer \\\n"
                      "  trainer.nnodes=$nodes algorithm.rollout_correction.rollout_rs_threshold=1.01 \\\n"
                      "  data.train_batch_size=16 \\")
    script.write_text("cat > notes.txt <<EOF\nit's a note with one quote\nEOF\n" + script.read_text())
    launch = read_launch([str(script)])
    assert launch.options == ["--config-path config", "--config-name ppo_trainer"]
    assert launch.unresolved == ["trainer.nnodes"]
    typed, conversion = _values([script])
    assert typed["algorithm.rollout_correction.rollout_rs_threshold"] == "1.01" and typed["data.batch_size"] == 16
    assert {k for k, _, _ in conversion.not_honoured} >= {"trainer.nnodes", "--config-path config"}


@pytest.mark.parametrize("text, value", [("True", True), ("false", False), ("null", None), ("1e-6", 1e-6), ("8", 8),
                                          ("'a b'", "a b"), ("[a,b]", ["a", "b"]), ("[]", []), ("x", "x")])
def test_hydra_values(text, value):
    assert parse_value(text) == value


def test_every_rule_targets_a_key_rlctl_has():
    missing = [r.rlctl for r in RULES if r.rlctl and r.rlctl != SAME and r.rlctl not in LEAF_KEYS]
    missing += [r.verl for r in RULES if r.rlctl == SAME and not any(k.startswith(r.verl[:-1]) for k in LEAF_KEYS)]
    assert missing == []
    assert all(r.why for r in RULES if not r.rlctl)


def test_docs_key_table_is_the_mapping():
    text = DOCS.read_text()
    start, end = "<!-- from-verl table: start -->\n", "<!-- from-verl table: end -->"
    assert start in text and end in text, "docs/verl.md lost its generated table markers"
    table = text.split(start, 1)[1].split(end, 1)[0]
    assert table == key_table(), "docs/verl.md is stale: run .venv/bin/python scripts/gen_verl_docs.py"
