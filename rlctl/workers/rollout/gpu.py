"""What the vLLM and SGLang rollout engines share: their settings, seeds, and turning per-row
token lists into the arrays of the engine interface. Pure Python + numpy + torch: testable on CPU.

Both engines run in the actor's own process on its GPU, hold their own copy of the weights, and
are told the trained weights after every update (`rlctl.workers.rollout.weights.engine_weights`, no
disk). Between generations they sleep: KV cache and weight copy are released so the trainer has the
GPU, and the next `wake` + `update_weights` brings them back. SGLang runs one engine per rank
(tensor-parallel 1); vLLM can also shard one engine over `rollout.tensor_parallel_size`
consecutive ranks of a node, which then submit the same requests (`share_requests`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rlctl.errors import ConfigError, UsageError
from rlctl.workers.rollout.base import RESPONSE_LENGTH, RESPONSE_MASK, RESPONSES, TRUNCATED
from rlctl.workers.rollout.registry import rollout_engine_info, sharding_engines

ROLLOUT_LOG_PROB = "rollout_log_prob"  # [B*n, T] float32: the engine's log-prob of each sampled token


@dataclass(frozen=True)
class GPUEngineSpec:
    """The engine's settings, from [model], [data], [rollout] and [run]."""

    model_path: str
    dtype: str = "bfloat16"              # "bfloat16" | "float16" | "float32"
    gpu_memory_utilization: float = 0.5  # share of the GPU the engine may take while awake
    tensor_parallel_size: int = 1
    max_model_len: int = 2048            # data.max_prompt_length + data.max_response_length
    seed: int = 0
    trust_remote_code: bool = False
    enforce_eager: bool = False          # vLLM: no torch.compile / CUDA graphs (faster start, slower steps)
    vision: bool = False                 # a vision-language model (the engine loads its processor)
    lora_rank: int = 0                   # > 0: LoRA enabled, the trainer pushes adapters (model.lora.sync)

    @classmethod
    def from_config(cls, config, dtype: str, *, vision: bool = False, lora_rank: int = 0) -> "GPUEngineSpec":
        rc, dc = config.rollout, config.data
        return cls(model_path=config.model.path, dtype=dtype, gpu_memory_utilization=rc.gpu_memory_utilization,
                   tensor_parallel_size=rc.tensor_parallel_size,
                   max_model_len=dc.max_prompt_length + dc.max_response_length, seed=config.run.seed,
                   trust_remote_code=config.model.trust_remote_code, enforce_eager=rc.enforce_eager, vision=vision,
                   lora_rank=lora_rank)


def require(engine: str) -> None:
    """UsageError (exit 2) unless `engine`'s package is installed and, for a GPU-only engine, a CUDA
    GPU is visible. An engine with a CPU build (vLLM) names the extra that fits this machine."""
    info = rollout_engine_info(engine)
    import torch

    gpu = torch.cuda.is_available()
    if info.extra and importlib.util.find_spec(info.extra) is None:
        extra = info.extra if gpu or not info.cpu_extra else info.cpu_extra
        where = "" if info.cpu_extra else " on a GPU machine"
        raise UsageError(f"rollout.engine = {engine!r} but {info.extra} is not installed",
                         hint=f'pip install "rlctl[{extra}]"{where}, or use rollout.engine = "hf"')
    if info.gpu_only and not gpu:
        raise UsageError(f"rollout.engine = {engine!r} needs a CUDA GPU and none is visible",
                         hint='use rollout.engine = "hf" on CPU')


def check_tensor_parallel(spec: GPUEngineSpec, engine: str, world: int) -> None:
    """ConfigError unless the engine can shard over `spec.tensor_parallel_size` of `world` ranks."""
    tp, most = spec.tensor_parallel_size, rollout_engine_info(engine).max_tensor_parallel_size
    if tp == 1:
        return
    if most is not None and tp > most:
        raise ConfigError(f"rollout.tensor_parallel_size = {tp}: the {engine} training rollout runs one engine "
                          f"per GPU rank (tensor-parallel {most})",
                          hint=f"set rollout.tensor_parallel_size = {most}, or use rollout.engine = "
                               + " or ".join(f'"{n}"' for n in sharding_engines()))
    if world % tp:
        raise ConfigError(f"rollout.tensor_parallel_size = {tp} does not divide the {world} actor ranks",
                          hint="make resources.nodes x gpus_per_node a multiple of it")


def share_requests(prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int], group
                   ) -> tuple[list[list[int]], list[int], slice]:
    """Every rank of a tensor-parallel group runs the same engine steps, so each submits the
    requests of the whole group: the prompts and per-request seeds of its ranks in rank order
    (gathered over `group`, a CPU process group). Returns them and the slice that is this rank's."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, ([list(map(int, p)) for p in prompt_ids], [int(s) for s in seeds]), group=group)
    me = dist.get_rank(group)
    start = sum(len(prompts) for prompts, _ in parts[:me])
    return ([p for prompts, _ in parts for p in prompts], [s for _, ss in parts for s in ss],
            slice(start, start + len(prompt_ids)))


def request_seeds(generator, count: int) -> list[int]:
    """`count` per-request seeds drawn from the caller's torch.Generator (so a resumed run, which
    restores the generator, asks the engine for the same samples)."""
    import torch

    return torch.randint(0, 2**31 - 1, (count,), generator=generator).tolist()


def pack_responses(rows: Sequence[Sequence[int]], *, max_new_tokens: int, pad_token_id: int,
                   eos_token_ids: Sequence[int], log_probs: Sequence[Sequence[float]] | None = None
                   ) -> dict[str, np.ndarray]:
    """Per-row generated ids (prompt-major, B*n rows) -> the engine interface's arrays.

    A row ends at its first EOS (kept, as the hf engine does) or at max_new_tokens; anything an
    engine returns after that is dropped. `log_probs` (same shape as `rows`) become
    ROLLOUT_LOG_PROB, 0 on padding.
    """
    eos = set(int(e) for e in eos_token_ids)
    count = len(rows)
    responses = np.full((count, max_new_tokens), pad_token_id, dtype=np.int64)
    mask = np.zeros((count, max_new_tokens), dtype=np.int64)
    lengths = np.zeros(count, dtype=np.int64)
    truncated = np.zeros(count, dtype=bool)
    out_lp = np.zeros((count, max_new_tokens), dtype=np.float32) if log_probs is not None else None
    for r, ids in enumerate(rows):
        ids = [int(t) for t in ids[:max_new_tokens]]
        stop = next((i + 1 for i, t in enumerate(ids) if t in eos), None)
        ids = ids[:stop] if stop else ids
        k = len(ids)
        responses[r, :k], mask[r, :k], lengths[r] = ids, 1, k
        truncated[r] = stop is None and k == max_new_tokens
        if out_lp is not None:
            out_lp[r, :k] = np.asarray(log_probs[r][:k], dtype=np.float32)
    out = {RESPONSES: responses, RESPONSE_MASK: mask, RESPONSE_LENGTH: lengths,
           TRUNCATED: truncated}
    if out_lp is not None:
        out[ROLLOUT_LOG_PROB] = out_lp
    return out
