"""The `sglang` rollout engine: SGLang's offline `Engine` driven from the actor's process.

Written against SGLang 0.5.18-0.5.21:
  - `Engine(model_path=..., tp_size=1, mem_fraction_static=..., enable_memory_saver=True,
    skip_tokenizer_init=True)`: the scheduler runs in a child process on this rank's GPU.
  - Sampling: every sample is its own request (the prompt repeated n times, each with its own
    `sampling_seed`): with one seed per n-sample request SGLang's deterministic mode would return
    n identical samples. The radix cache still prefills each prompt once. `top_k = -1` is off
    in SGLang (0 is rejected), so rlctl's 0 is mapped to -1.
  - Weights: `update_weights_from_tensor` takes CUDA tensors with HF names (Qwen2's loader fuses
    q/k/v itself), in buckets, flushing the cache after the last; 0.5.21 wants the calls between
    `begin_weight_update()` and `end_weight_update()`. Failures come back as (False, message) and
    are raised here.
  - Memory: `release_memory_occupation()` frees KV cache and weights (needs the
    torch_memory_saver package, installed with the extra); the next update re-pushes the weights.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from rlctl.errors import UsageError
from rlctl.workers.rollout.base import RolloutEngine, check_sampling_args
from rlctl.workers.rollout.gpu import GPUEngineSpec, check_tensor_parallel, pack_responses, request_seeds, require

BUCKET_BYTES = 512 << 20  # tensors per update_weights_from_tensor call


def sglang_engine_args(spec: GPUEngineSpec, gpu_id: int = 0) -> dict[str, Any]:
    """Keyword arguments of `sglang.Engine` for one rank's engine on CUDA device `gpu_id`."""
    return {"base_gpu_id": gpu_id, "model_path": spec.model_path, "tokenizer_path": spec.model_path, "dtype": spec.dtype,
            "tp_size": spec.tensor_parallel_size, "mem_fraction_static": spec.gpu_memory_utilization,
            "context_length": spec.max_model_len, "random_seed": spec.seed,
            "trust_remote_code": spec.trust_remote_code, "enable_memory_saver": True,
            "skip_tokenizer_init": True, "log_level": "error"}


def sglang_sampling_params(*, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                           greedy: bool, seed: int, eos_token_ids: list[int]) -> dict[str, Any]:
    """One request's `sampling_params` dict (one sample)."""
    greedy = greedy or temperature == 0
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0 if greedy else float(temperature),
            "top_p": 1.0 if greedy else float(top_p), "top_k": -1 if greedy or top_k == 0 else int(top_k),
            "stop_token_ids": list(eos_token_ids), "sampling_seed": int(seed)}


def buckets(items: Iterable[tuple[str, Any]], limit: int = BUCKET_BYTES) -> Iterator[list[tuple[str, Any]]]:
    """Group (name, tensor) pairs into lists of at most `limit` bytes (a larger tensor goes alone)."""
    bucket, size = [], 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def output_log_probs(output: dict) -> list[float]:
    """Sampled-token log-probs of one SGLang output (return_logprob=True): (logprob, id, text) tuples."""
    entries = output.get("meta_info", {}).get("output_token_logprobs") or []
    return [float(entry[0]) for entry in entries] or [0.0] * len(output["output_ids"])


class SGLangRolloutEngine(RolloutEngine):
    owns_weights = True

    def __init__(self, spec: GPUEngineSpec, *, pad_token_id: int, eos_token_ids: list[int]):
        require("sglang")
        check_tensor_parallel(spec, "sglang", 1)
        import sglang
        import torch

        self.spec, self.pad_token_id, self.eos_token_ids = spec, int(pad_token_id), [int(e) for e in eos_token_ids]
        self.engine = sglang.Engine(**sglang_engine_args(spec, gpu_id=torch.cuda.current_device()))
        self.asleep = False

    def generate(self, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, generator=None, greedy: bool = False,
                 grammars: list[str | None] | None = None) -> dict[str, np.ndarray]:
        check_sampling_args(prompt_ids, n, max_new_tokens, temperature, top_p, top_k)
        if grammars and any(grammars):   # never decode a forced call or JSON answer unconstrained
            raise UsageError("rollout.engine = \"sglang\" cannot decode under a grammar (a forced tool_choice or a "
                             "JSON response_format reached it)", hint='use rollout.engine = "vllm" or "hf"')
        self.wake()
        seeds = request_seeds(generator, len(prompt_ids) * n)
        rows = [list(p) for p in prompt_ids for _ in range(n)]               # prompt-major
        params = [sglang_sampling_params(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                         top_k=top_k, greedy=greedy, seed=s, eos_token_ids=self.eos_token_ids)
                  for s in seeds]
        outputs = self.engine.generate(input_ids=rows, sampling_params=params, return_logprob=True)
        return pack_responses([o["output_ids"] for o in outputs], max_new_tokens=max_new_tokens,
                              pad_token_id=self.pad_token_id, eos_token_ids=self.eos_token_ids,
                              log_probs=[output_log_probs(o) for o in outputs])

    def update_weights(self, weights: "Mapping | Iterable | None" = None) -> None:
        import torch

        if weights is None:
            return
        self.wake()
        items = weights.items() if isinstance(weights, Mapping) else weights
        on_gpu = ((name, t.to("cuda", non_blocking=True).contiguous()) for name, t in items)
        begin, end = getattr(self.engine, "begin_weight_update", None), getattr(self.engine, "end_weight_update", None)
        if begin is not None:
            begin()
        try:
            pending = None
            for bucket in buckets(on_gpu):
                if pending is not None:
                    self._push(pending, flush=False)
                pending = bucket
            if pending is not None:
                self._push(pending, flush=True)
        finally:
            if end is not None:
                end()
        torch.cuda.synchronize()

    def _push(self, bucket: list, *, flush: bool) -> None:
        result = self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=flush)
        ok, message = result if isinstance(result, tuple) else (True, "")
        if not ok:
            raise RuntimeError(f"SGLang rejected a weight update ({bucket[0][0]} ...): {message}")

    def sleep(self) -> None:
        if not self.asleep:
            self.engine.release_memory_occupation()
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.engine.resume_memory_occupation()
            self.asleep = False

    def close(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown()
            self.engine = None
