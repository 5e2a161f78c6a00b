"""On-policy distillation losses: zero at the teacher, the policy-gradient form's expected gradient
is the exact reverse-KL gradient, and the supervised forms equal plain-PyTorch transcriptions of
TRL's generalised JSD and verl's low_var_kl (written out here, not imported from rlctl)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlctl.algorithms import (AlgorithmError, distill_advantages, distill_loss, distill_loss_names, distill_stats,
                              register_distill_loss)

V = 7


def _logits(seed: int, shape=(3, 4, V)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _topk_inputs(student_logits, teacher_logits, k):
    """Both models' log-probs at the teacher's top-k ids, as the teacher worker and the actor make them."""
    teacher = F.log_softmax(teacher_logits, -1)
    top, ids = teacher.topk(k, -1)
    return F.log_softmax(student_logits, -1).gather(-1, ids), top


@pytest.mark.parametrize("name", ["k3", "forward_kl_topk", "jsd"])
@pytest.mark.parametrize("k", [3, V])
def test_supervised_loss_is_zero_with_zero_gradient_at_the_teacher(name, k):
    logits = _logits(0).requires_grad_(True)
    topk, teacher_topk = _topk_inputs(logits, logits.detach(), k)
    sampled = torch.randint(0, V, logits.shape[:2], generator=torch.Generator().manual_seed(1))
    log_prob = F.log_softmax(logits, -1).gather(-1, sampled[..., None])[..., 0]
    mask = torch.ones(logits.shape[:2])
    loss, _ = distill_loss(name, response_mask=mask, log_prob=log_prob, teacher_log_prob=log_prob.detach(),
                           topk_log_prob=topk, teacher_topk_log_prob=teacher_topk, beta=0.3)
    loss.backward()
    assert abs(float(loss.detach())) < 1e-9
    assert float(logits.grad.abs().max()) < 1e-9


def test_pg_form_is_zero_at_the_teacher():
    log_prob = F.log_softmax(_logits(0), -1)[..., 0]
    adv = distill_advantages("k1", log_prob=log_prob, teacher_log_prob=log_prob.clone(),
                             response_mask=torch.ones_like(log_prob), coef=2.0)
    assert float(adv.abs().max()) == 0.0


def test_pg_form_expected_gradient_is_the_reverse_kl_gradient():
    """Toy categorical: E_{x~p}[A(x) grad log p(x)] with A = -(log p - log q), enumerated exactly,
    equals -grad KL(p || q) from autograd."""
    theta = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    q_log = F.log_softmax(torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(4)), -1)
    log_p = F.log_softmax(theta, -1)
    kl = (log_p.exp() * (log_p - q_log)).sum()
    (kl_grad,) = torch.autograd.grad(kl, theta, retain_graph=True)
    adv = distill_advantages("k1", log_prob=log_p[None], teacher_log_prob=q_log[None],
                             response_mask=torch.ones(1, V))[0]   # every token as a 1-token response
    surrogate = (log_p.exp().detach() * adv * log_p).sum()        # the PG loss is -surrogate
    (pg_grad,) = torch.autograd.grad(surrogate, theta)
    assert torch.allclose(pg_grad, -kl_grad, atol=1e-12)
    assert float(kl_grad.abs().max()) > 1e-3   # a real gradient, not 0 = 0


def test_pg_form_sampled_estimate_converges_to_the_reverse_kl_gradient():
    """The same with samples: the Monte-Carlo mean of A grad log p over 200k draws."""
    theta = torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    q_log = F.log_softmax(torch.randn(V, dtype=torch.float64, generator=torch.Generator().manual_seed(6)), -1)
    log_p = F.log_softmax(theta, -1)
    (kl_grad,) = torch.autograd.grad((log_p.exp() * (log_p - q_log)).sum(), theta, retain_graph=True)
    x = torch.multinomial(log_p.exp().detach(), 200_000, replacement=True,
                          generator=torch.Generator().manual_seed(7))
    adv = distill_advantages("k1", log_prob=log_p[x][None], teacher_log_prob=q_log[x][None],
                             response_mask=torch.ones(1, len(x)))
    (grad,) = torch.autograd.grad((adv * log_p[x][None]).mean(), theta)
    assert torch.allclose(grad, -kl_grad, atol=0.02)


def _trl_generalized_jsd(student_logits, teacher_logits, beta):
    """TRL GKDTrainer.generalized_jsd_loss (per token, summed over the vocabulary), transcribed."""
    s = F.log_softmax(student_logits, dim=-1)
    t = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        jsd = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        b = torch.tensor(beta, dtype=s.dtype)
        mixture = torch.logsumexp(torch.stack([s + torch.log(1 - b), t + torch.log(b)]), dim=0)
        jsd = b * F.kl_div(mixture, t, reduction="none", log_target=True) \
            + (1 - b) * F.kl_div(mixture, s, reduction="none", log_target=True)
    return jsd.sum(-1)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_jsd_over_the_whole_vocabulary_is_trls_formula(beta):
    student, teacher = _logits(10).requires_grad_(True), _logits(11)
    mask = torch.ones(student.shape[:2])
    topk, teacher_topk = _topk_inputs(student, teacher, V)
    loss, _ = distill_loss("jsd", response_mask=mask, topk_log_prob=topk, teacher_topk_log_prob=teacher_topk,
                           beta=beta)
    expected = _trl_generalized_jsd(student, teacher, beta).mean()
    assert torch.allclose(loss, expected, atol=1e-9)
    g1 = torch.autograd.grad(loss, student)[0]
    g2 = torch.autograd.grad(_trl_generalized_jsd(student, teacher, beta).mean(), student)[0]
    assert torch.allclose(g1, g2, atol=1e-9)


def test_forward_kl_topk_over_the_whole_vocabulary_is_the_forward_kl():
    student, teacher = _logits(12).requires_grad_(True), _logits(13)
    topk, teacher_topk = _topk_inputs(student, teacher, V)
    loss, _ = distill_loss("forward_kl_topk", response_mask=torch.ones(student.shape[:2]), topk_log_prob=topk,
                           teacher_topk_log_prob=teacher_topk)
    t, s = F.log_softmax(teacher, -1), F.log_softmax(student, -1)
    assert torch.allclose(loss, (t.exp() * (t - s)).sum(-1).mean(), atol=1e-9)


def test_forward_kl_topk_with_k_below_vocabulary_is_the_kl_of_the_bucketed_distributions():
    """k = 2 of 7: the teacher's 2 tokens and one bucket for the rest, KL written out by hand."""
    student, teacher = _logits(14, (1, 1, V)), _logits(15, (1, 1, V))
    topk, teacher_topk = _topk_inputs(student, teacher, 2)
    loss, _ = distill_loss("forward_kl_topk", response_mask=torch.ones(1, 1), topk_log_prob=topk,
                           teacher_topk_log_prob=teacher_topk)
    q = teacher_topk.exp()[0, 0].tolist()
    p = topk.exp()[0, 0].tolist()
    q, p = q + [1 - sum(q)], p + [1 - sum(p)]
    assert float(loss) == pytest.approx(sum(a * math.log(a / b) for a, b in zip(q, p)), abs=1e-9)
    assert float(loss) > 0


