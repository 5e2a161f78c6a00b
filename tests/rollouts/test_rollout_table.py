"""The rollout table (rlctl.rollouts.table): the config selects one row, and the checks that refuse a
combination read the row's declarations (rlctl.rollouts.checks), for every kind alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlctl.config.checks import CheckContext
from rlctl.config.schema import Config
from rlctl.rollouts.checks import check_rollout_kind
from rlctl.rollouts.table import KINDS, environment_of, kind_of

CTX = CheckContext(base_dir=Path("."), raw={}, machine=False)


def config(algorithm: str = "grpo", **rollout) -> Config:
    c = Config()
    turns = rollout.pop("tools", False)
    agent = rollout.pop("agent", "")
    ro = dataclasses.replace(c.rollout, multi_turn=dataclasses.replace(c.rollout.multi_turn, enable=turns),
                             agent=dataclasses.replace(c.rollout.agent, function=agent), **rollout)
    return dataclasses.replace(c, rollout=ro, algorithm=dataclasses.replace(c.algorithm, name=algorithm))


def test_the_config_selects_one_row_and_every_row_names_a_class_that_exists():
    assert kind_of(config()).name == "single"
    assert kind_of(config(tools=True)).name == "tools"
    assert kind_of(config(agent="a.py:run")).name == "agent"
    assert kind_of(config(tools=True, agent="a.py:run")).name == "agent"   # and the check refuses the pair
    for kind in KINDS:
        cls = kind.rollout_class()
        assert all(callable(getattr(cls, m, None)) for m in ("generate", "score", "sample_rows", "join_groups",
                                                              "record_fields", "watch", "close")), kind.name


def test_the_checks_read_each_kinds_declarations():
    keys = lambda c: [p.key for p in check_rollout_kind(c, CTX)]   # noqa: E731
    assert keys(config()) == [] and keys(config(tools=True)) == [] and keys(config(agent="a.py:run")) == []
    for mode in ("one_step_off", "async"):
        assert keys(config(mode=mode)) == [] and keys(config(tools=True, mode=mode)) == []
        assert keys(config(agent="a.py:run", mode=mode)) == ["rollout.mode"]
    assert keys(config(tools=True, mode="async", partial_rollout=True)) == []   # a round is a turn
    assert keys(config("remax", tools=True)) == []                     # the tool loop has a greedy mode
    assert keys(config("remax", agent="a.py:run")) == ["rollout.agent.function"]
    assert keys(config("spin", tools=True)) == ["rollout.multi_turn.enable"]   # no reference pair
    assert keys(config("prime", tools=True)) == []   # the PRM reads the model's turns (the mask), not the tools'
    assert keys(config("prime")) == []
    both = check_rollout_kind(config(tools=True, agent="a.py:run"), CTX)
    assert [p.key for p in both] == ["rollout.multi_turn.enable"] and "agent programs" in both[0].message


def test_an_environment_library_declares_that_its_rows_carry_no_ground_truth():
    env = environment_of("verifiers/vf-calc")
    assert env is not None and env.agent == "verifiers" and not env.ground_truth
    assert environment_of("arith") is None and environment_of("reasoning_gym/leg_counting") is None


def test_rlctl_eval_runs_the_kind_the_run_trained_with_or_the_agent_it_is_given():
    from rlctl.serve.eval import EvalOptions, rollout_of

    kind, c, _ = rollout_of(None, Path("."), EvalOptions())
    assert kind.name == "single" and c is None                      # a bare model folder: single-turn
    assert rollout_of(config(tools=True), Path("."), EvalOptions())[0].name == "tools"
    kind, c, base = rollout_of(config(tools=True), Path("run"), EvalOptions(agent="a.py:run"))
    assert kind.name == "agent" and c.rollout.agent.function == "a.py:run" and not c.rollout.multi_turn.enable
    assert kind.own_reward(c) and base == Path.cwd()                # the agent's own reward, its file from here
    kind, c, _ = rollout_of(None, Path("."), EvalOptions(agent="a.py:run"))
    assert kind.name == "agent" and c.data.max_prompt_length == 1024


def _agent_project(tmp_path, model) -> Path:
    from rlctl.project import write_project
    from rlctl.tasks.prep import PrepOptions, prepare

    proj = tmp_path / "agent"
    write_project(proj, "grpo-agent-smollm2-cpu", str(model))
    prepare("arith", PrepOptions(out=proj / "data" / "arith", val_fraction=0.25))
    return proj


def test_agent_programs_refuse_a_vision_language_model_whose_images_they_cannot_carry(tmp_path, tiny_vlm_dir):
    """The agent endpoint takes text messages only (an image_url part is a 400: its engine has no
    processor) and the rows the agents get carry no images, so a VLM policy would never see them."""
    import json

    from support.cli import rlctl_here

    done = rlctl_here("config", "validate", "--format", "json", cwd=_agent_project(tmp_path, tiny_vlm_dir))
    errors = json.loads(done.stdout)["errors"]
    assert done.returncode == 2 and len(errors) == 1, done.stdout
    assert "rollout.agent.function: agent programs do not carry a vision-language model's images" in errors[0]
    assert "\n" not in errors[0]


def test_prime_with_agent_programs_is_not_refused(tmp_path, tiny_model_dir):
    """Its implicit PRM reads the response tokens the mask marks the policy's own (an agent's feedback turns
    are masked out) and the advantages count each episode once: tests/agent/test_agent_train.py trains it."""
    from support.cli import rlctl_here

    done = rlctl_here("config", "validate", "algorithm.name=prime", cwd=_agent_project(tmp_path, tiny_model_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert keys_of(config("prime", agent="a.py:run")) == []


def keys_of(c: Config) -> list[str]:
    return [p.key for p in check_rollout_kind(c, CTX)]
