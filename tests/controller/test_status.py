"""`status` and `--plot` on run folders written with the real writers (MetricsLogger, run.json)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from rlctl.controller.metrics_log import MetricsLogger
from rlctl.checkpoint.manager import CheckpointManager
from rlctl.checkpoint.run_folder import find_run_dir, finish_run, read_run_info, start_run, write_run_info
from rlctl.controller.status import curves_figure, plot_curves, render_status, status_summary
from rlctl.errors import UsageError


def make_run(run_dir: Path, *, steps: int = 60, total: int = 100, ckpts=(20, 40), broken=(60,)) -> Path:
    """A run that trained `steps` of `total` steps: rising reward, validation every 20 steps."""
    rng = np.random.default_rng(0)
    start_run(run_dir, name=run_dir.name, total_steps=total)
    with MetricsLogger(run_dir, ["jsonl"], run_dir.name, {"run": {"name": run_dir.name}}) as logger:
        for step in range(1, steps + 1):
            reward = 0.1 + 0.6 * step / total + rng.normal(0, 0.05)
            logger.log(step, {"reward/mean": reward, "reward/acc": reward / 2, "response_length/mean": 80 - step / 2,
                              "actor/pg_loss": rng.normal(0, 0.1), "actor/kl": 0.0005 * step,
                              "actor/entropy": 2.5 - step / 100, "actor/grad_norm": 0.5, "timing/step_s": 2.0,
                              "perf/tokens_per_s": 400.0})
            if step % 20 == 0:
                logger.log(step, {"val/reward/mean": reward - 0.05, "val/acc": reward / 3,
                                  "val/response_length/mean": 70.0})
            write_run_info(run_dir, step=step)
    for step in (*ckpts, *broken):
        folder = run_dir / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 3 * 2**20)
        if step not in broken:
            from rlctl.checkpoint.manifest import write_manifest

            write_manifest(folder, step, {})
    if ckpts:
        (run_dir / "checkpoints" / "LATEST").write_text(f"step_{max(ckpts)}\n")
    return run_dir


def test_running_run_progress_metrics_and_checkpoints(tmp_path):
    run = make_run(tmp_path / "grpo-demo")
    s = status_summary(run)
    assert (s["name"], s["state"], s["step"], s["total_steps"]) == ("grpo-demo", "running", 60, 100)
    assert s["progress"] == pytest.approx(0.6)
    assert s["eta_s"] == pytest.approx(40 * 2.0)  # 40 steps left at 2 s each
    assert s["pid"] == os.getpid() and s["host"] == socket.gethostname()
    assert s["metrics_rows"] == 63
    last = s["last_metrics"]
    assert last["step"] == 60 and last["actor/kl"] == pytest.approx(0.03)
    assert not any(k.startswith("val/") for k in last)
    assert s["last_validation"]["step"] == 60 and s["last_validation"]["val/response_length/mean"] == 70.0
    assert [(c["step"], c["valid"]) for c in s["checkpoints"]] == [(20, True), (40, True), (60, False)]
    assert s["latest_checkpoint"] == 40 and s["checkpoints"][0]["bytes"] > 3 * 2**20
    json.dumps(s)  # --format json needs plain data


@pytest.mark.slow
def test_finished_failed_and_died_runs(tmp_path):
    run = make_run(tmp_path / "done", steps=10, total=10, ckpts=(10,), broken=())
    finish_run(run, status="finished", exit_code=0)
    s = status_summary(run)
    assert s["state"] == "finished" and s["exit_code"] == 0 and s["eta_s"] is None
    assert s["finished_at"] is not None and s["elapsed_s"] is not None

    failed = make_run(tmp_path / "bad", steps=3, ckpts=(), broken=())
    finish_run(failed, status="failed", exit_code=5, error="reward failed on sample 3 (data_source 'x'): boom")
    s = status_summary(failed)
    assert (s["state"], s["exit_code"], s["latest_checkpoint"], s["checkpoints"]) == ("failed", 5, None, [])

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_run_info(failed, status="running", pid=int(gone.stdout), exit_code=None, error=None)
    assert status_summary(failed)["state"] == "died"


def test_resume_keeps_created_at_and_records_the_step(tmp_path):
    run = make_run(tmp_path / "r", steps=5)
    first = read_run_info(run)
    finish_run(run, status="interrupted", exit_code=130, error="stopped by Ctrl-C at a safe point")
    info = start_run(run, name="r", total_steps=100, command="resume", resumed_from=4)
    assert info["created_at"] == first["created_at"] and info["status"] == "running"
    assert (info["step"], info["resumed_from"], info["command"], info["exit_code"]) == (4, 4, "resume", None)
    assert set(info) >= {"name", "status", "step", "total_steps", "created_at", "started_at", "updated_at",
                         "finished_at", "exit_code", "error", "pid", "host", "rlctl_version"}


def test_render_status_for_people(tmp_path):
    run = make_run(tmp_path / "grpo-demo")
    out = io.StringIO()
    render_status(status_summary(run), Console(file=out, width=200, force_terminal=False))
    text = out.getvalue()
    assert "run grpo-demo  running" in text
    assert "step 60/100 (60%)" in text and "eta 0:01:20" in text
    assert "last step  60/100  reward" in text and "kl 0.0300" in text
    assert "validation at step 60: reward/mean" in text
    assert ("step_60 broken: MANIFEST.json is missing (the save did not finish), step_40 (latest) 3.0 MiB, "
            "step_20 3.0 MiB") in text


def test_a_truncated_latest_checkpoint_is_shown_broken(tmp_path):
    run = make_run(tmp_path / "grpo-demo", steps=40, ckpts=(20, 40))
    shard = run / "checkpoints" / "step_40" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    summary = status_summary(run)
    assert summary["latest_checkpoint"] is None           # LATEST names a checkpoint that does not verify
    out = io.StringIO()
    render_status(summary, Console(file=out, width=200, force_terminal=False))
    assert "step_40 broken: model.safetensors is" in out.getvalue()


def test_not_a_run_folder(tmp_path):
    with pytest.raises(UsageError, match="is not a run folder") as info:
        status_summary(tmp_path)
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match="no run folder"):
        find_run_dir(tmp_path)


def test_find_run_dir_picks_the_newest_run(tmp_path):
    old = make_run(tmp_path / "runs" / "old", steps=2)
    new = make_run(tmp_path / "runs" / "new", steps=2)
    os.utime(old / "run.json", (1, 1))
    assert find_run_dir(tmp_path) == new
    assert find_run_dir(old) == old
    assert CheckpointManager.for_run(tmp_path).listing() == []


def test_plot_curves_writes_a_png(tmp_path):
    run = make_run(tmp_path / "grpo-demo")
    out = plot_curves(run, tmp_path / "plots" / "curves.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    empty = tmp_path / "empty"
    start_run(empty, name="empty", total_steps=5)
    assert plot_curves(empty, tmp_path / "empty.png").stat().st_size > 5_000  # "no data" panels, no crash


def test_plot_of_a_short_run_has_whole_step_ticks_and_no_hidden_curve(tmp_path):
    """3 steps of a 0/1 reward: reward/acc equals reward/mean, and the step axis must not read 1.25."""
    run = tmp_path / "short"
    start_run(run, name="short", total_steps=3)
    with MetricsLogger(run, ["jsonl"], "short", {}) as logger:
        for step, reward in ((1, 0.25), (2, 0.5), (3, 0.5)):
            logger.log(step, {"reward/mean": reward, "reward/acc": reward, "actor/kl": 0.01 * step,
                              "response_length/mean": 10.0 + step, "actor/entropy": 2.0 - step / 10})
        logger.log(3, {"val/reward/mean": 0.4, "val/response_length/mean": 12.0})
    fig = curves_figure(run)
    fig.canvas.draw()
    assert len(fig.axes) == 4
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        labels = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
        assert labels == ["1", "2", "3"], (ax.get_title(), labels)
    reward = fig.axes[0]
    mean, acc, val = reward.get_lines()
    assert list(mean.get_ydata()) == list(acc.get_ydata())          # the same curve twice...
    assert acc.get_linestyle() != mean.get_linestyle() and acc.get_marker() != mean.get_marker()
    assert acc.get_linewidth() < mean.get_linewidth()                # ...the top one thinner: both show
    assert val.get_marker() not in (mean.get_marker(), acc.get_marker())
    assert [t.get_text() for t in reward.get_legend().get_texts()] == ["reward/mean", "reward/acc", "val/reward/mean"]
    one = tmp_path / "one"                                           # a single step is a marked point
    start_run(one, name="one", total_steps=3)
    with MetricsLogger(one, ["jsonl"], "one", {}) as logger:
        logger.log(1, {"reward/mean": 0.5, "actor/kl": 0.0})
    assert all(line.get_marker() not in (None, "None", "") for ax in curves_figure(one).axes for line in ax.get_lines())


@pytest.mark.slow
def test_plot_without_matplotlib_says_how_to_install(tmp_path):
    run = make_run(tmp_path / "r", steps=2)
    # A real interpreter where `import matplotlib` fails (a None entry in sys.modules blocks it).
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from rlctl.controller.status import plot_curves\n"
            "from rlctl.errors import UsageError\n"
            "try:\n    plot_curves(sys.argv[1], sys.argv[2])\n"
            "except UsageError as e:\n    print(e.exit_code, e.message, e.hint)\n")
    done = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "x.png")],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == '2 plotting needs matplotlib, which is not installed pip install "rlctl[plot]".'
    assert not (tmp_path / "x.png").exists()


def test_resuming_a_finished_run_starts_nothing(tmp_path, capsys):
    from rlctl.controller.run import _already_finished

    run = make_run(tmp_path / "r", steps=40, total=40, ckpts=(20, 40), broken=())
    step = lambda n: run / "checkpoints" / f"step_{n}"   # noqa: E731
    finish_run(run, status="finished", exit_code=0)
    assert _already_finished(run, 40, step(40), ())
    assert "r already finished at step 40/40; nothing to do" in capsys.readouterr().out
    assert not _already_finished(run, 40, step(40), ["run.total_steps=80"])   # asked to train longer
    assert not _already_finished(run, 20, step(20), ())                        # --step 20: redo the rest
    shard = step(40) / "model.safetensors"                                     # same size, other content:
    intact = shard.read_bytes()
    shard.write_bytes(b"\1" + intact[1:])                                     # loaded, so resume falls back
    assert not _already_finished(run, 40, step(40), ())
    shard.write_bytes(intact)
    finish_run(run, status="interrupted", exit_code=130)
    assert not _already_finished(run, 40, step(40), ())


def test_a_stop_signal_that_also_ended_the_workers_is_an_interruption(tmp_path):
    """SIGTERM to the whole process group reaches Ray's raylet too, which kills the worker ranks
    (that part needs a real Ray: tests/cli/test_interrupt.py); the run then reports the user's
    stop (exit 143) and where resume will start, not a worker crash (exit 4)."""
    import signal
    from types import SimpleNamespace

    from rlctl.controller.run import _signal_killed_the_workers
    from rlctl.controller.session import RunState

    run = make_run(tmp_path / "r", steps=41, ckpts=(20, 40), broken=())
    setup = SimpleNamespace(checkpoints=CheckpointManager.for_run(run), state=RunState(step=41))
    stopped = _signal_killed_the_workers(SimpleNamespace(signum=signal.SIGTERM), setup)
    assert stopped.exit_code == 143
    assert stopped.message == ("stopped by SIGTERM, which also reached Ray's own processes: the workers ended "
                               "before step 42 could finish or be saved; rlctl resume continues from step 40")
    empty = make_run(tmp_path / "e", steps=3, ckpts=(), broken=())
    setup = SimpleNamespace(checkpoints=CheckpointManager.for_run(empty), state=RunState(step=3))
    stopped = _signal_killed_the_workers(SimpleNamespace(signum=signal.SIGINT), setup)
    assert stopped.exit_code == 130 and stopped.message.endswith("no checkpoint was saved yet")
