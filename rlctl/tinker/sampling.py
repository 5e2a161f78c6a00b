"""Sampling for Tinker's SamplingClient with rlctl's hf rollout engine, and prompt log-probs.

A sampler is a base model plus, for trained weights, an adapter of its own: a snapshot copied
from a training client (save_weights_and_get_sampling_client) or loaded from a saved path, so
training on can never change what an existing sampling client samples from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from rlctl.tinker.base import BaseModel
from rlctl.tinker.wire import TinkerError

DEFAULT_MAX_TOKENS = 16        # when SamplingParams.max_tokens is None (OpenAI completions' default)
NEVER = -1                     # a stop id no token has: `stop=[]` turns EOS stopping off


@dataclass
class Sampler:
    sampler_id: str
    base: BaseModel
    adapter: str | None            # None: the plain base model
    model_path: str | None = None


@dataclass(frozen=True)
class SampleParams:
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop_ids: tuple[int, ...]
    stop_strs: tuple[str, ...]


def parse_params(raw: dict, base: BaseModel, prompt_len: int) -> SampleParams:
    stop = raw.get("stop")
    stop_ids, stop_strs = tuple(base.eos_token_ids), ()
    if isinstance(stop, str):
        stop_strs = (stop,)
    elif isinstance(stop, list) and stop:
        if all(isinstance(s, int) for s in stop):
            stop_ids = tuple(stop)
        elif all(isinstance(s, str) for s in stop):
            stop_strs = tuple(stop)
        else:
            raise TinkerError("sampling_params.stop is a list of strings or a list of token ids, not a mix")
    elif stop == []:
        stop_ids = (NEVER,)
    max_tokens = raw.get("max_tokens") or DEFAULT_MAX_TOKENS
    room = base.max_context - prompt_len
    if max_tokens < 1 or max_tokens > room:
        raise TinkerError(f"max_tokens {max_tokens} does not fit: the prompt has {prompt_len} tokens and "
                          f"{base.name} takes {base.max_context} in all")
    temperature, top_p, top_k = float(raw.get("temperature", 1.0)), float(raw.get("top_p", 1.0)), int(raw.get("top_k", -1))
    if temperature < 0 or not 0 < top_p <= 1 or top_k == 0 or top_k < -1:
        raise TinkerError("sampling_params: temperature >= 0, 0 < top_p <= 1, top_k -1 (off) or >= 1")
    return SampleParams(int(max_tokens), temperature, top_p, 0 if top_k == -1 else top_k, raw.get("seed"),
                        stop_ids, stop_strs)


def sample(sampler: Sampler, prompt: list[int], n: int, params: SampleParams) -> list[dict]:
    """n sequences: {"tokens", "logprobs" (log softmax(logits / T) of each sampled token), "stop"}."""
    from rlctl.workers.rollout.hf import HFRolloutEngine

    base = sampler.base
    seed = params.seed if params.seed is not None else random.getrandbits(63)
    generator = torch.Generator().manual_seed(int(seed))
    with base.active(sampler.adapter) as model:
        engine = HFRolloutEngine(model, pad_token_id=base.pad_token_id, eos_token_ids=list(params.stop_ids))
        out = engine.generate([prompt], n=n, max_new_tokens=params.max_tokens, temperature=params.temperature or 1.0,
                              greedy=params.temperature == 0, top_p=params.top_p, top_k=params.top_k,
                              generator=generator, log_probs=True)
    sequences = []
    for row in range(n):
        length = int(out["response_length"][row])
        tokens = out["responses"][row, :length].tolist()
        logprobs = out["rollout_log_prob"][row, :length].tolist()
        stopped = not bool(out["truncated"][row])
        cut = _stop_string_cut(base, tokens, params.stop_strs)
        if cut is not None:
            tokens, logprobs, stopped = tokens[:cut], logprobs[:cut], True
        sequences.append({"tokens": tokens, "logprobs": logprobs, "stop": stopped})
    return sequences


def _stop_string_cut(base: BaseModel, tokens: list[int], stops: tuple[str, ...]) -> int | None:
    """The shortest prefix whose text contains a stop string (it keeps the tokens that spell it)."""
    if not stops:
        return None
    for k in range(1, len(tokens) + 1):
        text = base.tokenizer.decode(tokens[:k])
        if any(s in text for s in stops):
            return k
    return None


def prompt_logprobs(sampler: Sampler, prompt: list[int]) -> np.ndarray:
    """log p(prompt[i] | prompt[:i]) for i >= 1; NaN at position 0, which has no context."""
    if len(prompt) < 2:
        return np.full(len(prompt), np.nan, dtype=np.float32)
    ids = torch.tensor(prompt, dtype=torch.long)
    with sampler.base.active(sampler.adapter) as model, torch.no_grad():
        lp = sampler.base.target_log_probs(model, [ids[:-1]], [ids[1:]])[0]
    return np.concatenate([[np.nan], lp.numpy()]).astype(np.float32)
