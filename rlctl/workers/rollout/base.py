"""The rollout engine interface: what the actor worker calls to generate responses.

Small on purpose (verl `workers/rollout/base.py`): `generate`, `update_weights`, `sleep`/`wake`,
`close`. Engines load lazily (`registry.make_rollout_engine`), so importing this module costs nothing
beyond numpy. Results are numpy arrays, because they travel through the Ray object store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from rlctl.errors import UsageError

if TYPE_CHECKING:  # torch is only needed by the engines themselves
    import torch

# Keys of the dict that `generate` returns; rows are prompt-major: prompt 0 samples 0..n-1,
# then prompt 1 samples 0..n-1, ... (row r belongs to prompt r // n).
RESPONSES = "responses"              # [B*n, T] int64, right-padded with pad_token_id, T == max_new_tokens
RESPONSE_MASK = "response_mask"      # [B*n, T] int64, 1 for generated tokens (EOS included), 0 after
RESPONSE_LENGTH = "response_length"  # [B*n] int64, number of 1s in the row's response_mask
TRUNCATED = "truncated"              # [B*n] bool, True when max_new_tokens ran out before an EOS


class RolloutEngine(ABC):
    """Generates n sampled responses per prompt with the policy's current weights."""

    # False: the engine runs the trainer's own module (hf). True: it keeps its own copy of the
    # weights (vLLM, SGLang), which the actor pushes with update_weights after every update.
    owns_weights = False
    # True: `generate` takes `limits` (a token cap per prompt, <= max_new_tokens), which multi-turn
    # rollouts use for each conversation's remaining budget; others are cut to it afterwards.
    per_prompt_limits = False

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 generator: "torch.Generator | None" = None,
                 greedy: bool = False) -> dict[str, np.ndarray]:
        """Sample `n` responses for each prompt (token ids, no padding).

        Greedy (argmax) when `greedy` or `temperature == 0`; `top_k == 0` and `top_p == 1`
        switch those filters off. Generation stops at any of the engine's EOS ids (the EOS is
        part of the response and of its mask) or after `max_new_tokens`. Same prompts, params
        and `generator` state -> the same tokens (exact resume depends on it); the generator is
        advanced. Returns the arrays named by the module constants above, all with B*n rows.
        """

    @abstractmethod
    def update_weights(self, weights: "Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None" = None) -> None:
        """Make the engine generate with these weights (a state dict or named tensors).

        Engines that share the trainer's model object (hf) see every optimizer step already and
        ignore this; engines with their own copy (vLLM, SGLang) load the tensors.
        """

    def sleep(self) -> None:
        """Release the engine's memory (KV cache, weight copy) while the trainer runs."""

    def wake(self) -> None:
        """Re-acquire what `sleep` released, before the next `generate`."""

    def forget_cache(self) -> None:
        """Drop KV that the engine caches across calls by content (vLLM's prefix cache), so the next
        call computes as a freshly started engine would (an async checkpoint, a weight push)."""

    def close(self) -> None:
        """Free everything for good; the engine is unusable afterwards."""


def check_sampling_args(prompt_ids: Any, n: int, max_new_tokens: int, temperature: float,
                        top_p: float, top_k: int) -> None:
    """Reject bad generate() arguments with a message that says how to fix them."""
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        raise UsageError("generate() got no prompts: prompt_ids must be a non-empty list of token-id lists")
    if any(len(p) == 0 for p in prompt_ids):
        raise UsageError("generate() got an empty prompt: every prompt needs at least one token "
                         "(filter empty rows in the data)")
    if n < 1 or max_new_tokens < 1:
        raise UsageError(f"generate() needs n >= 1 and max_new_tokens >= 1, got n={n}, "
                         f"max_new_tokens={max_new_tokens} (set rollout.n / data.max_response_length)")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise UsageError(f"bad sampling parameters temperature={temperature}, top_p={top_p}, top_k={top_k}: "
                         "need temperature >= 0, 0 < top_p <= 1, top_k >= 0 (0 = off)")
