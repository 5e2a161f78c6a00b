"""AdamW with its two moments held in bfloat16 (`actor.optimizer_state_dtype = "bfloat16"`).

The parameters stay float32 masters and each update is computed in float32; only the stored moments
are bfloat16, half the bytes of torch's AdamW state (0.54 GB less for a 135 M model). The first moment
is rounded to nearest: it moves by (1 - beta1) = 10% of its size per step, far above bfloat16's 2^-8
spacing. The second moment moves by (1 - beta2) = 0.1% per step, below that spacing, so rounding to
nearest would freeze it; it is rounded stochastically (unbiased: the expected stored value is the float32
one), from a generator seeded by (step, parameter index, chunk), so a resumed run draws the same bits.
The update is the formula of torch.optim.AdamW (decoupled weight decay, bias correction, eps outside
the square root); its state_dict has the same keys, so checkpoints save and load it unchanged.
"""

from __future__ import annotations

import math

import torch

_CHUNK = 1 << 22   # elements per float32 working piece: a few 16 MB temporaries, whatever the parameter's size
_SEED_STRIDE = 1_000_003


def stochastic_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x (float32) rounded to bfloat16 up or down with probabilities that make the result unbiased:
    uniform noise in the 16 bits bfloat16 drops, then truncation (which acts on the magnitude, either sign)."""
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    return (x.view(torch.int32) + noise).bitwise_and_(-65536).view(torch.float32).to(torch.bfloat16)


class BF16StateAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update over float32 parameters with bfloat16 exp_avg / exp_avg_sq."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts every floating state to its parameter's dtype (float32): back to bfloat16,
        exactly (the saved values are bfloat16)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("BF16StateAdamW.step takes no closure")
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                self._update(p, state, group, index)

    def _update(self, p: torch.Tensor, state: dict, group: dict, index: int) -> None:
        """One parameter (a plain tensor or this rank's local shard of a DTensor), chunk by chunk."""
        local = p.to_local() if hasattr(p, "to_local") else p
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        m_all, v_all = (state[k].to_local() if hasattr(state[k], "to_local") else state[k]
                        for k in ("exp_avg", "exp_avg_sq"))
        step = int(state["step"])
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        step_size = lr / (1 - beta1 ** step)
        bias2_sqrt = math.sqrt(1 - beta2 ** step)
        flat = [local.view(-1), grad.reshape(-1), m_all.view(-1), v_all.view(-1)]
        generator = torch.Generator(device=local.device)
        for chunk, start in enumerate(range(0, local.numel(), _CHUNK)):
            w, g, m16, v16 = (t[start:start + _CHUNK] for t in flat)
            g = g.float()
            m = m16.float().lerp_(g, 1 - beta1)
            v = v16.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
            w.mul_(1 - lr * decay)
            w.addcdiv_(m, v.sqrt().div_(bias2_sqrt).add_(eps), value=-step_size)
            m16.copy_(m)
            generator.manual_seed((step * _SEED_STRIDE + index) * _SEED_STRIDE + chunk)
            v16.copy_(stochastic_bf16(v, generator))
