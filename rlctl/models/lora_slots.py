"""Several LoRA adapters applied unmerged to one base model, each row of a batch with its own.

Every adapted linear layer gets a forward hook that adds delta = (x A_s^T) B_s^T for the adapter
s of each row (scale folded into B, rlctl.models.lora_adapter). The A and B of all slots are
stacked, the rank zero-padded to `max_rank`:
    A [slots + 1, max_rank, in]     B [slots + 1, out, max_rank]      slot 0 = no adapter (zeros)
so a batch whose rows carry different adapters costs one gathered batched matmul per layer
(Punica's BGMV, in torch) instead of one forward per adapter: the base weights, which dominate a
decode step, are read once per step whatever the mix. The padding adds exact zeros. A batch whose
rows all carry one adapter takes a plain matmul at that adapter's own rank.

Rows are set per thread (`rows(...)`), so a forward on a thread that set none sees the base model.
The stacks grow as adapters arrive (to the highest slot and the largest rank put so far, up to
`slots` and `max_rank`): a server sized for many adapters pays only for the ones it holds.
"""

from __future__ import annotations

import contextlib
import threading

import torch


class LoraSlots:
    """Up to `slots` adapters (1..slots) over the linear layers of `model`."""

    def __init__(self, model: torch.nn.Module, *, slots: int, max_rank: int):
        self.slots, self.max_rank = slots, max_rank
        self._linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        first = next(model.parameters())
        self._dtype, self._device = first.dtype, first.device
        self._a: dict[str, torch.Tensor] = {}
        self._b: dict[str, torch.Tensor] = {}
        self._rank = [0] * (slots + 1)      # each slot's own rank (0: empty)
        self._held = (1, 0)                 # (slots + 1, rank) the stacks are allocated for now
        self._hooks: list = []
        self._local = threading.local()

    def put(self, slot: int, weights: dict) -> None:
        """Load {module: (A [r, in], scaled B [out, r])} into `slot`, replacing what it held."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot {slot} is not in 1..{self.slots}")
        rank = max(a.shape[0] for a, _ in weights.values())
        if rank > self.max_rank:
            raise ValueError(f"rank {rank} exceeds max_rank {self.max_rank}")
        self._grow(max(self._held[0], slot + 1), max(self._held[1], rank))
        self.clear(slot)
        with torch.no_grad():
            for module, (a, b) in weights.items():
                if module not in self._a:
                    self._allocate(module)
                r = a.shape[0]
                self._a[module][slot, :r].copy_(a)
                self._b[module][slot, :, :r].copy_(b)
        self._rank[slot] = rank

    def clear(self, slot: int) -> None:
        with torch.no_grad():
            for module in self._a:
                self._a[module][slot].zero_()
                self._b[module][slot].zero_()
        self._rank[slot] = 0

    def remove(self) -> None:
        """Detach every hook: the model is the base model again."""
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._a, self._b = [], {}, {}

    @contextlib.contextmanager
    def rows(self, slots: list[int]):
        """Forwards on this thread inside the block apply adapter slots[b] to batch row b (0 = none)."""
        previous = getattr(self._local, "state", None)
        if any(slots):
            uniform = slots[0] if all(s == slots[0] for s in slots) else None
            index = None if uniform is not None else torch.tensor(slots, dtype=torch.long, device=self._device)
            self._local.state = (uniform, index)
        else:
            self._local.state = None
        try:
            yield
        finally:
            self._local.state = previous

    def _allocate(self, module: str) -> None:
        layer = self._linears.get(module)
        if layer is None:
            raise KeyError(f"{module} is not a linear layer of the model")
        n, r = self._held
        self._a[module] = torch.zeros(n, r, layer.in_features, dtype=self._dtype, device=self._device)
        self._b[module] = torch.zeros(n, layer.out_features, r, dtype=self._dtype, device=self._device)
        self._hooks.append(layer.register_forward_hook(self._hook(module)))

    def _grow(self, n: int, r: int) -> None:
        """Reallocate every stack to n slots (0 included) and rank r, keeping what they hold."""
        if (n, r) == self._held:
            return
        old_n, old_r = self._held
        with torch.no_grad():
            for module in self._a:
                a, b = self._a[module], self._b[module]
                self._a[module] = a.new_zeros(n, r, a.shape[2])
                self._a[module][:old_n, :old_r] = a
                self._b[module] = b.new_zeros(n, b.shape[1], r)
                self._b[module][:old_n, :, :old_r] = b
        self._held = (n, r)

    def _hook(self, module: str):
        def add_delta(_layer, args, out):
            state = getattr(self._local, "state", None)
            if state is None:
                return None
            uniform, index = state
            x = args[0]
            if uniform is not None:
                r = self._rank[uniform]
                if r == 0:
                    return None
                return out + (x @ self._a[module][uniform, :r].T) @ self._b[module][uniform, :, :r].T
            if x.dim() < 2 or x.shape[0] != index.shape[0]:
                raise RuntimeError(f"{module}: rows were set for {index.shape[0]} rows, input is {tuple(x.shape)}")
            a, b = self._a[module].index_select(0, index), self._b[module].index_select(0, index)
            tokens = x.reshape(x.shape[0], -1, x.shape[-1])   # [rows, tokens, in]: a decode step's [rows, in] too
            return out + torch.bmm(torch.bmm(tokens, a.transpose(1, 2)), b.transpose(1, 2)).view(out.shape)
        return add_delta
