"""A checkpoint whose content does not match its manifest is never loaded.

Real `rlctl resume` (the CLI entry, in this process, embedded Ray) on the tiny model: one byte flipped
in the middle of the newest step's optimizer shard, same size, which the size check alone let through.
The ranks check the shards as they load them (each its share); resume warns naming the file and the
rank that found it and redoes the steps from the previous checkpoint (bit for bit the same rows on
CPU); `--step` on the bad step is a one-line error, exit 3.

The run checked is the finished 4-step GRPO run of tests/controller/test_resume.py (2 ranks, saves at
steps 2 and 4), which calls `check_corrupted_newest_checkpoint_falls_back` right after its own exact
resume: one 4-step run and one Ray start fewer than training a run of its own. CPU below is the tiny
GRPO run tests/chaos/test_faults.py trains.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.cli.main import main
from rlctl.controller.checkpointing import prepare_resume

CPU = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "actor.mini_batch_size=2",
       "actor.micro_batch_size=2", "data.max_response_length=8", "data.max_prompt_length=96",
       "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]', "reward.function=arith",
       "reward.workers=1", "reward.overlong.buffer_len=4", "model.dtype=float32",
       "model.gradient_checkpointing=false", "run.total_steps=4", "run.save_every=2", "run.keep_last=0",
       "actor.lr=1e-3", "rollout.n=2"]
NONDETERMINISTIC = ("timing/", "perf/")


def rlctl(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out + err


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def shard(step_dir: Path, part: str) -> Path:
    """The largest file under step_dir/actor whose path names `part` ("optim" or "model")."""
    files = [p for p in (step_dir / "actor").rglob("*") if p.is_file() and part in p.relative_to(step_dir).as_posix()]
    return max(files, key=lambda p: p.stat().st_size)


def check_corrupted_newest_checkpoint_falls_back(run: Path, capsys) -> None:
    """On `run`, a finished 4-step run with checkpoints at steps 2 and 4 (run.keep_last=0): the
    corrupted step_4 is refused by `--step 4` and skipped by a plain resume, which redoes steps 3
    and 4 from step_2 with the same rows. Leaves the run finished at step 4, every shard sound."""
    capsys.readouterr()   # the training's own output, before the lines checked below
    full_rows = rows(run)
    assert [r["step"] for r in full_rows] == [1, 2, 3, 4]
    step_4 = run / "checkpoints" / "step_4"
    optim = shard(step_4, "optim")
    name = optim.relative_to(step_4).as_posix()
    size = optim.stat().st_size
    flip_middle_byte(optim)
    assert optim.stat().st_size == size

    code, text = rlctl(capsys, "resume", run, "--step", "4")
    lines = text.strip().splitlines()
    assert code == 3 and len(lines) == 1 and lines[0].startswith("error: actor worker rank "), text
    assert f"step_4 is broken: {name} does not match its crc32" in lines[0]

    code, text = rlctl(capsys, "resume", run)
    assert code == 0, text
    warnings = [line for line in text.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and name in warnings[0] and "using step_2" in warnings[0], text
    assert "found by actor worker rank " in warnings[0]   # a loading rank found it, in its share of the files
    info = json.loads((run / "run.json").read_text())
    assert info["resumed_from"] == 2 and info["status"] == "finished" and info["step"] == 4
    assert rows(run) == full_rows                 # steps 3 and 4 redone, the same bits

    # The re-saved step_4 is sound; now its model shard goes bad, the same way. The controller's
    # checks before the start pass it (sizes: the ranks check the shards as they load them, above).
    model = shard(step_4, "model")
    flip_middle_byte(model)
    _, notices, step, _ = prepare_resume(run, None)
    assert step == 4 and not any("WARNING" in n for n in notices)
    flip_middle_byte(model)   # the same byte back: the caller goes on with a sound run
