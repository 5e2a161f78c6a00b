"""The actor's side of a GPU engine: after every update the engine generates with exactly the trained
weights (LoRA merged), it sleeps between generations and is woken and re-synced before the next,
and the controller's drift metric sees a stale engine.

`CopyEngine` stands in for vLLM and SGLang here (the real vLLM engine on CPU: test_vllm_cpu.py): like them it keeps its
own copy of the model (loaded from model.path), takes weights only through `update_weights`
(HF names, every one of them), loses them when it sleeps (vLLM sleep level 2: here they become
NaN, so a missed re-sync cannot go unnoticed) and reports its log-prob of every sampled token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rollout_models import PAD

from rlctl.config.schema import (ActorConfig, Config, DataConfig, LoraConfig, ModelConfig, RolloutConfig,
                                 RunConfig)
from rlctl.runtime import Batch
from rlctl.workers.rollout.base import RolloutEngine
from rlctl.workers.rollout.gpu import ROLLOUT_LOG_PROB

T = 6


class CopyEngine(RolloutEngine):
    owns_weights = True

    def __init__(self, model_dir, eos_token_ids):
        from safetensors import safe_open
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            self.names = set(f.keys())
        self.eos, self.events = eos_token_ids, []

    def update_weights(self, weights=None):
        state = dict(weights)
        assert set(state) == self.names, "an engine needs every checkpoint tensor, by its HF name"
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}   # tied: the embedding
        self.events.append("update")

    def generate(self, prompt_ids, *, n, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, generator=None,
                 greedy=False):
        from rlctl.workers.compute.logprob import response_log_probs
        from rlctl.workers.rollout.hf import HFRolloutEngine

        self.events.append("generate")
        out = HFRolloutEngine(self.model, pad_token_id=PAD, eos_token_ids=self.eos).generate(
            prompt_ids, n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            generator=generator, greedy=greedy)
        width = max(len(p) for p in prompt_ids)
        prompts = torch.tensor([[PAD] * (width - len(p)) + p for p in prompt_ids]).repeat_interleave(n, 0)
        valid = (torch.arange(width) >= width - torch.tensor([len(p) for p in prompt_ids])[:, None])
        ids = torch.cat([prompts, torch.from_numpy(out["responses"])], 1)
        mask = torch.cat([valid.repeat_interleave(n, 0).long(), torch.from_numpy(out["response_mask"])], 1)
        with torch.no_grad():
            lp = response_log_probs(self.model, ids, mask, max_new_tokens, temperature=temperature or 1.0)["log_prob"]
        out[ROLLOUT_LOG_PROB] = (lp * torch.from_numpy(out["response_mask"])).numpy()
        return out

    def sleep(self):
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float("nan"))
        self.events.append("sleep")

    def wake(self):
        self.events.append("wake")


def config(model_dir, lora: bool) -> Config:
    return Config(run=RunConfig(seed=1), model=ModelConfig(path=str(model_dir), lora=LoraConfig(rank=4 if lora else 0)),
                  data=DataConfig(batch_size=2, max_prompt_length=8, max_response_length=T),
                  actor=ActorConfig(lr=5e-2, micro_batch_size=4, grad_clip=0.0),
                  rollout=RolloutConfig(engine="vllm", n=2, temperature=1.0))


def prompts() -> Batch:
    ids = np.array([[PAD, PAD, 72, 105, 33], [10, 20, 30, 40, 50]])
    return Batch({"input_ids": ids, "attention_mask": (ids != PAD).astype(np.int64)})


@pytest.mark.parametrize("model,lora", [("tied", False), ("untied", True)], ids=["full-tied", "lora-untied"])
def test_engine_generates_with_the_trained_weights(tiny_model_dir, tiny_untied_model_dir, model, lora):
    from rlctl.controller.drift import rollout_drift
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    model_dir = tiny_model_dir if model == "tied" else tiny_untied_model_dir
    worker = ActorRolloutRefWorker(config(model_dir, lora), total_steps=4)
    engine = worker._rollout = CopyEngine(model_dir, worker.eos_ids)

    first = worker.generate(prompts(), seed=7)          # the engine starts with model.path's weights
    assert engine.events == ["generate", "sleep"]
    assert ROLLOUT_LOG_PROB in first and first[ROLLOUT_LOG_PROB].shape == (4, T)
    first = first.union(worker.compute_log_prob(first))
    assert rollout_drift(first)["rollout/logprob_diff_max"] < 1e-4

    advantages = np.where(first["response_mask"] > 0, np.linspace(-1, 1, 4)[:, None], 0).astype(np.float32)
    worker.update_actor(Batch({**first.tensors, "advantages": advantages}))
    second = worker.generate(prompts(), seed=8)          # woken, re-synced with the trained weights
    assert engine.events[2:] == ["wake", "update", "generate", "sleep"]
    second = second.union(worker.compute_log_prob(second))
    drift = rollout_drift(second)
    assert drift["rollout/logprob_diff_max"] < 1e-4 and drift["rollout/prob_diff_mean"] < 1e-5

    third = worker.generate(prompts(), seed=8, mode="greedy")   # slept in between: synced again
    assert engine.events[6:] == ["wake", "update", "generate", "sleep"]
    assert np.isfinite(third[ROLLOUT_LOG_PROB]).all()

    # A stale engine (model.path's weights, not the trained ones) shows in the drift metric.
    stale = CopyEngine(model_dir, worker.eos_ids).generate(
        [row[m != 0].tolist() for row, m in zip(prompts()["input_ids"], prompts()["attention_mask"])],
        n=2, max_new_tokens=T, generator=torch.Generator().manual_seed(0))
    batch = worker.generate(prompts(), seed=8)
    batch[ROLLOUT_LOG_PROB] = stale[ROLLOUT_LOG_PROB]
    batch = Batch({**batch.tensors, "responses": stale["responses"], "response_mask":
                   stale["response_mask"].astype(np.float32)})
    width = batch["prompts"].shape[1]
    batch["input_ids"] = np.concatenate([batch["prompts"], stale["responses"]], 1)
    batch["attention_mask"] = np.concatenate([batch["attention_mask"][:, :width], stale["response_mask"]], 1)
    batch = batch.union(worker.compute_log_prob(batch))
    assert rollout_drift(batch)["rollout/logprob_diff_mean"] > 1e-2


def test_without_an_old_log_prob_pass_the_update_measures_the_engine_s_drift(tiny_model_dir):
    # on-policy with one optimizer step no old_log_prob pass runs (recompute_old_log_prob): the
    # update's own forward, before its optimizer step, gives the drift a separate pass would
    from rlctl.controller.drift import rollout_drift, update_drift
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(config(tiny_model_dir, lora=False), total_steps=4)
    worker._rollout = CopyEngine(tiny_model_dir, worker.eos_ids)

    def update(batch: Batch) -> dict:
        advantages = np.where(batch["response_mask"] > 0, np.linspace(-1, 1, 4)[:, None], 0).astype(np.float32)
        metrics = worker.update_actor(Batch({**batch.tensors, "advantages": advantages}))
        return update_drift(metrics)

    batch = worker.generate(prompts(), seed=7)
    expected = rollout_drift(batch.union(worker.compute_log_prob(batch)))
    got = update(batch)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key
    # the engine that missed that update: its samples' log-probs are now the old weights'
    stale = worker.generate(prompts(), seed=8)   # re-synced, then the engine is overwritten below
    engine = CopyEngine(tiny_model_dir, worker.eos_ids)
    redo = engine.generate([row[m != 0].tolist() for row, m in zip(prompts()["input_ids"], prompts()["attention_mask"])],
                           n=2, max_new_tokens=T, generator=torch.Generator().manual_seed(0))
    width = stale["prompts"].shape[1]
    stale = Batch({**stale.tensors, "responses": redo["responses"], ROLLOUT_LOG_PROB: redo[ROLLOUT_LOG_PROB],
                   "response_mask": redo["response_mask"].astype(np.float32),
                   "input_ids": np.concatenate([stale["prompts"], redo["responses"]], 1),
                   "attention_mask": np.concatenate([stale["attention_mask"][:, :width], redo["response_mask"]], 1)})
    assert update(stale)["rollout/logprob_diff_mean"] > 1e-2


def test_drift_metric_by_hand():
    from rlctl.controller.drift import rollout_drift

    batch = Batch({"response_mask": np.array([[1, 1, 0], [1, 0, 0]], dtype=np.float32),
                   "old_log_prob": np.array([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=np.float32),
                   "rollout_log_prob": np.array([[-1.5, -2.0, -9.0], [-0.25, 0.0, 0.0]], dtype=np.float32)})
    got = rollout_drift(batch)
    assert got["rollout/logprob_diff_mean"] == pytest.approx((0.5 + 0 + 0.25) / 3)
    assert got["rollout/logprob_diff_max"] == pytest.approx(0.5)
    probs = abs(np.exp(-1) - np.exp(-1.5)) + 0 + abs(np.exp(-0.5) - np.exp(-0.25))
    assert got["rollout/prob_diff_mean"] == pytest.approx(probs / 3)


def test_old_log_probs_are_recomputed_only_for_more_than_one_optimizer_step(tiny_model_dir):
    import dataclasses

    from rlctl.controller.setup import recompute_old_log_prob

    base = config(tiny_model_dir, lora=False)
    hf = dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, engine="hf"))
    assert not recompute_old_log_prob(hf, on_policy=True)     # one optimizer step: the update's own log-probs
    assert not recompute_old_log_prob(base, on_policy=True)   # vllm too: the update measures the engine's drift
    assert recompute_old_log_prob(base, on_policy=False)      # an older policy's batch needs the current one's
    two_epochs = dataclasses.replace(base, actor=dataclasses.replace(base.actor, ppo_epochs=2))
    assert recompute_old_log_prob(two_epochs, on_policy=True)  # a second optimizer step needs the first's log-probs


def test_drift_beyond_rollout_max_logprob_diff_stops_the_run_naming_the_step(tiny_model_dir):
    import dataclasses

    from rlctl.controller.drift import check_drift, logprob_diff_limit
    from rlctl.errors import NumericalError

    base = config(tiny_model_dir, lora=False)
    base = dataclasses.replace(base, resources=dataclasses.replace(base.resources, gpus_per_node=0))  # resolved
    with_dtype = lambda dtype, **rollout: dataclasses.replace(   # noqa: E731
        base, model=dataclasses.replace(base.model, dtype=dtype), rollout=dataclasses.replace(base.rollout, **rollout))
    assert logprob_diff_limit(with_dtype("float32")) == (1e-3, "float32")
    assert logprob_diff_limit(with_dtype("bfloat16")) == (0.05, "bfloat16")
    assert logprob_diff_limit(with_dtype("auto")) == (1e-3, "float32")            # auto on CPU
    assert logprob_diff_limit(with_dtype("bfloat16", max_logprob_diff=0.2)) == (0.2, "bfloat16")
    assert logprob_diff_limit(with_dtype("float32", top_p=0.9))[0] == float("inf")  # engine's are filtered

    bf16 = with_dtype("bfloat16")
    check_drift(bf16, 1, {"rollout/logprob_diff_mean": 0.004})   # bf16 noise: goes on
    with pytest.raises(NumericalError) as err:
        check_drift(bf16, 2, {"rollout/logprob_diff_mean": 0.8, "rollout/logprob_diff_max": 3.0})
    assert err.value.exit_code == 5 and "\n" not in err.value.message
    assert err.value.message.startswith("step 2: the vllm engine's log-probs of its samples differ from the "
                                        "trainer's by 0.8 nats per token on average (max 3)")
    assert "rollout.max_logprob_diff = 0.05 (bfloat16)" in err.value.message
    # a separate rollout group (one_step_off, async): its engine against its rank's copy, same push
    engine = "rollout/engine_diff_mean"
    check_drift(bf16, 3, {engine: 0.004, "rollout/logprob_diff_mean": 0.8}, engine)   # stale, engine follows
    with pytest.raises(NumericalError) as err:
        check_drift(bf16, 4, {engine: 0.3, "rollout/engine_diff_max": 2.0}, engine)
    assert err.value.message.startswith("step 4: the vllm engine's log-probs of its samples differ from the "
                                        "rollout rank's copy's by 0.3 nats per token on average (max 2)")


def test_validation_line_names_each_source():
    from rlctl.controller.trainer import validation_line

    val = {"val/reward/mean": 0.5, "val/acc": 0.25, "val/response_length/mean": 12.0,
           "val/openai/gsm8k/reward/mean": 0.5, "val/openai/gsm8k/acc": 0.5,
           "val/rlctl/arith/reward/mean": 0.5, "val/rlctl/arith/acc": 0.0}
    assert validation_line(3, val) == ("validation at step 3: reward 0.500  acc 0.250  len 12.0  "
                                       "(openai/gsm8k acc 0.500, rlctl/arith acc 0.000)")
    one = {k: v for k, v in val.items() if "arith" not in k}
    assert validation_line(3, one) == "validation at step 3: reward 0.500  acc 0.250  len 12.0"


def test_engine_copy_drift_covers_every_rank_of_a_generation_and_every_round():
    """The separate rollout group's check: per-row columns survive the concatenation of several
    ranks' rows (meta would keep rank 0's only), partial rounds report in meta, hf reports nothing."""
    from rlctl.controller.rollout import engine_copy_drift
    from rlctl.runtime import Batch
    from rlctl.workers.roles.rollout_worker import engine_copy_drift_rows as rows_drift

    copy = np.zeros((2, 3))
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    good = rows_drift(np.full((2, 3), 1e-6), copy, mask)
    bad = rows_drift(np.array([[0.0, 0.5, 9.0], [0.1, 9.0, 9.0]]), copy, mask)   # padding never counts
    assert rows_drift(None, copy, mask) == {}
    ranks = Batch.concat([Batch({**good, "response_length": np.array([2, 1])}, {"rank": 0}),
                          Batch({**bad, "response_length": np.array([2, 1])}, {"rank": 1})])
    got = engine_copy_drift([ranks])
    assert got["rollout/engine_diff_max"] == 0.5
    assert got["rollout/engine_diff_mean"] == pytest.approx((3e-6 + 0.6) / 6)
    round_ = Batch(meta={"engine_diff_sum": 0.2, "engine_diff_max": 0.2, "engine_diff_tokens": 4})
    assert engine_copy_drift([round_, Batch()]) == {"rollout/engine_diff_mean": 0.05, "rollout/engine_diff_max": 0.2}
    assert engine_copy_drift([Batch({"response_length": np.array([3])})]) == {}
