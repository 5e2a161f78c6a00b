"""One writer per run folder: the flock on the run folder, and how `rlctl train` claims a folder.

Real flocks on real folders. A lock taken through another open of the folder conflicts even inside
one process (flock belongs to the open file description), which lets the fast tests stand in for a
second rlctl; the kill -9 test uses a real second process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from rlctl.checkpoint.run_lock import RunLock
from rlctl.controller.run_dir import claim_new_run_dir
from rlctl.errors import EXIT_USAGE, UsageError


def test_a_second_lock_is_refused_in_one_line_and_names_the_holder(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"status": "running", "pid": 4242, "host": "h",
                                                   "command": "train"}))
    with RunLock.acquire(tmp_path, "train"):
        with pytest.raises(UsageError) as refused:
            RunLock.acquire(tmp_path, "resume")
    assert refused.value.exit_code == EXIT_USAGE
    assert "in use by a running `rlctl train` (pid 4242 on h)" in refused.value.message
    assert "\n" not in str(refused.value)
    RunLock.acquire(tmp_path, "resume").release()   # released: free again


def test_a_refused_command_writes_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with RunLock.acquire(tmp_path, "train"):
        with pytest.raises(UsageError):
            claim_new_run_dir(tmp_path, force=True)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    assert [p.name for p in tmp_path.parent.iterdir() if p.name.startswith(tmp_path.name + ".old")] == []


@pytest.mark.slow
def test_the_lock_dies_with_a_killed_holder(tmp_path):
    code = ("import sys, time\nfrom rlctl.checkpoint.run_lock import RunLock\n"
            "lock = RunLock.acquire(sys.argv[1], 'train')\nprint('held', flush=True)\ntime.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError):
            RunLock.acquire(tmp_path, "resume")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
    RunLock.acquire(tmp_path, "resume").release()   # no stale lock: the kernel dropped it


def test_claim_creates_and_locks_a_new_folder(tmp_path):
    run = tmp_path / "runs" / "new"
    lock, notices = claim_new_run_dir(run, force=False)
    with lock:
        assert run.is_dir() and notices == []
        with pytest.raises(UsageError, match="in use"):
            claim_new_run_dir(run, force=False)


@pytest.mark.parametrize("status", ["failed", "interrupted", "running"])   # running: its holder was killed
def test_a_failed_start_is_reused_without_force_or_litter(tmp_path, status):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.resolved.toml").write_text("x = 1\n")
    (run / "metrics.jsonl").write_text("")
    (run / "run.json").write_text(json.dumps({"status": status, "step": 0, "exit_code": 3}))
    (run / "notes.txt").write_text("mine")   # not rlctl's: kept
    lock, notices = claim_new_run_dir(run, force=False)
    lock.release()
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert f"ended before step 1 ({'its process died' if status == 'running' else status})" in notices[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_a_run_with_steps_or_checkpoints_is_kept(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UsageError, match="pass --force"):
        claim_new_run_dir(run, force=False)
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    with pytest.raises(UsageError, match="rlctl resume"):
        claim_new_run_dir(run, force=True)
    RunLock.acquire(run, "train").release()   # a refusal leaves no lock behind


def test_force_moves_the_old_folder_aside_and_locks_the_new_one(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    lock, notices = claim_new_run_dir(run, force=True)
    with lock:
        old = [p for p in tmp_path.iterdir() if p.name.startswith("r.old-")]
        assert len(old) == 1 and (old[0] / "metrics.jsonl").is_file() and "moved the old r aside" in notices[0]
        assert not any(run.iterdir())
        with pytest.raises(UsageError, match="in use"):
            RunLock.acquire(run, "train")
        RunLock.acquire(old[0], "train").release()
        from rlctl.checkpoint.run_lock import check_run_folder

        check_run_folder(run)   # the re-taken lock is on the new folder: writing there is fine


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_live_run_whose_folder_is_deleted_stops_writing_and_leaves_the_new_folder_alone(tmp_path, how):
    """The user deletes (or moves away) runs/r while its run is live and starts a new run r: the
    old process's run.json, rollout log and checkpoint writes must not land in the new folder."""
    import shutil
    from types import SimpleNamespace

    from rlctl.checkpoint.run_folder import RUN_FILE, finish_run, start_run, write_run_info
    from rlctl.checkpoint.run_lock import RunFolderGone
    from rlctl.controller import checkpointing
    from rlctl.controller.rollout_log import write_rollouts
    from rlctl.errors import EXIT_DATA

    run = tmp_path / "runs" / "r"
    lock, _ = claim_new_run_dir(run, force=False)
    with lock:
        start_run(run, name="r", total_steps=4)
        write_run_info(run, step=1)
        if how == "deleted":
            shutil.rmtree(run)
        else:
            run.rename(tmp_path / "elsewhere")
        run.mkdir()   # the new run's folder (its process would lock it: another process, not shown)
        (run / "mine.txt").write_text("the new run's")
        session = SimpleNamespace(run_dir=run, state=SimpleNamespace(saved_step=0))
        writes = (lambda: write_run_info(run, step=2), lambda: finish_run(run, status="failed", exit_code=3),
                  lambda: write_rollouts(run, 2, None), lambda: checkpointing.save(session, 2))
        for write in writes:
            with pytest.raises(RunFolderGone, match=f"run folder {run} was (deleted|replaced)") as err:
                write()
            assert err.value.exit_code == EXIT_DATA and "\n" not in err.value.message
        assert sorted(os.listdir(run)) == ["mine.txt"] and not (run / RUN_FILE).exists()
