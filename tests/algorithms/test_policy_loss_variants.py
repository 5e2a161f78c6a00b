"""verl's other policy losses against the plain-Python references in algo_reference.py on random
padded inputs (junk under the padding), plus the gradients the stop-gradient losses promise."""

from __future__ import annotations

import math

import algo_reference as ref
import numpy as np
import pytest
import torch

from rlctl.algorithms import policy_loss, policy_loss_names

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
NEW_LOSSES = ("sapo", "cispo", "geo_mean", "clip_cov", "kl_cov", "gpg", "dppo_tv", "dppo_kl", "dro")


def case(seed: int, b: int = 5, t: int = 6):
    """Log-probs of sampled tokens (<= 0), advantages, a right-padded mask, junk under padding."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    old = -np.abs(rng.normal(0.0, 1.0, size=(b, t)))
    new = np.minimum(old + rng.normal(0.0, 0.4, size=(b, t)), 0.0)
    adv = rng.normal(size=(b, t))
    junk = rng.choice([1e30, -1e30, np.nan, np.inf, -np.inf], size=(b, t))
    return mask, old, new, adv, {k: np.where(mask, v, junk) for k, v in (("old", old), ("new", new), ("adv", adv))}


def run(name, mask, junked, **kw):
    new = torch.tensor(junked["new"], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(name, old_log_prob=torch.tensor(junked["old"]), log_prob=new,
                                advantages=torch.tensor(junked["adv"]), response_mask=torch.tensor(mask), **kw)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all() and torch.all(new.grad[~torch.tensor(mask)] == 0)
    return loss.item(), metrics, new.grad


def test_all_verl_losses_are_registered():
    assert set(NEW_LOSSES) <= set(policy_loss_names())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", MODES)
def test_losses_match_the_references(seed, mode):
    mask, old, new, adv, junked = case(seed)
    kw = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode)
    loss, metrics, _ = run("sapo", mask, junked, tau_pos=1.0, tau_neg=1.05, **kw)
    want, want_m = ref.sapo(old, new, adv, mask)
    assert loss == pytest.approx(want, rel=1e-10) and metrics["ppo_kl"] == pytest.approx(want_m["ppo_kl"])
    for name, fn in (("cispo", ref.cispo),):
        loss, metrics, _ = run(name, mask, junked, **kw)
        want, want_m = fn(old, new, adv, mask, 0.2, 0.28, mode)
        assert loss == pytest.approx(want, rel=1e-10) and metrics["pg_clipfrac"] == pytest.approx(want_m["pg_clipfrac"])
    loss, metrics, _ = run("geo_mean", mask, junked, **kw)
    want, want_m = ref.geo_mean(old, new, adv, mask, 0.2, 0.28)
    assert loss == pytest.approx(want, rel=1e-10)
    assert metrics["pg_clipfrac"] == pytest.approx(want_m["pg_clipfrac"])
    assert metrics["pg_clipfrac_lower"] == pytest.approx(want_m["pg_clipfrac_lower"])
    loss, _, _ = run("gpg", mask, junked, **kw)
    assert loss == pytest.approx(ref.gpg_loss(new, adv, mask, mode), rel=1e-10)
    for ratio in (0.0002, 0.3):
        loss, _, _ = run("kl_cov", mask, junked, kl_cov_ratio=ratio, ppo_kl_coef=0.5, **kw)
        assert loss == pytest.approx(ref.kl_cov(old, new, adv, mask, mode, ratio, 0.5), rel=1e-10)
    for kind in ("tv", "kl"):
        # thresholds small enough that some tokens leave the trust region, c small enough to truncate
        loss, metrics, _ = run(f"dppo_{kind}", mask, junked, clip_ratio_low=0.05, clip_ratio_high=0.02,
                               clip_ratio_c=1.2, loss_agg_mode=mode)
        want, want_m = ref.dppo(kind, old, new, adv, mask, 0.05, 0.02, 1.2, mode)
        assert loss == pytest.approx(want, rel=1e-10)
        assert metrics["pg_clipfrac"] == pytest.approx(want_m["pg_clipfrac"])
        assert metrics["pg_clipfrac_lower"] == pytest.approx(want_m["pg_clipfrac_lower"])
    for beta in (0.1, 2.0):
        loss, metrics, _ = run("dro", mask, junked, dro_beta=beta, **kw)
        want, want_m = ref.dro(old, new, adv, mask, beta, mode)
        assert loss == pytest.approx(want, rel=1e-10) and metrics["ppo_kl"] == pytest.approx(want_m["ppo_kl"])


def test_dro_gradient_and_its_missing_beta():
    """d/dlog pi of dro = (-A + beta (log pi - log pi_old)) / N under token-mean; no beta is an error."""
    mask, old, new, adv, junked = case(12)
    _, _, grad = run("dro", mask, junked, dro_beta=0.5)
    np.testing.assert_allclose(grad.numpy()[mask], ((-adv + 0.5 * (new - old)) / mask.sum())[mask], rtol=1e-10)
    from rlctl.algorithms import AlgorithmError

    for beta in (None, 0.0):
        with pytest.raises(AlgorithmError, match="dro_beta"):
            run("dro", mask, junked, dro_beta=beta)


@pytest.mark.parametrize("seed", range(6))
def test_clip_cov_detaches_the_right_tokens(seed):
    mask, old, new, adv, junked = case(seed, b=6, t=8)
    kw = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_lb=0.05, clip_cov_ub=2.0)
    candidates = ref.clip_cov_candidates(old, new, adv, mask, 0.2, 0.2, 0.05, 2.0)
    # ratio 1: every candidate is detached, so the loss is deterministic
    loss, metrics, grad = run("clip_cov", mask, junked, clip_cov_ratio=1.0, **kw)
    assert loss == pytest.approx(ref.clip_cov(old, new, adv, mask, 0.2, 0.2, "token-mean", set(candidates)), rel=1e-10)
    assert metrics["pg_clipfrac"] == pytest.approx(len(candidates) / mask.sum())
    assert all(grad[i, j] == 0 for i, j in candidates)
    # a small ratio detaches max(1, int(ratio N)) of them, picked at random
    torch.manual_seed(seed)
    _, metrics, grad = run("clip_cov", mask, junked, clip_cov_ratio=0.0002, **kw)
    assert metrics["pg_clipfrac"] == pytest.approx(min(1, len(candidates)) / mask.sum())


def test_stop_gradient_losses_have_the_promised_gradients():
    """cispo and the DPPOs are REINFORCE-shaped: d/dlogp = -w A / N with a detached weight w."""
    mask, old, new, adv, junked = case(11)
    n = mask.sum()
    _, _, grad = run("cispo", mask, junked, clip_ratio_low=0.2, clip_ratio_high=0.28)
    w = np.clip(np.exp(new - old), 0.8, 1.28)
    np.testing.assert_allclose(grad.numpy()[mask], (-w * adv / n)[mask], rtol=1e-10)
    _, _, grad = run("gpg", mask, junked)
    np.testing.assert_allclose(grad.numpy()[mask], (-adv / n)[mask], rtol=1e-10)
    _, _, grad = run("dppo_tv", mask, junked, clip_ratio_low=1.0, clip_ratio_high=1.0, clip_ratio_c=1.1)
    w = np.minimum(np.exp(new - old), 1.1)
    np.testing.assert_allclose(grad.numpy()[mask], (-w * adv / n)[mask], rtol=1e-10)


def test_sapo_gate_has_slope_one_at_ratio_one():
    """f(r) = sigmoid(tau (r - 1)) 4 / tau: f(1) = 2 / tau and df/dr(1) = 1, so at r = 1 the
    gradient w.r.t. log pi is -A per token (seq-mean-token-mean over one sequence of two tokens)."""
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    new = old.clone().requires_grad_()
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, _ = policy_loss("sapo", old_log_prob=old, log_prob=new, advantages=adv, response_mask=torch.ones(1, 2),
                          tau_pos=1.0, tau_neg=1.05)
    assert loss.item() == pytest.approx((-2.0 / 1.0 + 2.0 / 1.05) / 2)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-0.5, 0.5]], dtype=torch.float64))
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("name", ["vanilla", "gspo", *NEW_LOSSES])
def test_every_loss_learns_the_toy_task(name):
    from toy_task import learned, train_toy

    # clip_cov / kl_cov with verl's 0.02% would touch no token here: use a visible share
    kwargs = {"clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0},
              "kl_cov": {"kl_cov_ratio": 0.2}, "dro": {"dro_beta": 0.1}}.get(name, {})
    first, last = learned(train_toy("grpo", name, loss_kwargs=kwargs))
    assert first < 0.3 and last > first + 0.3, f"{name}: reward {first:.3f} -> {last:.3f}"
