"""Exact resume of a vision-language run through the CLI: `rlctl train` on the tiny VLM and the
shapes task (grpo-shapes-cpu, 3 steps, a checkpoint every step), then `rlctl resume RUN --step 1`;
the resumed steps' metrics (images through the processor, rollout, old log-probs, reward, the
update: losses, grad norm, entropy after the resumed update) equal the uninterrupted run's,
timing and throughput aside. Then the recipe with rollout.mode = "one_step_off" / "async" (the
separate rollout group generates from the images): the first batch comes from the weights it
trains (no drift at all: the rollout rank's log-probs equal the trainer's), later ones are stale
by the mode's bound and drift once an update has moved the policy. The CLI's entry
(rlctl.cli.main.main, what the console script runs) is called in-process on one embedded Ray
session, so Ray and the imports start once.

Both need a real update in the first steps. The shapes reward gives the tiny VLM (a near-uniform
byte model writing one token) a signal only when its byte is the colour's first letter, about one
sample in 85, so whether 16 samples a step earn any depends on the sampling stream (the seed, the
processor). The tests' projects score by the response's byte instead (FIRST_BYTE): every response
earns a different reward, so each group's advantages are non-zero on any seed and machine."""

from __future__ import annotations

import json

import pytest

from rlctl.cli.main import main
from rlctl.project import write_project

SMALL = ["run.total_steps=3", "run.save_every=1", "run.keep_last=0", "run.val_every=0", "data.val_files=[]",
         "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4", "actor.micro_batch_size=16", "actor.lr=1e-2"]


OFF = ["resources.rollout_workers=1", "run.save_every=0"]

FIRST_BYTE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return ord(solution_str[0]) / 255 if solution_str else 0.0
'''


def shapes_project(proj, tiny_vlm_dir, shapes_dir, monkeypatch) -> list[str]:
    """grpo-shapes-cpu on the tiny VLM with the shapes data, scored by FIRST_BYTE; returns the
    override that selects that reward."""
    write_project(proj, "grpo-shapes-cpu", str(tiny_vlm_dir))
    (proj / "reward.py").write_text(FIRST_BYTE)
    (proj / "data").mkdir()
    (proj / "data" / "shapes-colour").symlink_to(shapes_dir)
    monkeypatch.chdir(proj)
    return ["reward.function=reward.py:compute_score"]


def metrics(run) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing/", "perf/"))}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_resume_of_a_vlm_run_at_a_checkpoint_repeats_the_next_steps_exactly(tmp_path, tiny_vlm_dir, shapes_dir,
                                                                           ray_cluster, monkeypatch, capsys):
    proj = tmp_path / "proj"
    reward = shapes_project(proj, tiny_vlm_dir, shapes_dir, monkeypatch)
    assert main(["train", *SMALL, *reward]) == 0, capsys.readouterr().err[-3000:]
    run = proj / "runs" / "grpo-shapes-cpu"
    first, lines = metrics(run), (run / "metrics.jsonl").read_text().splitlines()
    assert [r["step"] for r in first] == [1, 2, 3]
    assert max(r["actor/grad_norm"] for r in first[1:]) > 0   # the resumed steps include a real update

    assert main(["resume", str(run), "--step", "1"]) == 0, capsys.readouterr().err[-3000:]
    again = metrics(run)
    state = json.loads((run / "run.json").read_text())
    assert (state["command"], state["resumed_from"], state["status"]) == ("resume", 1, "finished")
    assert (run / "metrics.jsonl").read_text().splitlines()[1:] != lines[1:]   # steps 2-3 ran again (timings)
    assert again == first


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["rollout.mode=one_step_off", "rollout.mode=async rollout.max_staleness=2"])
def test_the_shapes_recipe_trains_off_policy_on_images(tmp_path, tiny_vlm_dir, shapes_dir, ray_cluster, monkeypatch,
                                                       capsys, mode):
    proj = tmp_path / "proj"
    reward = shapes_project(proj, tiny_vlm_dir, shapes_dir, monkeypatch)
    assert main(["train", *SMALL, *reward, *OFF, *mode.split()]) == 0, capsys.readouterr().err[-3000:]
    got = metrics(proj / "runs" / "grpo-shapes-cpu")
    bound = 2.0 if "async" in mode else 1.0
    assert [r["rollout/staleness"] for r in got] == [0.0, 1.0, bound]
    assert got[0]["rollout/logprob_diff_mean"] == pytest.approx(0.0, abs=1e-6)   # v0 pushed: no drift
    moved = [r["rollout/logprob_diff_mean"] for r, before in zip(got[1:], got) if before["actor/grad_norm"] > 0]
    assert moved and all(d > 1e-3 for d in moved), got   # stale after a real update
