"""Property tests: masking, group means, leave-one-out, row permutation, GAE special case, and
agreement with the independent per-sequence re-derivations in algo_reference.py."""

from __future__ import annotations

import algo_reference as ref
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.algorithms import compute_advantages, masked_whiten

ALL = ("gae", "grpo", "rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
FAST = settings(max_examples=40, deadline=None)


@st.composite
def batches(draw, min_valid: int = 0):
    """A random batch: rewards, values, right-padded or holed masks, group ids, baselines."""
    b = draw(st.integers(1, 7))
    t = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random((b, t)) < draw(st.sampled_from([0.5, 0.8, 1.0]))
    if draw(st.booleans()):                           # right padding: a valid prefix per row
        lengths = rng.integers(min_valid, t + 1, size=b)
        mask = np.arange(t)[None, :] < lengths[:, None]
    if min_valid:
        mask[:, 0] = True
    rewards = np.where(mask, rng.normal(size=(b, t)).round(2), 0.0)
    if draw(st.booleans()):                           # outcome rewards: only the last valid token
        last = mask & (np.cumsum(mask, 1) == mask.sum(1, keepdims=True))
        rewards = np.where(last, rng.integers(0, 3, size=(b, t)).astype(float), 0.0)
    return dict(rewards=rewards, mask=mask, values=rng.normal(size=(b, t)),
                group_ids=list(rng.integers(0, max(1, b // 2) + 1, size=b)),
                baselines=rng.normal(size=b), gamma=draw(st.sampled_from([1.0, 0.9])),
                lam=draw(st.sampled_from([1.0, 0.95])))


def run(name, batch, **override):
    kw = dict(token_level_rewards=torch.tensor(batch["rewards"]), response_mask=torch.tensor(batch["mask"]),
              values=torch.tensor(batch["values"]), group_ids=batch["group_ids"],
              reward_baselines=torch.tensor(batch["baselines"]), gamma=batch["gamma"], lam=batch["lam"])
    kw.update(override)
    return compute_advantages(name, **kw)


@pytest.mark.parametrize("name", ALL)
@FAST
@given(batch=batches())
def test_padding_never_carries_advantage_and_padding_content_is_ignored(name, batch):
    adv, ret = run(name, batch)
    pad = ~torch.tensor(batch["mask"])
    assert torch.all(adv[pad] == 0) and torch.all(ret[pad] == 0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    junk = np.where(batch["mask"], 0.0, np.nan)                    # NaN / inf under padding change nothing
    junk[..., :1] = np.where(batch["mask"][..., :1], 0.0, np.inf)
    adv2, ret2 = run(name, batch, token_level_rewards=torch.tensor(batch["rewards"] + junk),
                     values=torch.tensor(batch["values"] + junk))
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


@FAST
@given(batch=batches(min_valid=1), norm=st.booleans())
def test_grpo_has_zero_mean_and_unit_std_per_group(batch, norm):
    adv, _ = run("grpo", batch, norm_adv_by_std=norm)
    seq_adv = adv[:, 0].numpy()
    ids = np.array(batch["group_ids"])
    for g in set(batch["group_ids"]):
        members = seq_adv[ids == g]
        if len(members) < 2:
            continue
        assert abs(members.mean()) < 1e-9
        scores = (batch["rewards"] * batch["mask"]).sum(1)[ids == g]
        if norm and scores.std() > 0.05:           # std / (std + 1e-6) is then within 2e-5 of 1
            assert abs(members.std(ddof=1) - 1) < 1e-4


@FAST
@given(batch=batches(min_valid=1))
def test_rloo_is_the_leave_one_out_formula(batch):
    adv, _ = run("rloo", batch)
    scores = (batch["rewards"] * batch["mask"]).sum(1)
    ids = np.array(batch["group_ids"])
    for i, g in enumerate(ids):
        others = [j for j in range(len(ids)) if ids[j] == g and j != i]
        expected = scores[i] - scores[others].mean() if others else scores[i]
        assert abs(adv[i, 0].item() - expected) < 1e-9


@pytest.mark.parametrize("name", ALL)
@FAST
@given(batch=batches(), seed=st.integers(0, 1000))
def test_shuffling_rows_with_their_group_ids_permutes_the_outputs(name, batch, seed):
    perm = np.random.default_rng(seed).permutation(len(batch["group_ids"]))
    shuffled = {k: (v[perm] if isinstance(v, np.ndarray) else v) for k, v in batch.items()}
    shuffled["group_ids"] = [batch["group_ids"][i] for i in perm]
    adv, ret = run(name, batch)
    adv_s, ret_s = run(name, shuffled)
    torch.testing.assert_close(adv_s, adv[perm], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(ret_s, ret[perm], atol=1e-9, rtol=1e-9)


@FAST
@given(batch=batches())
def test_gae_with_unit_gamma_lam_and_zero_values_is_return_to_go(batch):
    adv, ret = run("gae", batch, values=torch.zeros(batch["mask"].shape, dtype=torch.float64), gamma=1.0, lam=1.0)
    rewards, mask = torch.tensor(batch["rewards"]), torch.tensor(batch["mask"])
    to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(ret, to_go, atol=1e-12, rtol=0)
    torch.testing.assert_close(adv, masked_whiten(to_go, mask), atol=1e-9, rtol=0)


@FAST
@given(batch=batches())
def test_estimators_agree_with_independent_rederivations(batch):
    r, m, ids = batch["rewards"], batch["mask"], batch["group_ids"]
    expected = {
        "gae": ref.gae(r, batch["values"], m, batch["gamma"], batch["lam"]),
        "grpo": (ref.grpo(r, m, ids),) * 2,
        "rloo": (ref.rloo(r, m, ids),) * 2,
        "reinforce_plus_plus": ref.reinforce_plus_plus(r, m, batch["gamma"]),
        "reinforce_plus_plus_baseline": (ref.rf_baseline(r, m, ids),) * 2,
    }
    for name, (exp_adv, exp_ret) in expected.items():
        adv, ret = run(name, batch)
        np.testing.assert_allclose(adv.numpy(), exp_adv, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(ret.numpy(), exp_ret * m, atol=1e-7, err_msg=name)
    dr_adv, _ = run("grpo", batch, norm_adv_by_std=False)
    np.testing.assert_allclose(dr_adv.numpy(), ref.grpo(r, m, ids, norm_adv_by_std=False), atol=1e-9)
    remax_adv, _ = run("remax", batch)
    np.testing.assert_allclose(remax_adv.numpy(), ref.remax(r, m, batch["baselines"]), atol=1e-9)
