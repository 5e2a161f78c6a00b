"""A real short run that validates every step: `perf/mfu` in its metrics, and the best checkpoint.

One GRPO run (tiny model, arith data, 1 Ray worker) with run.best_metric = "val/reward/mean" and
run.keep_last = 1, fewer than the checkpoints it saves: the step metrics.jsonl says is best must
survive retention, be what BEST.json, `rlctl status` and `rlctl merge --best` name, and stay the
best through a resume.

The best must come before the last step, so that retention has a checkpoint to spare. Which step
has the highest reward of a learning run depends on the sampling stream (the seed, the processor);
its lowest is reliably early. So the run asks for run.best_mode = "min": the record, retention and
`merge --best` do the same whichever way the metric is compared.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlctl.cli.main import main
from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

pytestmark = pytest.mark.slow
STEPS = 5
OVERRIDES = ["resources.workers=1", "resources.cpus_per_worker=1", "data.batch_size=4", "rollout.n=2",
             "actor.mini_batch_size=4", "actor.micro_batch_size=8", "data.val_batch_size=40",
             f"run.total_steps={STEPS}", "run.val_every=1", "run.save_every=0", "run.keep_last=1",
             "run.best_metric=val/reward/mean", "run.best_mode=min", "reward.workers=1", "run.seed=5"]


def metric_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def best_step(rows: list[dict]) -> int:
    """The first step with the lowest val/reward/mean (best_mode min: a tie is no improvement)."""
    best = None
    for row in rows:
        if best is None or row["val/reward/mean"] < best["val/reward/mean"]:
            best = row
    return best["step"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, arith_data, ray_cluster) -> Path:
    from rlctl.project import write_project

    proj = tmp_path_factory.mktemp("best")
    write_project(proj, "grpo-arith-cpu", str(tiny_model_dir))
    (proj / "data").mkdir()
    (proj / "data" / "arith").symlink_to(arith_data)
    start_training(load_config(proj / "rlctl.toml", OVERRIDES), address=None, force=False)
    return proj / "runs" / "grpo-arith-cpu"


def test_mfu_is_logged_and_follows_the_formula(run, tiny_model_dir):
    from rlctl.utils.flops import ModelShape, forward_flops

    shape = ModelShape.from_hf_config(json.loads((tiny_model_dir / "config.json").read_text()))
    rows = metric_rows(run)
    assert len(rows) == STEPS
    for row in rows:
        assert 0 < row["perf/mfu"] <= 1 and row["perf/peak_flops"] > 1e8
        sequences = row["data/sequences"]
        generated = row["perf/tokens_per_s"] * row["timing/step_s"]     # the logged rate, back to tokens
        assert generated == pytest.approx(row["response_length/mean"] * sequences, rel=1e-6)
        # GRPO with a KL loss, on-policy, full fine-tuning: generate 1 + reference 1 + (forward 1 +
        # backward 2) = 5 forward-equivalents, against the summed peak of the ranks.
        flops = 5 * forward_flops(shape, prompt_tokens=row["prompt_length/mean"] * sequences,
                                  response_tokens=generated, rows=int(sequences), group_size=2)
        assert row["perf/mfu"] == pytest.approx(flops / row["timing/step_s"] / row["perf/peak_flops"], rel=1e-6)


def test_the_best_step_survives_retention_and_merges(run, tmp_path, capsys):
    rows = metric_rows(run)
    best = best_step(rows)
    assert best != STEPS, f"the lowest validation reward should come before the last step: {[r['val/reward/mean'] for r in rows]}"
    record = json.loads((run / "checkpoints" / "BEST.json").read_text())
    assert record == {"step": best, "metric": "val/reward/mean", "mode": "min",
                      "value": pytest.approx(rows[best - 1]["val/reward/mean"])}
    # keep_last = 1 of the saves (every new best, then the end): the best and the last remain
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == sorted({f"step_{best}", f"step_{STEPS}"})

    assert main(["status", str(run), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["best_checkpoint"]["step"] == best
    assert main(["status", str(run)]) == 0
    assert f"step_{best} " in capsys.readouterr().out.replace("\n", " ")

    out = tmp_path / "hf"
    assert main(["merge", str(run), "--best", "--to-hf", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == best
    source = json.loads((out / "rlctl_source.json").read_text())
    manifest = json.loads((run / "checkpoints" / f"step_{best}" / "MANIFEST.json").read_text())
    assert source["step"] == manifest["step"] == best and source["best"]["step"] == best


def test_best_with_step_or_without_a_record_is_one_line(run, tmp_path, capsys):
    assert main(["merge", str(run), "--best", "--step", "1", "--to-hf", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--best and --step" in err and len(err.splitlines()) == 1
    bare = tmp_path / "no-best"
    shutil.copytree(run, bare, symlinks=True)
    (bare / "checkpoints" / "BEST.json").unlink()   # as a run trained without run.best_metric
    assert main(["merge", str(bare), "--best", "--to-hf", str(tmp_path / "b")]) == 3
    err = capsys.readouterr().err.strip()
    assert "no best checkpoint recorded" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_resume_keeps_the_best_record(run):
    before = json.loads((run / "checkpoints" / "BEST.json").read_text())
    resume_training(run, step=None, address=None, overrides=[f"run.total_steps={STEPS + 1}"])
    rows = metric_rows(run)
    after = json.loads((run / "checkpoints" / "BEST.json").read_text())
    assert after["step"] == best_step(rows)            # step 6 only replaces it by beating it
    if after["step"] == before["step"]:
        assert after == before
    assert (run / "checkpoints" / f"step_{after['step']}" / "MANIFEST.json").is_file()
