"""Rollout correction (TIS / MIS) against the per-row references in algo_reference.py, junk under
the padding; the policy losses apply the weights; a config enabling it is validated."""

from __future__ import annotations

import math

import algo_reference as ref
import numpy as np
import pytest
import torch

from rlctl.algorithms import AlgorithmError, policy_loss, rollout_correction


def case(seed, b=6, t=7, drift=0.3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    rollout = -np.abs(rng.normal(size=(b, t)))
    old = rollout + rng.normal(0, drift, size=(b, t))
    junk = rng.choice([np.nan, np.inf, -np.inf, 1e30], size=(b, t))
    return mask, old, rollout, np.where(mask, old, junk), np.where(mask, rollout, junk)


def run(mask, old_j, roll_j, **kw):
    return rollout_correction(torch.tensor(old_j), torch.tensor(roll_j), torch.tensor(mask), **kw)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("seed", range(4))
def test_truncated_is_weights_and_metrics_match_verl(level, seed):
    mask, old, rollout, old_j, roll_j = case(seed)
    weights, new_mask, metrics = run(mask, old_j, roll_j, rollout_is=level, rollout_is_threshold=1.5)
    want_w, want_m = ref.rollout_is(old, rollout, mask, level, 1.5)
    np.testing.assert_allclose(weights.numpy(), want_w, rtol=1e-9, atol=1e-12)
    assert torch.equal(new_mask, torch.tensor(mask, dtype=new_mask.dtype))   # no rejection asked for
    for key, value in want_m.items():
        assert metrics[f"rollout_corr/{key}"] == pytest.approx(value, rel=1e-9), key
    valid = mask
    assert metrics["rollout_corr/kl"] == pytest.approx(float(np.mean((rollout - old)[valid])), rel=1e-9)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(
        float(np.mean((np.exp(old - rollout) - (old - rollout) - 1)[valid])), rel=1e-9)
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(float(np.mean(np.exp(old - rollout)[valid] ** 2) - 1),
                                                               rel=1e-9)


def test_batch_normalize_rescales_to_mean_one():
    mask, _, _, old_j, roll_j = case(1)
    for level in ("token", "sequence"):
        weights, _, metrics = run(mask, old_j, roll_j, rollout_is=level, rollout_is_threshold=3.0,
                                  rollout_is_batch_normalize=True)
        m = torch.tensor(mask, dtype=weights.dtype)
        mean = (weights * m).sum() / m.sum() if level == "token" else ((weights * m).sum(-1) / m.sum(-1)).mean()
        assert mean.item() == pytest.approx(1.0) and "rollout_corr/rollout_is_batch_norm_factor" in metrics


@pytest.mark.parametrize("option, threshold, bounds", [
    ("token_k1", "0.8_1.25", (0.8, 1.25)), ("token_k2", "0.02", (None, 0.02)), ("token_k3", "0.02", (None, 0.02)),
    ("seq_sum_k1", "2.0", (0.5, 2.0)), ("seq_sum_k2", "0.05", (None, 0.05)), ("seq_mean_k3", "0.03", (None, 0.03)),
    ("seq_mean_k1", "0.9_1.1", (0.9, 1.1)), ("seq_max_k2", "0.1", (None, 0.1)), ("seq_max_k3", "0.1", (None, 0.1)),
])
@pytest.mark.parametrize("seed", range(3))
def test_rejection_masks_match_verl(option, threshold, bounds, seed):
    mask, old, rollout, old_j, roll_j = case(seed)
    weights, new_mask, metrics = run(mask, old_j, roll_j, rollout_rs=option, rollout_rs_threshold=threshold)
    keep = ref.rollout_rs(old, rollout, mask, option, *bounds)
    assert weights is None
    np.testing.assert_array_equal(new_mask.numpy(), keep * mask)
    rejected = float(np.mean((1 - keep)[mask]))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected)
    assert metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"] == pytest.approx(rejected)
    assert 0.0 < rejected < 1.0 or seed, f"{option}: the case should reject some tokens, not all"


def test_options_combine_and_bad_specs_are_errors():
    mask, old, rollout, old_j, roll_j = case(2)
    _, both, _ = run(mask, old_j, roll_j, rollout_rs="token_k2,seq_mean_k3", rollout_rs_threshold="0.02,0.03")
    keep = ref.rollout_rs(old, rollout, mask, "token_k2", None, 0.02) * ref.rollout_rs(old, rollout, mask,
                                                                                         "seq_mean_k3", None, 0.03)
    np.testing.assert_array_equal(both.numpy(), keep * mask)
    for rs, thr, needle in (("token_k4", "1", "unknown rollout_rs"), ("token_k2", "", "needs rollout_rs_threshold"),
                            ("token_k2", "0.1_0.2", "only k1 options"), ("token_k1,token_k2", "1,2,3", "3 entries"),
                            ("token_k3", "x", "not a number"), ("token_k2", "-1", "must be positive")):
        with pytest.raises(AlgorithmError, match=needle):
            run(mask, old_j, roll_j, rollout_rs=rs, rollout_rs_threshold=thr)
    with pytest.raises(AlgorithmError, match="unknown rollout_is"):
        run(mask, old_j, roll_j, rollout_is="batch")


@pytest.mark.parametrize("name", ["vanilla", "gspo", "sapo", "cispo", "clip_cov", "kl_cov", "gpg", "dppo_tv",
                                  "dppo_kl"])
