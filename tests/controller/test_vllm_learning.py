"""GRPO with rollout.engine = "vllm" learns on CPU through the CLI, as the hf engine does in
test_learning.py (same recipe, dense reward, overrides), on `rlctl model tiny --layers 4 --hidden 256`.

Real everything: `rlctl train`'s training in this process (on the shared Ray), Ray actors, vLLM in the
actor's process joining its gloo world, the weights pushed after every update. Every step's
`rollout/logprob_diff_mean` (the engine's log-probs of its samples against the trainer's) stays at
float32 noise: an engine that missed a push would generate with the previous step's weights, miles
from 1e-3 (and rollout.max_logprob_diff would stop the run). Skipped without vllm; a failure under CI=true.

The same run also proves DAPO's dynamic sampling and validation with vLLM, without another engine
start: the reward's `acc` (the filter's metric here) is flat for prompts with an even answer, so
their groups are dropped and each step needs more than one generation round from the engine; and
greedy validation on data/arith/test.parquet runs before the first step and at the end, on the
pushed weights.
"""

from __future__ import annotations

import json

import pytest
from test_learning import COMMON, GROUP

from support.dense_reward import DENSE_REWARD

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
STEPS = 6
# the dense score; `acc` repeats it for odd answers and is flat (0) for even ones, whose groups
# dynamic sampling (metric = "acc") therefore filters out
REWARD = DENSE_REWARD + '''
def odd_answers_vary(data_source, solution_str, ground_truth, extra_info=None):
    score = compute_score(data_source, solution_str, ground_truth)
    return {"score": score, "acc": score if int(ground_truth) % 2 else 0.0}
'''


def test_grpo_with_vllm_learns_and_the_engine_follows_every_update(tmp_path, vllm_tiny_model_dir, arith_data,
                                                                   ray_cluster):
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training
    from rlctl.project import write_project

    write_project(tmp_path, "grpo-gsm8k", str(vllm_tiny_model_dir))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arith").symlink_to(arith_data)
    (tmp_path / "dense.py").write_text(REWARD)
    overrides = COMMON + GROUP + [f"run.total_steps={STEPS}", "rollout.engine=vllm", "rollout.enforce_eager=true",
                                  "reward.function=dense.py:odd_answers_vary", "algorithm.dynamic_sampling.enable=true",
                                  "algorithm.dynamic_sampling.metric=acc", "algorithm.dynamic_sampling.max_gen_batches=3",
                                  'data.val_files=["data/arith/test.parquet"]', "run.val_before_train=true",
                                  "run.log_samples=64"]
    start_training(load_config(tmp_path / "rlctl.toml", overrides), address=None, force=False)
    run = tmp_path / "runs" / "grpo-gsm8k"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val_before, rows = rows[0], rows[1:]
    assert val_before["step"] == 0 and [r["step"] for r in rows] == list(range(1, STEPS + 1))
    drift = [r["rollout/logprob_diff_mean"] for r in rows]
    assert max(drift) < 1e-4, drift                        # fp32: ~3e-7 measured; a missed push is > 0.1
    rewards = [r["reward/mean"] for r in rows]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.2, rewards
    # dynamic sampling: about half the groups are filtered, so steps take several rounds of vLLM
    # samples (new prompts, new seeds), and every trained sample has an odd answer
    assert sum(r["dynamic_sampling/rounds"] for r in rows) > STEPS, [r["dynamic_sampling/rounds"] for r in rows]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= STEPS * 8 and all(int(s["ground_truth"]) % 2 for s in samples)
    # validation: greedy vLLM generations scored on all 40 held-out prompts, before and after training
    assert "val/reward/mean" not in rows[0] and "val/reward/mean" in rows[-1]
    assert rows[-1]["val/reward/mean"] > val_before["val/reward/mean"] + 0.2, (val_before, rows[-1])
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
