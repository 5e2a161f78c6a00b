"""Property tests for the losses: whatever sits under padding (any value, NaN, inf) changes neither
the loss nor the metrics, and no gradient reaches a padded position."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.algorithms import kl_penalty, policy_loss, value_loss

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
FAST = settings(max_examples=30, deadline=None)


@st.composite
def padded(draw):
    """log-probs, advantages, returns and values with a right-padded mask (every row >= 1 token)."""
    b, t = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    x = {k: rng.normal(size=(b, t)) for k in ("old", "new", "adv", "ret", "val", "vpred", "ref")}
    return mask, x


def junked(x: np.ndarray, mask: np.ndarray, rng_seed: int = 0) -> np.ndarray:
    """`x` with padding replaced by garbage: huge values, NaN and inf."""
    garbage = np.random.default_rng(rng_seed).choice([1e30, -1e30, np.nan, np.inf, -np.inf, 7.0], size=x.shape)
    return np.where(mask, x, garbage)


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def clean_and_junked(mask, x, grad_key: str, loss_of) -> list[tuple[float, dict]]:
    """(loss, metrics) on the clean inputs and on the same inputs with junk under the padding.
    loss_of(leaf, arrays) -> (loss, metrics), where leaf is arrays[grad_key] as a tensor that takes
    gradients. Checks each loss is finite and that no gradient reaches a padded position."""
    out = []
    for f in (lambda a: a, lambda a: junked(a, mask)):
        arrays = {k: f(v) for k, v in x.items()}
        leaf = t(arrays[grad_key], grad=True)
        loss, metrics = loss_of(leaf, arrays)
        loss.backward()
        assert torch.isfinite(loss) and torch.all(leaf.grad[~torch.tensor(mask)] == 0)
        out.append((float(loss), {k: float(v) for k, v in metrics.items()}))
    return out


POLICY_LOSSES = ["vanilla", "gspo", "sapo", "cispo", "geo_mean", "clip_cov", "kl_cov", "gpg", "dppo_tv", "dppo_kl", "dro"]


@pytest.mark.parametrize("name", POLICY_LOSSES)
@pytest.mark.parametrize("mode", MODES)
@FAST
@given(case=padded())
def test_policy_loss_ignores_padding(name, mode, case):
    mask, x = case
    # log-probs of sampled tokens are <= 0 (the DPPOs read them as probabilities); clip_cov picks
    # among its candidates with torch's RNG, so both runs start from one seed
    x = {**x, "old": -np.abs(x["old"]), "new": -np.abs(x["new"])}

    def loss_of(new, a):
        torch.manual_seed(0)
        return policy_loss(name, old_log_prob=t(a["old"]), log_prob=new, advantages=t(a["adv"]),
                           response_mask=t(mask), loss_agg_mode=mode, clip_cov_ratio=0.3, clip_cov_lb=0.0,
                           kl_cov_ratio=0.3, dro_beta=0.3, rollout_is_weights=t(np.abs(a["ref"])))   # junk there too

    out = clean_and_junked(mask, x, "new", loss_of)
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-12, abs=1e-12)
    assert out[0][1] == pytest.approx(out[1][1], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
@FAST
@given(case=padded())
def test_value_loss_ignores_padding(mode, case):
    mask, x = case
    out = clean_and_junked(mask, x, "vpred", lambda vpred, a: value_loss(
        vpreds=vpred, returns=t(a["ret"]), values=t(a["val"]), response_mask=t(mask), value_clip=0.5,
        loss_agg_mode=mode))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "k1+", "abs+", "k3+", "low_var_kl+"])
@FAST
@given(case=padded())
def test_kl_loss_through_aggregation_ignores_padding(kind, case):
    from rlctl.algorithms import aggregate_loss

    mask, x = case
    out = clean_and_junked(mask, x, "new", lambda logp, a: (aggregate_loss(
        kl_penalty(logp, t(a["ref"]), kind, response_mask=t(mask)), t(mask), "token-mean"), {}))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-12, abs=1e-12)