def test_policy_losses_multiply_their_token_terms_by_the_weights(name):
    """A loss with weights w equals the loss whose advantages carry w wherever the loss is linear
    in A per token (all of these, token for token), with the same gradient on valid tokens."""
    mask, old, rollout, old_j, roll_j = case(3, drift=0.1)
    w, _, _ = run(mask, old_j, roll_j, rollout_is="token", rollout_is_threshold=2.0)
    rng = np.random.default_rng(0)
    adv = torch.tensor(rng.normal(size=mask.shape))
    new = torch.tensor(np.where(mask, old + rng.normal(0, 0.05, size=mask.shape), 0.0))
    kw = dict(old_log_prob=torch.tensor(np.where(mask, old, 0.0)), response_mask=torch.tensor(mask),
              loss_agg_mode="token-mean", kl_cov_ratio=1e-9)
    torch.manual_seed(0)
    weighted, _ = policy_loss(name, log_prob=new, advantages=adv, rollout_is_weights=w, **kw)
    torch.manual_seed(0)
    plain, _ = policy_loss(name, log_prob=new, advantages=adv, **kw)
    assert not math.isclose(weighted.item(), plain.item())
    if name in ("gpg", "cispo"):   # linear in A with no A-dependent branch: weights fold into A exactly
        folded, _ = policy_loss(name, log_prob=new, advantages=adv * w, **kw)
        assert weighted.item() == pytest.approx(folded.item(), rel=1e-12)


def test_geo_mean_uses_the_geometric_mean_of_token_weights():
    mask, old, rollout, old_j, roll_j = case(4, drift=0.1)
    w, _, _ = run(mask, old_j, roll_j, rollout_is="token", rollout_is_threshold=2.0)
    adv = torch.ones(mask.shape, dtype=torch.float64)
    kw = dict(old_log_prob=torch.tensor(np.where(mask, old, 0.0)), log_prob=torch.tensor(np.where(mask, old, 0.0)),
              advantages=adv, response_mask=torch.tensor(mask))
    weighted, _ = policy_loss("geo_mean", rollout_is_weights=w, **kw)
    per_seq = [math.exp(np.mean(np.log(w.numpy()[i][mask[i]] + 1e-10))) for i in range(mask.shape[0])]
    assert weighted.item() == pytest.approx(-np.mean(per_seq), rel=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_bypass_mode_losses_match_verl(seed, mode):
    """verl's bypass mode: old_log_prob = the rollout's log-prob. ppo_clip is the vanilla PPO loss
    with ratio pi / pi_rollout (IS weights only logged); reinforce is -min(pi / pi_rollout, thr) A
    log pi. Rejected tokens leave the mask. Junk under padding changes nothing."""
    from rlctl.algorithms.policy_loss_variants import bypass_policy_loss

    mask, new, rollout, new_j, roll_j = case(seed)
    adv = np.random.default_rng(seed + 100).normal(size=mask.shape)
    adv_j = np.where(mask, adv, np.nan)

    def bypass(loss_type, **kw):
        leaf = torch.tensor(new_j, requires_grad=True)
        loss, metrics = bypass_policy_loss(rollout_log_prob=torch.tensor(roll_j), log_prob=leaf,
                                           advantages=torch.tensor(adv_j), response_mask=torch.tensor(mask),
                                           loss_type=loss_type, loss_agg_mode=mode, **kw)
        loss.backward()
        assert torch.isfinite(loss) and torch.all(leaf.grad[~torch.tensor(mask)] == 0)
        return loss.item(), metrics

    loss, metrics = bypass("ppo_clip", rollout_is="token", rollout_is_threshold=2.0, clip_ratio_high=0.28)
    want, _ = policy_loss("vanilla", old_log_prob=torch.tensor(rollout), log_prob=torch.tensor(new),
                          advantages=torch.tensor(adv), response_mask=torch.tensor(mask), loss_agg_mode=mode,
                          clip_ratio_high=0.28)
    assert loss == pytest.approx(want.item(), rel=1e-12)
    w, want_m = ref.rollout_is(new, rollout, mask, "token", 2.0)   # logged: pi_current / pi_rollout
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(want_m["rollout_is_mean"])

    loss, metrics = bypass("reinforce", rollout_is="token", rollout_is_threshold=2.0)
    rows = [[-wv * a * n for wv, a, n, m in zip(wr, ar, nr, mr) if m] for wr, ar, nr, mr in zip(w, adv, new, mask)]
    assert loss == pytest.approx(ref.agg(rows, mode, mask.shape[1]), rel=1e-10)
    assert metrics["ppo_kl"] == pytest.approx(float(np.mean((rollout - new)[mask])))

    keep = ref.rollout_rs(new, rollout, mask, "token_k1", 0.8, 1.25)
    loss, metrics = bypass("reinforce", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25")
    rows = [[-a * n for a, n, m in zip(ar, nr, mr) if m] for ar, nr, mr in zip(adv, new, (keep > 0) & mask)]
    assert 0 < (keep[mask] == 0).sum() < mask.sum()    # some tokens rejected, not all
    assert loss == pytest.approx(ref.agg(rows, mode, mask.shape[1]), rel=1e-10)
    with pytest.raises(AlgorithmError, match="loss_type"):
        bypass("reinforce_plus")
