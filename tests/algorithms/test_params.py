"""An algorithm's parameters: the dataclass its registration declares, checked key by key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from rlctl.algorithms import AlgorithmError, get_estimator, get_policy_loss, policy_loss, register_policy_loss
from rlctl.algorithms.params import make_params, params_problems
from rlctl.config.loader import load_config
from rlctl.errors import ConfigError


@dataclass(frozen=True)
class Knobs:
    alpha: float = 0.5
    steps: int = 2
    on: bool = False
    names: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()


def test_every_problem_is_reported_with_did_you_mean():
    got = params_problems("loss 'x'", Knobs, {"alpah": 1, "steps": 1.5, "on": 1, "names": "a", "weights": [1, "b"]})
    assert got == [("alpah", "unknown parameter of loss 'x' (did you mean 'alpha'?); known: alpha, steps, on, names, "
                             "weights"),
                   ("steps", "loss 'x': expected an integer, got float 1.5"),
                   ("on", "loss 'x': expected true or false, got int 1"),
                   ("names", "loss 'x': expected a list of strings, got str 'a'"),
                   ("weights", "loss 'x': expected a list of finite numbers, got list [1, 'b']")]


def test_values_are_coerced_and_defaults_fill_the_rest():
    assert make_params("x", Knobs, {"alpha": 1, "weights": [1, 2]}) == Knobs(alpha=1.0, weights=(1.0, 2.0))
    assert make_params("x", None, {}) is None
    with pytest.raises(AlgorithmError, match="on: x: expected true or false"):
        make_params("x", Knobs, {"on": "yes"})


def test_registration_refuses_a_params_type_it_could_not_check():
    @dataclass
    class Mutable:
        a: float = 1.0

    @dataclass(frozen=True)
    class NoDefault:
        a: float

    @dataclass(frozen=True)
    class Odd:
        a: list = ()

    for params, why in ((Mutable, "frozen dataclass"), (NoDefault, "needs a default"), (Odd, "has type")):
        with pytest.raises(AlgorithmError, match=why):
            register_policy_loss(f"test_params_bad_{params.__name__}", params=params)


def test_the_builtins_declare_their_parameters():
    assert get_policy_loss("sapo").params().tau_neg == 1.05
    assert get_policy_loss("kl_cov").params().ppo_kl_coef == 0.1
    assert get_estimator("spin").params().dpo_beta == 0.1
    assert get_policy_loss("vanilla").params is None and get_estimator("grpo").params is None


def test_policy_loss_checks_its_table_and_a_keyword_overrides_it():
    old = torch.zeros(2, 3)
    new = torch.full((2, 3), 0.3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    kw = dict(old_log_prob=old, log_prob=new, advantages=adv, response_mask=torch.ones(2, 3))
    a, _ = policy_loss("sapo", params={"tau_pos": 2.0}, **kw)
    b, _ = policy_loss("sapo", params={"tau_pos": 1.0}, tau_pos=2.0, **kw)
    c, _ = policy_loss("sapo", **kw)
    assert float(a) == float(b) != float(c)
    with pytest.raises(AlgorithmError, match="did you mean 'tau_pos'"):
        policy_loss("sapo", params={"tau_pso": 2.0}, **kw)


@pytest.mark.parametrize("key, value, place", [
    ("actor.tau_pos", "1.5", "moved to [actor.loss_params] tau_pos: write `tau_pos = 1.5` under [actor.loss_params]"),
    ("actor.dro_beta", "0.1", "moved to [actor.loss_params] dro_beta"),
    ("algorithm.dpo_beta", "0.2", "moved to [algorithm.params] dpo_beta"),
    ("algorithm.gdpo_reward_keys", '["a"]', 'moved to [algorithm.params] reward_keys: write `reward_keys = ["a"]`'),
])
def test_a_moved_flat_key_is_refused_naming_its_new_place(key, value, place):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}={value}"])
    assert any(line.startswith(f"overrides: {key}: {place}") for line in info.value.problems), info.value.problems


def test_a_run_folder_written_before_the_move_still_loads(tmp_path):
    """config.resolved.toml of an older run holds every old flat key: those its algorithm reads move
    into the tables, the rest (defaults of algorithms it does not use) are dropped."""
    (tmp_path / "config.resolved.toml").write_text('''
[model]
path = "m"
[data]
train_files = ["t.parquet"]
[algorithm]
name = "spin"
dpo_beta = 0.3
gdpo_reward_keys = []
gdpo_reward_weights = []
[actor]
policy_loss = "sapo"
tau_pos = 1.5
tau_neg = 1.05
dro_beta = 0.0
sppo_eta = 1.0
''')
    config = load_config(tmp_path / "config.resolved.toml").config
    assert config.actor.loss_params == {"tau_pos": 1.5, "tau_neg": 1.05}
    assert config.algorithm.params == {"dpo_beta": 0.3}
    (tmp_path / "rlctl.toml").write_text((tmp_path / "config.resolved.toml").read_text())
    with pytest.raises(ConfigError):   # a user's own file is told where the keys went instead
        load_config(tmp_path / "rlctl.toml")
