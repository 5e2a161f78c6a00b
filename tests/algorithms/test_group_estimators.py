"""verl's other estimators against the per-sequence references in algo_reference.py (junk under
the padding, groups not adjacent), what they declare they need, and a toy task each must learn."""

from __future__ import annotations

import algo_reference as ref
import numpy as np
import pytest
import torch

from rlctl.algorithms import AlgorithmError, algorithm_needs, compute_advantages, get_estimator

NEW = ("grpo_passk", "opo", "gpg", "gdpo", "optimal_token_baseline")


def case(seed: int, b: int = 12, t: int = 7):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    rewards = np.where(rng.random((b, t)) < 0.3, rng.normal(size=(b, t)), 0.0)
    rewards[0] = 0.0                                        # a zero score for gpg's alpha
    group_ids = [f"p{g}" for g in rng.permutation(np.repeat(np.arange(4), 3))]
    junk = rng.choice([1e30, -1e30, np.nan, np.inf], size=(b, t))
    return mask, rewards, np.where(mask, rewards, junk), group_ids, rng


def run(name, mask, junked, group_ids, **kw):
    adv, ret = compute_advantages(name, token_level_rewards=torch.tensor(junked), response_mask=torch.tensor(mask),
                                  group_ids=group_ids, **kw)
    assert torch.isfinite(adv).all() and torch.all(adv[~torch.tensor(mask)] == 0)
    return adv.numpy(), ret.numpy()


@pytest.mark.parametrize("seed", range(5))
def test_group_estimators_match_the_references(seed):
    mask, rewards, junked, gids, _ = case(seed)
    for norm in (True, False):
        adv, _ = run("grpo_passk", mask, junked, gids, norm_adv_by_std=norm)
        np.testing.assert_allclose(adv, ref.grpo_passk(rewards, mask, gids, norm), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run("opo", mask, junked, gids)[0], ref.opo(rewards, mask, gids), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run("gpg", mask, junked, gids)[0], ref.gpg(rewards, mask, gids), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_gdpo_normalises_each_component_before_mixing(seed):
    mask, rewards, junked, gids, rng = case(seed)
    components = rng.normal(size=(3, mask.shape[0]))
    components[1] *= 100.0                        # a dominant scale GRPO-on-the-sum would let win
    weights = [1.0, 0.5, 2.0]
    adv, _ = run("gdpo", mask, junked, gids, reward_components={k: torch.tensor(c) for k, c in zip("abc", components)},
                 params={"reward_keys": ["a", "b", "c"], "reward_weights": weights})
    np.testing.assert_allclose(adv, ref.gdpo(components, weights, mask, gids), rtol=1e-6, atol=1e-6)
    # without components the one component is the score (verl's fallback)
    scores = np.array([sum(r) for r in ref.compact(rewards, mask)])
    np.testing.assert_allclose(run("gdpo", mask, junked, gids)[0], ref.gdpo([scores], [1.0], mask, gids),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_optimal_token_baseline_matches_the_reference(seed):
    mask, rewards, junked, gids, rng = case(seed)
    old = -np.abs(rng.normal(size=mask.shape))
    spp = rng.uniform(0.1, 1.0, size=mask.shape)
    isw = rng.uniform(0.5, 2.0, size=mask.shape)
    junk = lambda x: torch.tensor(np.where(mask, x, np.nan))  # noqa: E731
    for weights in (None, isw):
        adv, ret = run("optimal_token_baseline", mask, junked, gids, old_log_prob=junk(old), sum_pi_squared=junk(spp),
                       rollout_is_weights=None if weights is None else junk(weights))
        want_adv, want_ret = ref.optimal_token_baseline(rewards, mask, gids, old, spp, weights)
        np.testing.assert_allclose(adv, want_adv, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ret, want_ret, rtol=1e-6, atol=1e-6)


def test_needs_are_declared_not_guessed_from_names():
    otb = algorithm_needs("optimal_token_baseline", kl_in_reward=False, use_kl_loss=False)
    assert otb.old_log_prob and otb.sum_pi_squared and otb.min_group_size == 2 and not otb.reference
    assert algorithm_needs("gdpo", kl_in_reward=False, use_kl_loss=False).reward_components
    for name in ("grpo_passk", "opo", "gpg"):
        needs = algorithm_needs(name, kl_in_reward=False, use_kl_loss=False)
        assert needs.min_group_size == 2 and not (needs.old_log_prob or needs.reward_components or needs.critic)
    mask, _, junked, gids, _ = case(0)
    with pytest.raises(AlgorithmError, match="needs old_log_prob"):
        run("optimal_token_baseline", mask, junked, gids)
    with pytest.raises(AlgorithmError, match="at least 2 samples per group"):
        run("grpo_passk", mask, junked, list(range(mask.shape[0])))
    with pytest.raises(AlgorithmError, match="reward_components must be a"):
        run("gdpo", mask, junked, gids, reward_components={"a": torch.zeros(3)}, params={"reward_keys": ["a"]})
    with pytest.raises(AlgorithmError, match=r"needs the reward components \['b'\]"):
        run("gdpo", mask, junked, gids, reward_components={"a": torch.zeros(3)}, params={"reward_keys": ["a", "b"]})
    assert "reward_components" in get_estimator("gdpo").reads


def _toy_inputs(name):
    if name == "optimal_token_baseline":
        return lambda tokens, mask, logp, logits: {
            "sum_pi_squared": torch.softmax(logits, -1).square().sum(-1).expand_as(mask)}
    if name == "gdpo":   # two components: the share of hits, and whether the first token hits
        return lambda tokens, mask, logp, logits: {
            "reward_components": {"share": ((tokens == 0).float() * mask).sum(-1) / mask.sum(-1),
                                  "first": (tokens[:, 0] == 0).float()},
            "params": {"reward_keys": ["share", "first"], "reward_weights": [1.0, 0.5]}}
    return None


@pytest.mark.parametrize("name", ["grpo", *NEW])
def test_every_estimator_learns_the_toy_task(name):
    from toy_task import learned, train_toy

    first, last = learned(train_toy(name, "vanilla", extra_inputs=_toy_inputs(name)))
    assert first < 0.3 and last > first + 0.3, f"{name}: reward {first:.3f} -> {last:.3f}"
