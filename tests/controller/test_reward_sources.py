"""Training against rewards from models: a remote reward service, an LLM judge, a reward model.

Real parts throughout: Ray actors, the HF rollout engine, an HTTP reward service on loopback,
`rlctl serve` as the judge, a reward-model worker group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.reward_server import JudgeServer, RewardService, build_digit_judge

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training

COMMON = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=8",
          "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
          "model.dtype=float32", "model.gradient_checkpointing=false", "run.save_every=0",
          "actor.lr=3e-3", "actor.warmup_steps=0", "data.batch_size=8", "rollout.n=8",
          "actor.mini_batch_size=8", "actor.micro_batch_size=64"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_grpo_learns_from_a_remote_reward_service(tmp_path, make_project, ray_cluster):
    """The service scores the share of lowercase letters; the policy learns to raise it."""
    proj = make_project(tmp_path, "grpo-arith-cpu")
    steps = 24
    with RewardService() as service:
        overrides = COMMON + ["reward.function=", f"reward.remote_url={service.url}", f"run.total_steps={steps}"]
        start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    rows = _metrics(proj / "runs" / "grpo-arith-cpu")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    rewards = [r["reward/mean"] for r in rows]
    assert [r["reward/remote/mean"] for r in rows] == pytest.approx(rewards)
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.05, f"reward {first:.3f} -> {last:.3f} ({[round(x, 3) for x in rewards]})"
    assert len(service.requests) >= steps  # every step asked the service


def _direct_rm_scores(rm_dir: Path, chats: list[list[dict]]) -> list[float]:
    """What transformers says for each chat alone, with the reward model's own tokenizer and template."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for chat in chats:
            ids = tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False, return_tensors="pt")
            out.append(float(model(**ids).logits[0, 0]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("colocate", [True, False])
def test_logged_scores_equal_the_reward_model_run_directly(colocate, tmp_path, make_project, ray_cluster,
                                                          tiny_model_dir):
    from rlctl.controller.prompts import read_rows
    from rlctl.models.tiny import build_tiny_reward_model
    from rlctl.models.loading import load_tokenizer

    proj = make_project(tmp_path, "grpo-arith-cpu")
    build_tiny_reward_model(proj / "rm", seed=3)
    overrides = COMMON + ["reward.function=", "reward.model=rm", "reward.model_micro_batch_size=3",
                          f"resources.colocate={str(colocate).lower()}", "run.total_steps=2", "run.log_samples=16",
                          "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4", "actor.micro_batch_size=16"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    run = proj / "runs" / "grpo-arith-cpu"
    rows = _metrics(run)
    assert [r["reward/model/mean"] for r in rows] == pytest.approx([r["reward/mean"] for r in rows])
    # samples.jsonl holds the templated prompt; find each one's chat messages in the data
    policy_tok = load_tokenizer(str(tiny_model_dir))
    by_prompt = {policy_tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False): r["prompt"]
                 for r in read_rows([proj / "data" / "arith" / "train.parquet"])}
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 32
    chats = [list(by_prompt[s["prompt"]]) + [{"role": "assistant", "content": s["response"]}] for s in samples]
    assert [s["score"] for s in samples] == pytest.approx(_direct_rm_scores(proj / "rm", chats), abs=1e-5)
    assert len({round(s["score"], 6) for s in samples}) > 4  # real scores, not one constant


@pytest.mark.slow
def test_a_short_run_graded_by_rlctl_serve_as_judge(tmp_path, make_project, ray_cluster, monkeypatch):
    """`rlctl serve` of a tiny judge (it answers 7 or 3) grades a 2-step run next to the function."""
    proj = make_project(tmp_path, "grpo-arith-cpu")
    build_digit_judge(tmp_path / "judge")
    monkeypatch.setenv("JUDGE_KEY", "k-123")
    with JudgeServer(tmp_path / "judge", api_key="k-123", name="grader") as judge:
        overrides = COMMON + ["reward.function=reward.py:compute_score", f"reward.judge_url={judge.url}",
                              "reward.judge_model=grader", "reward.judge_api_key_env=JUDGE_KEY",
                              "reward.judge_max_tokens=1", "reward.weights={ function = 1.0, judge = 0.1 }",
                              "run.total_steps=2", "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4",
                              "actor.micro_batch_size=16"]
        start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    rows = _metrics(proj / "runs" / "grpo-arith-cpu")
    assert len(rows) == 2
    for r in rows:
        assert 3.0 <= r["reward/judge/mean"] <= 7.0 and r["reward/judge/errors"] == 0
        assert r["reward/mean"] == pytest.approx(r["reward/function/mean"] + 0.1 * r["reward/judge/mean"], abs=1e-5)


@pytest.mark.slow
def test_service_dying_mid_run_stops_the_run_with_exit_5(tmp_path, make_project, ray_cluster):
    from rlctl.errors import RewardError

    proj = make_project(tmp_path, "grpo-arith-cpu")
    with RewardService(fail_after=2) as service:  # 16 samples a step = one request: steps 1-2 are scored
        overrides = COMMON + ["reward.function=", f"reward.remote_url={service.url}", "reward.retries=1",
                              "run.total_steps=4", "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4",
                              "actor.micro_batch_size=16"]
        with pytest.raises(RewardError, match="reward source 'remote' failed on sample 0 .*HTTP 500") as err:
            start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    assert err.value.exit_code == 5
    assert [r["step"] for r in _metrics(proj / "runs" / "grpo-arith-cpu")] == [1, 2]
    assert len(service.requests) == 4  # step 3's request and its one retry
