"""Offline and on CPU, every error is one line, through the real `rlctl` in subprocesses.

"Unreachable" is real here: HF_ENDPOINT points at a closed port on 127.0.0.1, HF_HUB_OFFLINE is
unset, and HF_HOME is an empty folder, so nothing is cached and nothing answers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"
NOT_FOUND = "neither a local folder nor in the Hugging Face cache"
SMALL = ["data.batch_size=4", "actor.mini_batch_size=4", "actor.micro_batch_size=4"]  # 24 rows of data: the recipe's 64 would be an error too


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rlctl(*args, cwd, hf_home, offline: bool, timeout: int = 600):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", COLUMNS="200")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=timeout)
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def project(tmp_path_factory, gsm8k_dir) -> Path:
    """grpo-gsm8k as `rlctl init` writes it (model.path is the hub id), with 24 GSM8K rows."""
    proj = tmp_path_factory.mktemp("offline") / "proj"
    home = proj.parent / "hf_home"
    init, _ = rlctl("init", proj, "--recipe", "grpo-gsm8k", cwd=proj.parent, hf_home=home, offline=True)
    assert init.returncode == 0, init.stderr
    # Writing a project offline is fine (it may be meant for another machine): one warning line.
    assert init.stderr.count("\n") == 1 and "warning:" in init.stderr and NOT_FOUND in init.stderr
    prep, _ = rlctl("data", "prep", "gsm8k", "--source", gsm8k_dir, "--limit", "24", cwd=proj, hf_home=home,
                    offline=True)
    assert prep.returncode == 0, prep.stderr
    return proj


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "hub-unreachable"])
def test_train_with_an_uncached_hub_id_is_one_line_fast_and_leaves_no_run_folder(project, offline):
    train, seconds = rlctl("train", *SMALL, cwd=project, hf_home=project.parent / "hf_home", offline=offline)
    assert train.returncode == 2, train.stderr[-2000:]
    line = one_error_line(train.stderr)
    assert NOT_FOUND in line and HUB_ID in line and "rlctl model tiny models/tiny" in line
    assert ("HF_HUB_OFFLINE is set" if offline else "unreachable") in line
    assert not (project / "runs").exists()
    assert seconds < 40  # process start + imports on a busy 2-core machine; no 50 s of retries


def test_validate_reports_an_uncached_hub_id(project):
    check, _ = rlctl("config", "validate", *SMALL, "--format", "json", cwd=project, hf_home=project.parent / "hf_home",
                     offline=False)
    assert check.returncode == 2
    report = json.loads(check.stdout)
    assert any("model.path" in e and NOT_FOUND in e and "unreachable" in e for e in report["errors"]), report


def test_data_inspect_with_an_uncached_hub_id_is_one_line(project):
    inspect, _ = rlctl("data", "inspect", "data/gsm8k/train.parquet", "--model", HUB_ID, cwd=project,
                       hf_home=project.parent / "hf_home", offline=True)
    assert inspect.returncode == 3
    assert NOT_FOUND in one_error_line(inspect.stderr)


def test_doctor_probes_the_hub(project):
    unreachable, _ = rlctl("doctor", "--format", "json", cwd=project, hf_home=project.parent / "hf_home",
                           offline=False)
    hub = json.loads(unreachable.stdout)["hub"]
    assert hub["state"] == "unreachable" and hub["endpoint"].startswith("http://127.0.0.1:")
    text, _ = rlctl("doctor", cwd=project, hf_home=project.parent / "hf_home", offline=False)
    assert "hugging face hub: unreachable (http://127.0.0.1:" in text.stdout


@pytest.mark.slow
def test_a_cached_hub_id_trains_with_the_hub_unreachable_and_gpus_auto(project, tiny_model_dir, tmp_path):
    """The hub id is in the cache; the hub does not answer; resources.gpus_per_node = "auto" (the
    recipe's) on this CPU machine: validate and a one-step train just work, offline, on CPU."""
    home = tmp_path / "hf_home"
    snapshot = home / "hub" / "models--someone--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_model_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    assert tomllib.loads((project / "rlctl.toml").read_text())["resources"]["gpus_per_node"] == "auto"
    args = ["model.path=someone/tiny", "data.batch_size=2", "rollout.n=2", "actor.mini_batch_size=2",
            "actor.micro_batch_size=4", "data.max_response_length=8", "run.total_steps=1", "data.val_files=[]",
            "model.gradient_checkpointing=false", "run.name=cached"]
    check, _ = rlctl("config", "validate", *args, cwd=project, hf_home=home, offline=False)
    assert check.returncode == 0, check.stderr
    assert "0 (auto: no GPU visible, CPU)" in check.stdout and "unreachable" in check.stderr
    train, _ = rlctl("train", *args, cwd=project, hf_home=home, offline=False)
    assert train.returncode == 0, train.stderr[-3000:]
    run = project / "runs" / "cached"
    resolved = tomllib.loads((run / "config.resolved.toml").read_text())
    assert resolved["resources"]["gpus_per_node"] == 0 and resolved["model"]["path"] == "someone/tiny"
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
