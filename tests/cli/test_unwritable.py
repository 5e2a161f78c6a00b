"""An output path that cannot be written is a usage error: one line naming the path, exit 2, no
traceback, for every command that writes where the user says (run.output_dir, merge --to-hf,
model tiny, status --plot, view --html; merge's is in tests/checkpoint/test_merge_errors.py).

Tests run as root, where chmod 0555 stops nothing. Two destinations that fail as root too: a path
below a regular file (ENOTDIR), and /sys, where root may not create files (EPERM / EACCES); the slow
test adds a real read-only mount (EROFS) in a user namespace.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlctl.checkpoint.run_folder import start_run
from rlctl.controller.metrics_log import MetricsLogger
from rlctl.project import write_project
from rlctl.tasks.prep import PrepOptions, prepare
from support.cli import rlctl_here


def assert_refused(result, path) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {path}"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr


@pytest.fixture
def below_a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file"


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    start_run(run, name="r", total_steps=4)
    with MetricsLogger(run, ["jsonl"], "r", {"run": {"name": "r"}}) as logger:
        for step in (1, 2):
            logger.log(step, {"reward/mean": 0.1 * step, "response_length/mean": 5.0, "actor/kl": 0.0,
                              "actor/entropy": 1.0, "actor/pg_loss": 0.0})
    return run


def test_status_plot(run, below_a_file):
    assert_refused(rlctl_here("status", run, "--plot", below_a_file / "c.png"), below_a_file)
    assert_refused(rlctl_here("status", run, "--plot", "/sys/rlctl-test.png"), "/sys/rlctl-test.png")


def test_view_html(run):
    assert_refused(rlctl_here("view", run, "--html", "/sys/rlctl-test.html"), "into /sys")


@pytest.mark.parametrize("where", ["file", "sys"])
def test_model_tiny(where, below_a_file):
    out = below_a_file / "m" if where == "file" else "/sys/rlctl-test-model"
    assert_refused(rlctl_here("model", "tiny", out), out)


def test_train_output_dir(tmp_path, below_a_file, tiny_model_dir):
    write_project(tmp_path / "p", "grpo-gsm8k", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=tmp_path / "p" / "data" / "arith"))
    result = rlctl_here("train", f"run.output_dir={below_a_file}/runs", "data.val_files=[]",
                        'data.train_files=["data/arith/train.parquet"]', "reward.function=arith",
                        "resources.gpus_per_node=0", cwd=tmp_path / "p")
    assert_refused(result, below_a_file)


@pytest.mark.slow
def test_a_read_only_mount(tmp_path):
    """EROFS for real: the folder bind-mounted read-only in a user namespace (root inside it)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    script = f"mount --bind -o ro {ro} {ro} && exec {sys.executable} -m rlctl model tiny {ro}/m"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount --bind -o ro {ro} {ro}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces with mounts here: {probe.stderr.decode().strip()}")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    assert_refused(result, f"{ro}/m")
    assert "read-only file system" in result.stderr
    assert not any(ro.iterdir())
