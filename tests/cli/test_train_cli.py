"""End to end through the CLI, per recipe: init -> data prep -> validate -> train 2 steps -> status.

Real processes: the `rlctl` console entry in subprocesses, embedded Ray, the reward process pool,
parquet from the in-repo GSM8K sample (tests/fixtures/gsm8k). PPO (actor + critic) trains on two gloo
ranks through the console entry, in its own process with its own embedded Ray; GRPO on two ranks and
the other recipes on one, through the same CLI entry (`rlctl.cli.main.main`, what the console script
calls) in this process, sharing the module's Ray session: what differs between recipes is the
training, not the process start-up, which PPO proves (every recipe also trains and resumes exactly in
tests/controller: GRPO, DAPO and PPO on two ranks). `rlctl config validate` runs as a command for PPO
and, for the others, as the same function in this process (both passes, the machine's included);
`rlctl train` refusing to start a run folder over is recipe-independent and checked once, on GRPO.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TWO_RANKS = ("ppo-gsm8k", "grpo-gsm8k")   # on two ranks
IN_A_PROCESS = ("ppo-gsm8k",)              # `config validate` and `train` as commands
RECIPES = ["ppo-gsm8k", "grpo-gsm8k", "dapo-gsm8k", "rloo-gsm8k", "remax-gsm8k", "reinforce-pp-gsm8k", "prime-gsm8k"]
REQUIRED_METRICS = {"step", "reward/mean", "response_length/mean", "actor/pg_loss", "actor/kl", "actor/entropy",
                    "timing/step_s", "perf/tokens_per_s"}
CPU = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "actor.mini_batch_size=4",
       "actor.micro_batch_size=2", "critic.mini_batch_size=4", "critic.micro_batch_size=2",
       "data.max_response_length=16", "data.val_batch_size=8", "run.total_steps=2", "model.dtype=float32",
       "model.gradient_checkpointing=false", "reward.workers=1", "reward.overlong.buffer_len=8"]


def rlctl(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_end_to_end(recipe, tmp_path, tiny_model_dir, gsm8k_dir, request, monkeypatch, capsys):
    proj = tmp_path / "proj"
    assert rlctl("init", proj, "--recipe", recipe, "--model", tiny_model_dir, cwd=tmp_path).returncode == 0
    prep = rlctl("data", "prep", "gsm8k", "--source", gsm8k_dir, "--limit", "24", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    n = [] if recipe in ("ppo-gsm8k",) else ["rollout.n=2"]
    cpu = [o for o in CPU if not o.startswith("critic.")] if recipe != "ppo-gsm8k" else CPU
    if recipe not in TWO_RANKS:
        cpu = cpu + ["resources.workers=1"]
    if recipe in IN_A_PROCESS:
        check = rlctl("config", "validate", *cpu, *n, cwd=proj)
        assert check.returncode == 0, check.stderr + check.stdout
        train = rlctl("train", *cpu, *n, cwd=proj)
        assert train.returncode == 0, train.stderr[-3000:]
    else:
        from rlctl.cli.main import main

        assert validated(proj, cpu + n) == []
        request.getfixturevalue("ray_cluster")   # started once, for the recipes trained in this process
        monkeypatch.chdir(proj)
        code = main(["train", *cpu, *n])
        assert code == 0, capsys.readouterr().err[-3000:]
    run = proj / "runs" / recipe
    names = sorted(p.name for p in run.iterdir())
    assert {"config.resolved.toml", "metrics.jsonl", "samples.jsonl", "run.json", "checkpoints"} <= set(names)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert REQUIRED_METRICS <= set(rows[0]), REQUIRED_METRICS - set(rows[0])
    assert "val/acc" in rows[-1]  # validation at the end, on test.parquet
    logged = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert logged and all(isinstance(s["response_length"], int) and s["acc"] in (0.0, 1.0) for s in logged)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["step"] == 2 and info["exit_code"] == 0
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_2"
    status = rlctl("status", run, "--format", "json", cwd=proj)
    assert status.returncode == 0 and json.loads(status.stdout)["step"] == 2
    if recipe == "grpo-gsm8k":
        from rlctl.cli.main import main

        capsys.readouterr()
        assert main(["train", *cpu, *n]) == 2          # never silently starts over
        assert "rlctl resume" in capsys.readouterr().err


def validated(proj, overrides: list[str]) -> list[str]:
    """What `rlctl config validate` reports (both passes), called in this process: its errors."""
    from rlctl.config.loader import load_config
    from rlctl.validate import validate

    problems, _ = validate(load_config(proj / "rlctl.toml", overrides))
    return [f"{p.key}: {p.message}" for p in problems if p.severity == "error"]
