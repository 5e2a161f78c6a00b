"""Real GRPO runs of the grpo-arith-moe-ep2-cpu recipe (a tiny Qwen3-MoE, 4 experts, top-2, on 2 Ray
workers), shortened, with the experts split over both (actor.expert_parallel_size = 2, the recipe's)
and without: the same step metrics (the MoE load-balancing loss included) and, after 2 steps,
the same weights within a stated tolerance; `rlctl merge` of the split run writes every expert
and verifies its logits (merge's own check), and `rlctl serve` answers the official client from the
merged folder. PPO with a critic (built from the MoE model, unsplit) gives the same numbers at both ep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.moe_runs import moe_project, train_at_each_ep

pytestmark = pytest.mark.slow
OVERRIDES = ["resources.workers=2", "resources.cpus_per_worker=1", "data.batch_size=4", "rollout.n=4",
             "actor.mini_batch_size=4", "actor.micro_batch_size=8", "data.val_batch_size=8", "run.total_steps=2",
             "run.save_every=1", "reward.workers=1", "run.seed=3"]


@pytest.fixture(scope="module")
def project(tmp_path_factory, arith_data) -> Path:
    return moe_project(tmp_path_factory.mktemp("ep_run"), arith_data)


@pytest.fixture(scope="module")
def runs(project, ray_cluster) -> dict[int, Path]:
    return train_at_each_ep(project, OVERRIDES)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ep2_run_equals_ep1_and_merges_with_every_expert(runs, tmp_path):
    """Tolerance: step metrics rtol 1e-4 (float32 sums in another order through Adam), merged
    weights 1e-4 absolute after two steps at lr 3e-3."""
    from safetensors.numpy import load_file

    from rlctl.checkpoint.merge import merge_run

    ep2, ep1 = _rows(runs[2]), _rows(runs[1])
    assert len(ep2) == len(ep1) == 2
    assert all(row["actor/moe_aux_loss"] >= 2 - 1e-3 for row in ep2)   # top-2: 2 when perfectly balanced
    for a, b in zip(ep2, ep1):
        for key in ("reward/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm",
                    "actor/moe_aux_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    weights = {}
    for ep, run in runs.items():
        merge_run(run, tmp_path / f"merged{ep}")
        weights[ep] = {}
        for f in sorted((tmp_path / f"merged{ep}").glob("*.safetensors")):
            weights[ep].update(load_file(str(f)))
    assert set(weights[2]) == set(weights[1])
    # transformers writes Qwen3-MoE per expert (experts.<e>.gate_proj.weight ...): all 4 in every layer
    experts = {k.split(".experts.")[1].split(".")[0] for k in weights[2] if ".mlp.experts." in k}
    assert experts == {"0", "1", "2", "3"}
    worst = max(float(np.abs(weights[2][k].astype(np.float64) - weights[1][k]).max()) for k in weights[2])
    assert worst < 1e-4, worst
    _serve_answers(tmp_path / "merged2")


def _serve_answers(folder: Path) -> None:
    """`rlctl serve` of a merged MoE folder answers a chat request through the official client."""
    import openai
    from support.servers import ServerProcess

    srv = ServerProcess([str(folder), "--engine", "hf", "--port", "0", "--served-model-name", "moe"])
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="moe", messages=[{"role": "user", "content": "1 + 2 = ?"}],
                                               max_tokens=4, temperature=0)
        assert reply.model == "moe" and reply.usage.completion_tokens >= 1, reply
        assert reply.choices[0].finish_reason in ("stop", "length"), reply
    finally:
        srv.proc.kill()
        srv.proc.wait()


def test_ppo_with_a_critic_at_ep2_equals_ep1(project, ray_cluster):
    """PPO (GAE): the critic is built from the MoE model and FSDP-sharded without expert
    parallelism, the actor's experts split at ep = 2. Step metrics, the critic's included, equal
    ep = 1's (rtol 1e-4, as above)."""
    gae = ["algorithm.name=gae", "rollout.n=2", "actor.micro_batch_size=4", "critic.mini_batch_size=4",
           "critic.micro_batch_size=4"]
    ppo = train_at_each_ep(project, OVERRIDES + gae, "ppo")
    ep2, ep1 = _rows(ppo[2]), _rows(ppo[1])
    assert len(ep2) == len(ep1) == 2
    for a, b in zip(ep2, ep1):
        for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "actor/moe_aux_loss", "critic/vf_loss",
                    "critic/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_an_ep2_checkpoint_resumes_at_ep1(runs):
    """A resume at another expert_parallel_size reshards the experts: step 2 again from step 1's
    checkpoint of the ep = 2 run, now unsplit, gives the uninterrupted run's metrics (rtol 1e-4)."""
    from rlctl.controller.run import resume_training

    before = _rows(runs[2])[1]
    resume_training(runs[2], step=1, address=None, overrides=["actor.expert_parallel_size=1"])
    after = _rows(runs[2])[-1]
    assert after["step"] == 2
    for key in ("reward/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/moe_aux_loss"):
        assert after[key] == pytest.approx(before[key], rel=1e-4, abs=1e-6), key
