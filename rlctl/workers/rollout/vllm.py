"""The `vllm` rollout engine: vLLM's offline `LLM` in the actor's process, on the actor's GPU.

Written against vLLM 0.31-0.32:
  - `distributed_executor_backend="external_launcher"`: the engine joins the rank's existing
    torch.distributed world (RANK / WORLD_SIZE / MASTER_* are set by WorkerHost) instead of
    spawning processes. vLLM lays that world out as [external data-parallel x tensor-parallel]:
    with `tensor_parallel_size` t, ranks 0..t-1 form one engine, t..2t-1 the next, and so on
    (t = 1: every rank is its own engine). The ranks of one engine must submit the same requests,
    so they pool their prompts first (`share_requests`) and each keeps its own rows. Custom
    all-reduce is off for t > 1: Ray shows each rank only its own GPU, so CUDA IPC between ranks
    is impossible and vLLM's NCCL all-reduce is used. This backend keeps the model in this
    process (`llm_engine.model_executor`), which is what lets `update_weights` write into it
    without disk; every rank loads the full tensors and vLLM's loaders keep their shard.
  - `enable_sleep_mode=True`: `sleep(level=2)` drops the KV cache and the weight copy (the next
    update overwrites the weights anyway); `wake_up()` re-allocates both.
  - Weights: HF names straight into the model's `load_weights` (it fuses q/k/v and gate/up itself),
    then `process_weights_after_loading` once and a prefix-cache reset (cached KV of the old
    weights must not be reused). A tied `lm_head.weight` is never sent (vLLM rejects it alone).
  - Sampling: `top_k = 0` is off (as in rlctl); per-request seeds from the caller's generator;
    `logprobs=0` returns the sampled token's log-prob, which the trainer compares with its own.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from rlctl.errors import UsageError
from rlctl.workers.rollout.base import RolloutEngine, check_sampling_args
from rlctl.workers.rollout.gpu import (GPUEngineSpec, check_tensor_parallel, pack_responses, request_seeds, require,
                                       share_requests)

SLEEP_LEVEL = 2  # drop weights and KV cache: the trainer's weights are pushed after every wake


def vllm_engine_args(spec: GPUEngineSpec) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for one rank's engine."""
    return {"model": spec.model_path, "tokenizer": spec.model_path, "dtype": spec.dtype,
            "tensor_parallel_size": spec.tensor_parallel_size, "gpu_memory_utilization": spec.gpu_memory_utilization,
            "max_model_len": spec.max_model_len, "seed": spec.seed, "trust_remote_code": spec.trust_remote_code,
            "enable_sleep_mode": True, "distributed_executor_backend": "external_launcher",
            "skip_tokenizer_init": True, "disable_log_stats": True,
            # log-probs after temperature, like the trainer's (the default is the raw logits')
            "logprobs_mode": "processed_logprobs",
            "disable_custom_all_reduce": spec.tensor_parallel_size > 1}


def launcher_env() -> dict[str, str]:
    """The torchrun variables external_launcher reads. In a worker group WorkerHost has set RANK /
    MASTER_* for the group's world (vLLM then splits it into tensor-parallel groups); a lone
    process gets a world of one. LOCAL_RANK is the CUDA device vLLM puts its worker on: the one
    this process uses (Ray shows each rank only its own GPU, as device 0)."""
    import torch

    env = {"LOCAL_RANK": str(torch.cuda.current_device())}
    if "RANK" not in os.environ and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        from rlctl.utils.net import free_port

        env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return env


def vllm_sampling_args(*, n: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                       greedy: bool, seed: int, eos_token_ids: list[int]) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one prompt's n samples. Greedy decoding asks
    for one sample (vLLM rejects n > 1 with temperature 0); the engine repeats it n times."""
    if not greedy and temperature > 2.0:
        raise UsageError(f"vLLM samples with temperature <= 2, got {temperature}", hint="lower rollout.temperature")
    greedy = greedy or temperature == 0
    return {"n": 1 if greedy else n, "max_tokens": max_new_tokens, "temperature": 0.0 if greedy else float(temperature),
            "top_p": 1.0 if greedy else float(top_p), "top_k": 0 if greedy else int(top_k), "seed": int(seed),
            "stop_token_ids": list(eos_token_ids), "logprobs": 0, "detokenize": False}


def request_completions(outputs, n: int) -> list:
    """The n completions of each vLLM RequestOutput, prompt-major. A greedy request holds its one
    sample (see vllm_sampling_args), which stands for all n."""
    return [c for request in outputs for c in request.outputs for _ in range(n // len(request.outputs))]


def sampled_log_probs(completion) -> list[float]:
    """The log-prob of each sampled token of a vLLM CompletionOutput (logprobs=0)."""
    if completion.logprobs is None:
        return [0.0] * len(completion.token_ids)
    return [float(step[token].logprob) for step, token in zip(completion.logprobs, completion.token_ids)]


class VLLMRolloutEngine(RolloutEngine):
    owns_weights = True

    def __init__(self, spec: GPUEngineSpec, *, pad_token_id: int, eos_token_ids: list[int]):
        require("vllm")
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        check_tensor_parallel(spec, "vllm", world)
        from vllm import LLM

        self.spec, self.pad_token_id, self.eos_token_ids = spec, int(pad_token_id), [int(e) for e in eos_token_ids]
        os.environ.update(launcher_env())
        self.llm = LLM(**vllm_engine_args(spec))
        self.asleep = False

    def _model(self):
        """The engine's model itself (get_model unwraps CUDA-graph wrappers)."""
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()

    def generate(self, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, generator=None, greedy: bool = False) -> dict[str, np.ndarray]:
        from vllm import SamplingParams

        check_sampling_args(prompt_ids, n, max_new_tokens, temperature, top_p, top_k)
        self.wake()
        seeds = request_seeds(generator, len(prompt_ids))
        mine = slice(0, len(prompt_ids))
        if self.spec.tensor_parallel_size > 1:   # the engine's ranks submit the same requests
            from vllm.distributed.parallel_state import get_tp_group

            prompt_ids, seeds, mine = share_requests(prompt_ids, seeds, get_tp_group().cpu_group)
        params = [SamplingParams(**vllm_sampling_args(n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                                      top_p=top_p, top_k=top_k, greedy=greedy, seed=s,
                                                      eos_token_ids=self.eos_token_ids)) for s in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], params, use_tqdm=False)
        completions = request_completions(outputs[mine], n)
        return pack_responses([c.token_ids for c in completions], max_new_tokens=max_new_tokens,
                              pad_token_id=self.pad_token_id, eos_token_ids=self.eos_token_ids,
                              log_probs=[sampled_log_probs(c) for c in completions])

    def update_weights(self, weights: "Mapping | Iterable | None" = None) -> None:
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        if weights is None:
            return
        self.wake()
        items = weights.items() if isinstance(weights, Mapping) else weights
        model = self._model()
        model.load_weights(weights=((name, tensor) for name, tensor in items if name != "lm_head.weight"
                                    or not self._tied()))
        config = self.llm.llm_engine.vllm_config.model_config
        process_weights_after_loading(model, config, next(model.parameters()).device)
        self.llm.reset_prefix_cache()

    def _tied(self) -> bool:
        return bool(getattr(self.llm.llm_engine.vllm_config.model_config.hf_config, "tie_word_embeddings", False))

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        self.llm = None
