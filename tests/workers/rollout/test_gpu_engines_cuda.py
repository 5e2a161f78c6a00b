"""GPU-only: the actor with a real vLLM / SGLang engine, and the CUDA training path (bf16, NCCL).

Marked `gpu` and skipped unless a CUDA GPU (and, per engine, the package) is present; the CPU CI
never runs them. Run on a GPU machine with: pytest -m gpu tests/workers/rollout/test_gpu_engines_cuda.py
"""

from __future__ import annotations

import importlib.util
import os
import socket

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

CUDA = torch.cuda.is_available()
T = 16


def _engine(name: str):
    ready = CUDA and importlib.util.find_spec(name) is not None
    return pytest.param(name, marks=pytest.mark.skipif(not ready, reason=f"needs {name} and a CUDA GPU"))


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    """The tiny Qwen2 with head_dim 64 (GPU attention kernels reject the default tiny's 16)."""
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("gpu_tiny")
    build_tiny_model(out, layers=2, hidden=128, heads=2, kv_heads=1, seed=0)
    return out


@pytest.fixture
def single_rank_world(monkeypatch):
    """The torchrun-style variables WorkerHost sets (vLLM's external_launcher reads them)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)


def _config(model_dir, engine: str):
    from rlctl.config.schema import (ActorConfig, Config, DataConfig, ModelConfig, ResourcesConfig,
                                     RolloutConfig, RunConfig)

    return Config(run=RunConfig(seed=1), model=ModelConfig(path=str(model_dir), dtype="bfloat16"),
                  data=DataConfig(batch_size=4, max_prompt_length=16, max_response_length=T),
                  actor=ActorConfig(lr=1e-2, micro_batch_size=8, grad_clip=0.0),
                  rollout=RolloutConfig(engine=engine, n=2, gpu_memory_utilization=0.3),
                  resources=ResourcesConfig(gpus_per_node=1))


def _prompts():
    from rlctl.runtime import Batch

    ids = np.array([[259] * 10 + [72, 105, 33, 10, 20, 30], list(range(40, 56)),
                    [259] * 4 + list(range(60, 72)), [259] * 12 + [1, 2, 3, 4]])
    return Batch({"input_ids": ids, "attention_mask": (ids != 259).astype(np.int64)})


@pytest.mark.parametrize("engine", [_engine("vllm"), _engine("sglang")])
def test_engine_uses_the_trained_weights(gpu_model_dir, single_rank_world, engine):
    """Log-prob probe: the engine's log-probs of its own samples match the trainer's before an
    update; after a large update the old samples' engine log-probs no longer do (the weights
    moved), and the new samples' do again (the engine got the new weights)."""
    from rlctl.controller.drift import rollout_drift
    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(_config(gpu_model_dir, engine), total_steps=4)
    before = worker.generate(_prompts(), seed=3)
    assert before["responses"].shape == (8, T) and "rollout_log_prob" in before
    before = before.union(worker.compute_log_prob(before))
    assert rollout_drift(before)["rollout/logprob_diff_mean"] < 0.05       # bf16 engine vs bf16 trainer

    adv = np.where(before["response_mask"] > 0, np.linspace(-3, 3, 8)[:, None], 0).astype(np.float32)
    worker.update_actor(Batch({**before.tensors, "advantages": adv}))
    moved = before.union(worker.compute_log_prob(before))      # old samples, new trainer weights
    after = worker.generate(_prompts(), seed=4)
    after = after.union(worker.compute_log_prob(after))
    stale, fresh = rollout_drift(moved)["rollout/logprob_diff_mean"], rollout_drift(after)["rollout/logprob_diff_mean"]
    assert fresh < 0.05 and stale > 5 * fresh, (stale, fresh)
    greedy = worker.generate(_prompts(), seed=5, mode="greedy")            # slept, woken, re-synced
    assert greedy["responses"].shape == (4, T) and np.isfinite(greedy["rollout_log_prob"]).all()
    worker.rollout_engine().close()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_actor_trains_in_bf16_and_generates_with_hf(gpu_model_dir):
    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(_config(gpu_model_dir, "hf"), total_steps=4)
    assert worker.actor.device.type == "cuda" and worker.actor.compute_dtype == torch.bfloat16
    out = worker.generate(_prompts(), seed=3)
    out = out.union(worker.compute_log_prob(out))
    adv = np.where(out["response_mask"] > 0, 1.0, 0).astype(np.float32)
    metrics = worker.update_actor(Batch({**out.tensors, "advantages": adv}))
    assert np.isfinite(metrics["actor/grad_norm"]) and metrics["actor/skipped_steps"] == 0


def _nccl_rank(rank, model_dir, port, out_dir):
    import torch.distributed as dist

    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=2)
    worker = ActorRolloutRefWorker(_config(model_dir, "hf"), total_steps=4)
    prompts = _prompts()
    out = worker.generate(Batch({k: v[rank * 2:(rank + 1) * 2] for k, v in prompts.tensors.items()}), seed=3)
    out = out.union(worker.compute_log_prob(out))
    adv = np.where(out["response_mask"] > 0, 1.0, 0).astype(np.float32)
    metrics = worker.update_actor(Batch({**out.tensors, "advantages": adv}))
    np.save(os.path.join(out_dir, f"grad_norm{rank}.npy"), np.array(metrics["actor/grad_norm"]))
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpu_fsdp2_over_nccl(gpu_model_dir, tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_nccl_rank, args=(str(gpu_model_dir), port, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    norms = [float(np.load(tmp_path / f"grad_norm{r}.npy")) for r in range(2)]
    assert np.isfinite(norms).all() and norms[0] == pytest.approx(norms[1])   # one global norm


def _vllm_tp_rank(rank, model_dir, port, out_dir):
    import dataclasses

    import torch.distributed as dist

    from rlctl.controller.drift import rollout_drift
    from rlctl.runtime import Batch
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=2)
    config = _config(model_dir, "vllm")
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, tensor_parallel_size=2),
                                 resources=dataclasses.replace(config.resources, gpus_per_node=2))
    worker = ActorRolloutRefWorker(config, total_steps=4)
    prompts = _prompts()
    shard = Batch({k: v[rank * 2:(rank + 1) * 2] for k, v in prompts.tensors.items()})
    out = worker.generate(shard, seed=3)
    out = out.union(worker.compute_log_prob(out))
    np.savez(os.path.join(out_dir, f"tp{rank}.npz"), responses=out["responses"],
             drift=rollout_drift(out)["rollout/logprob_diff_mean"])
    worker.rollout_engine().close()
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2 or importlib.util.find_spec("vllm") is None,
                    reason="needs vllm and 2 CUDA GPUs")
def test_vllm_tensor_parallel_engine_over_two_ranks(gpu_model_dir, tmp_path):
    """rollout.tensor_parallel_size = 2: one vLLM engine sharded over both ranks; each rank gets
    the responses of its own prompts: the trainer scores them after the rank's prompts, so
    responses sampled for another rank's prompts would show as a large drift."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_vllm_tp_rank, args=(str(gpu_model_dir), port, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    got = [np.load(tmp_path / f"tp{rank}.npz") for rank in range(2)]
    for rank in range(2):
        assert got[rank]["responses"].shape == (4, T)                    # 2 prompts x n = 2: its own rows
        assert float(got[rank]["drift"]) < 0.05
    assert not np.array_equal(got[0]["responses"], got[1]["responses"])