def test_k3_is_verls_low_var_kl_with_the_teacher_as_reference():
    log_prob = F.log_softmax(_logits(16), -1)[..., 2]
    teacher = F.log_softmax(_logits(17), -1)[..., 2]
    mask = torch.tensor([[1, 1, 1, 0]] * 3, dtype=torch.float64)
    loss, _ = distill_loss("k3", response_mask=mask, log_prob=log_prob, teacher_log_prob=teacher)
    kl = (teacher - log_prob).clamp(-20, 20)                       # verl kl_penalty "low_var_kl"
    kld = (torch.exp(kl) - kl - 1).clamp(min=-10, max=10)
    assert float(loss) == pytest.approx(float((kld * mask).sum() / mask.sum()), abs=1e-12)


def test_padding_gets_no_loss_and_no_advantage():
    log_prob = torch.tensor([[-1.0, -2.0, float("-inf")]])
    teacher = torch.tensor([[-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    adv = distill_advantages("k1", log_prob=log_prob, teacher_log_prob=teacher, response_mask=mask, coef=0.5)
    assert adv.tolist() == [[0.25, 0.5, 0.0]]
    stats = distill_stats(log_prob=log_prob.clamp_min(-5), teacher_log_prob=teacher, response_mask=mask,
                          in_teacher_topk=torch.tensor([[True, False, True]]))
    assert stats["rkl"] == pytest.approx(-0.75)
    assert stats["teacher_mass"] == pytest.approx((math.exp(-0.5) + math.exp(-1.0)) / 2)
    assert stats["overlap"] == pytest.approx(0.5)


def test_registry_refuses_duplicates_and_the_forms_are_kept_apart():
    assert set(distill_loss_names()) >= {"k1", "k3", "forward_kl_topk", "jsd"}
    with pytest.raises(AlgorithmError, match="already registered"):
        register_distill_loss("k3")(lambda **_: None)
    x = torch.zeros(1, 2)
    with pytest.raises(AlgorithmError, match="policy-gradient form"):
        distill_loss("k1", response_mask=x, log_prob=x, teacher_log_prob=x)
    with pytest.raises(AlgorithmError, match="supervised"):
        distill_advantages("k3", log_prob=x, teacher_log_prob=x, response_mask=x)


def test_schema_distill_losses_are_the_registered_ones():
    from rlctl.config.schema import DISTILL_LOSSES

    assert set(DISTILL_LOSSES) == set(distill_loss_names())
