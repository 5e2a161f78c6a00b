"""A toy dense-reward task trained by the rlctl.algorithms functions alone (no model, no Ray).

The policy is a table of logits [T, V]: each of T response tokens is drawn independently from
softmax(logits[t]). The reward of a sequence is the share of its tokens equal to token 0
(1 / V at the start). Each step samples `groups` x `n` sequences with random lengths (so the
mask has padding), scores them, computes advantages with the named estimator, and takes
`epochs` Adam steps on the named policy loss, exactly as the actor worker does.
"""

from __future__ import annotations

import torch

from rlctl.algorithms import compute_advantages, policy_loss, scores_to_token_rewards


def train_toy(estimator: str = "grpo", loss: str = "vanilla", *, steps: int = 25, groups: int = 4, n: int = 8,
              horizon: int = 6, vocab: int = 8, lr: float = 0.05, epochs: int = 2, seed: int = 0,
              loss_kwargs: dict | None = None, extra_inputs=None) -> list[float]:
    """Mean reward per step. extra_inputs(tokens, mask, log_probs, logits) -> dict of estimator inputs."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    logits = torch.zeros(horizon, vocab, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=lr)
    history = []
    for _ in range(steps):
        with torch.no_grad():
            probs = torch.softmax(logits, -1).expand(groups * n, horizon, vocab)
            tokens = torch.multinomial(probs.reshape(-1, vocab), 1, generator=gen).view(groups * n, horizon)
            lengths = torch.randint(2, horizon + 1, (groups * n,), generator=gen)
            mask = (torch.arange(horizon)[None] < lengths[:, None]).float()
            hits = ((tokens == 0).float() * mask).sum(-1) / mask.sum(-1)
            old_log_prob = torch.log_softmax(logits, -1)[torch.arange(horizon), tokens]
        history.append(hits.mean().item())
        rewards = scores_to_token_rewards(hits, mask)
        extra = extra_inputs(tokens, mask, old_log_prob, logits.detach()) if extra_inputs else {}
        advantages, _ = compute_advantages(estimator, token_level_rewards=rewards, response_mask=mask,
                                           group_ids=[i // n for i in range(groups * n)],
                                           old_log_prob=old_log_prob, **extra)
        for _ in range(epochs):
            log_prob = torch.log_softmax(logits, -1)[torch.arange(horizon), tokens]
            value, _ = policy_loss(loss, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                                   response_mask=mask, **(loss_kwargs or {}))
            opt.zero_grad()
            value.backward()
            opt.step()
    return history


def learned(history: list[float], window: int = 3) -> tuple[float, float]:
    return sum(history[:window]) / window, sum(history[-window:]) / window
