"""CheckpointManager on real folders: atomic saves, LATEST, retention, leftovers, fallback, kill -9."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.checkpoint.manager import CheckpointManager
from rlctl.checkpoint.manifest import read_manifest, verify
from rlctl.errors import CheckpointError

HERE = Path(__file__).parent


def files_writer(step: int, *, size: int = 4096):
    def write(tmp: Path) -> None:
        (tmp / "actor" / "model").mkdir(parents=True)
        (tmp / "actor" / "model" / "shard-0.safetensors").write_bytes(bytes([step % 256]) * size)
        (tmp / "actor" / "engine.json").write_text(json.dumps({"world_size": 2}))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    return write


def saved_steps(root: Path, keep_last: int = 0, steps=(1, 2, 3)) -> CheckpointManager:
    manager = CheckpointManager(root, keep_last, notify=lambda m: None)
    for step in steps:
        manager.save(step, files_writer(step), meta={"note": f"s{step}"})
    return manager


def state_step(step_dir: Path) -> int:
    return json.loads((step_dir / "trainer_state.json").read_text())["step"]


def test_save_commits_manifest_then_latest(tmp_path):
    manager = saved_steps(tmp_path, steps=(5,))
    step_dir = tmp_path / "step_5"
    manifest = read_manifest(step_dir)
    assert (tmp_path / "LATEST").read_text() == "step_5\n"
    assert manifest["step"] == 5 and manifest["world_size"] == 2 and manifest["meta"] == {"note": "s5"}
    assert {f["path"] for f in manifest["files"]} == {"actor/model/shard-0.safetensors", "actor/engine.json",
                                                      "trainer_state.json"}
    assert set(manifest["versions"]) >= {"rlctl", "torch", "transformers"} and manifest["versions"]["torch"]
    entry = next(f for f in manifest["files"] if f["path"].endswith("shard-0.safetensors"))
    import zlib
    assert entry["size"] == 4096 and entry["crc32"] == f"{zlib.crc32(bytes([5]) * 4096):08x}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert manager.latest_valid() == (5, step_dir, None)


def test_writer_that_raises_leaves_previous_latest(tmp_path):
    manager = saved_steps(tmp_path, steps=(1,))

    def broken(tmp: Path) -> None:
        files_writer(2)(tmp)
        raise RuntimeError("disk full halfway")

    with pytest.raises(RuntimeError, match="disk full"):
        manager.save(2, broken, meta={})
    assert (tmp_path / "LATEST").read_text() == "step_1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step_1"]
    assert manager.latest_valid().step == 1


def test_resaving_a_step_replaces_it_without_leaving_two(tmp_path):
    manager = saved_steps(tmp_path, steps=(1, 2))
    manager.save(2, files_writer(200), meta={"again": True})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step_1", "step_2"]
    assert state_step(tmp_path / "step_2") == 200 and read_manifest(tmp_path / "step_2")["meta"] == {"again": True}


def test_retention_keeps_newest_and_what_latest_names(tmp_path):
    manager = saved_steps(tmp_path, keep_last=2, steps=(1, 2, 3, 4))
    assert manager.steps() == [3, 4]
    keep_all = saved_steps(tmp_path / "all", keep_last=0, steps=(1, 2, 3, 4))
    assert keep_all.steps() == [1, 2, 3, 4]


def test_retention_never_deletes_the_best_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, 1, notify=lambda m: None)
    best = {"step": 2, "metric": "val/acc", "mode": "max", "value": 0.5}
    manager.save(1, files_writer(1), meta={})
    manager.save(2, files_writer(2), meta={}, best=best)     # committed, then named best
    for step in (3, 4):
        manager.save(step, files_writer(step), meta={}, best=best)
    assert manager.steps() == [2, 4] and manager.read_best() == best
    manager.save(5, files_writer(5), meta={}, best={**best, "step": 5, "value": 0.75})
    assert manager.steps() == [5]                              # the old best goes once it is not best
    manager.write_best(None)
    assert manager.read_best() is None and not (tmp_path / "BEST.json").exists()
    (tmp_path / "BEST.json").write_text("{not json")            # unreadable: no record, no crash
    assert manager.read_best() is None and manager.apply_retention() == []


def test_steps_newer_than_latest_after_resume_to_an_earlier_step(tmp_path):
    """`resume --step 3` of a run that has 3, 4, 5 saves step 4 again: LATEST = 4; step 5 belongs to
    the abandoned branch: retention neither counts nor deletes it, and fallback never picks it."""
    manager = saved_steps(tmp_path, keep_last=3, steps=(1, 2, 3, 4, 5))
    assert manager.steps() == [3, 4, 5]
    manager.save(4, files_writer(44), meta={})
    assert manager.steps() == [3, 4, 5] and manager.latest_valid().step == 4
    (tmp_path / "step_4" / "trainer_state.json").unlink()
    point = manager.latest_valid()
    assert point.step == 3 and "LATEST names step_4" in point.warning


@pytest.mark.slow
def test_leftovers_of_a_killed_save_are_cleaned_with_a_notice(tmp_path):
    manager = saved_steps(tmp_path, steps=(1,))
    dead_pid = _dead_pid()
    partial = tmp_path / f".tmp-step_2-{dead_pid}"
    files_writer(2)(partial.mkdir() or partial)
    (tmp_path / ".LATEST.abc123.tmp").write_text("step_2\n")
    notices = []
    manager.notify = notices.append
    assert manager.clean_leftovers() == notices
    assert len(notices) == 1 and f".tmp-step_2-{dead_pid}" in notices[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step_1"]


@pytest.mark.slow
def test_leftovers_of_a_live_process_are_left_alone(tmp_path):
    manager = saved_steps(tmp_path, steps=(1,))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f".tmp-step_2-{live.pid}").mkdir()
        assert manager.clean_leftovers() == []
        assert (tmp_path / f".tmp-step_2-{live.pid}").is_dir()
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow
def test_killed_while_replacing_latest_step_is_recovered(tmp_path):
    """The one window where LATEST names a missing folder: step_2 moved aside, the new copy not yet
    renamed in. The complete new copy (manifest written) is renamed back into place."""
    manager = saved_steps(tmp_path, steps=(1, 2))
    pid = _dead_pid()
    os.rename(tmp_path / "step_2", tmp_path / f".tmp-replaced-step_2-{pid}")
    fresh = CheckpointManager(tmp_path / "scratch", 0, notify=lambda m: None)
    fresh.save(2, files_writer(222), meta={})
    os.rename(tmp_path / "scratch" / "step_2", tmp_path / f".tmp-step_2-{pid}")
    notices = manager.clean_leftovers()
    assert notices[0].startswith(f"recovered step_2 from .tmp-step_2-{pid}")
    assert state_step(tmp_path / "step_2") == 222 and manager.latest_valid() == (2, tmp_path / "step_2", None)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_broken_latest_falls_back_with_a_warning(tmp_path):
    manager = saved_steps(tmp_path, steps=(1, 2, 3))
    shard = tmp_path / "step_3" / "actor" / "model" / "shard-0.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])     # truncated
    point = manager.latest_valid()
    assert point.step == 2 and "LATEST names step_3, which is broken" in point.warning
    assert "shard-0.safetensors is 100 bytes, the manifest says 4096" in point.warning

    (tmp_path / "LATEST").write_bytes(b"\xff garbage")
    point = manager.latest_valid()
    assert point.step == 2 and "missing or unreadable" in point.warning  # step_3 is still broken

    (tmp_path / "LATEST").write_text("step_3\n")
    (tmp_path / "step_2" / "MANIFEST.json").unlink()   # an incomplete step is never picked
    assert manager.latest_valid().step == 1


def test_hash_check_catches_same_size_corruption(tmp_path):
    manager = saved_steps(tmp_path, steps=(1, 2))
    shard = tmp_path / "step_2" / "actor" / "model" / "shard-0.safetensors"
    shard.write_bytes(b"\x00" * 4096)              # same size, other bytes
    assert manager.latest_valid().warning is None   # sizes only: looks fine
    point = manager.latest_valid(hashes=True)
    assert point.step == 1 and "does not match its crc32" in point.warning
    assert verify(tmp_path / "step_2", hashes=True) == [
        "actor/model/shard-0.safetensors does not match its crc32 in the manifest (corrupted)"]


def test_manifests_with_sha256_are_still_verified(tmp_path):
    """Checkpoints saved before crc32 record sha256 per file: read and checked as before."""
    import hashlib

    manager = saved_steps(tmp_path, steps=(1,))
    step_dir = tmp_path / "step_1"
    manifest = json.loads((step_dir / "MANIFEST.json").read_text())
    for entry in manifest["files"]:
        del entry["crc32"]
        entry["sha256"] = hashlib.sha256((step_dir / entry["path"]).read_bytes()).hexdigest()
    (step_dir / "MANIFEST.json").write_text(json.dumps(manifest))
    assert verify(step_dir, hashes=True) == []
    shard = step_dir / "actor" / "model" / "shard-0.safetensors"
    shard.write_bytes(b"\x07" * 4096)
    with pytest.raises(CheckpointError, match="shard-0.safetensors does not match its sha256"):
        manager.latest_valid(1, hashes=True)
    del manifest["files"][0]["sha256"]
    (step_dir / "MANIFEST.json").write_text(json.dumps(manifest))
    assert "has no checksum in the manifest" in verify(step_dir, hashes=True)[0]


def test_retention_never_deletes_the_only_loadable_checkpoint(tmp_path):
    """keep_last=1 with LATEST's step broken (truncated after its save): the newest step that
    verifies stays, because it is the one resume falls back to."""
    manager = saved_steps(tmp_path, keep_last=2, steps=(1, 2, 3))
    assert manager.steps() == [2, 3]
    manager.keep_last = 1
    shard = tmp_path / "step_3" / "actor" / "model" / "shard-0.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    assert manager.apply_retention() == []
    assert manager.steps() == [2, 3] and manager.latest_valid().step == 2
    manager.save(4, files_writer(4), meta={})       # a valid newer step: the fallback is no longer needed
    assert manager.steps() == [4]


def test_explicit_step_and_no_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoints in") as err:
        CheckpointManager(tmp_path / "none", 2).latest_valid()
    assert err.value.exit_code == 3
    manager = saved_steps(tmp_path, steps=(1, 2))
    assert manager.latest_valid(1) == (1, tmp_path / "step_1", None)
    with pytest.raises(CheckpointError, match=r"step 7 does not exist.*") as err:
        manager.latest_valid(7)
    assert err.value.hint == "steps there: 1, 2"
    (tmp_path / "step_1" / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match="step_1 is broken: trainer_state.json is missing"):
        manager.latest_valid(1)
    for step in (1, 2):
        (tmp_path / f"step_{step}" / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="no valid checkpoint in"):
        manager.latest_valid()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kill_minus_9_at_random_moments_never_breaks_latest(tmp_path):
    """SIGKILL a process that saves 3 MiB checkpoints in a loop, at random instants, 8 times: after
    cleaning, LATEST always names a checkpoint whose every hash verifies, and no step it reported
    as committed is lost."""
    rng = random.Random(7)
    committed, mid_save = 0, 0
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, str(HERE / "save_loop.py"), str(tmp_path)],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})
        first = proc.stdout.readline()             # at least one save per run: progress is made
        assert first.strip().isdigit(), first
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        committed = max([committed, int(first)] + [int(line) for line in out.split()])
        manager = CheckpointManager(tmp_path, keep_last=2, notify=lambda m: None)
        mid_save += len(manager.clean_leftovers())
        point = manager.latest_valid(hashes=True)
        assert point.warning is None and point.step >= committed
        assert state_step(point.path) == point.step
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
        for step in manager.steps():
            assert verify(manager.step_dir(step), hashes=True) == []
    assert committed >= 8 and mid_save >= 2   # some kills did land inside a save


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
