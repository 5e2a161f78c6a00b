"""scripts/verl_report.py over a verl-like tree (tests/fixtures/verl scripts laid out as verl's
examples/ folders): per-script status and the totals, from a work tree and from a bare git dir."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "verl"
LAYOUT = {"grpo_trainer/run_qwen_gsm8k_grpo.sh": "run_qwen_gsm8k_grpo.sh",
          "sft/gsm8k/sft_torchrun_gsm8k.sh": "sft_torchrun_gsm8k.sh",     # usage line: given `8 checkpoints/...`
          "cispo_trainer/cispo_rollout_corr.sh": "cispo_rollout_corr.sh",
          "tools/merge_checkpoint.sh": "merge_checkpoint.sh",
          "generation/skipped.sh": "merge_checkpoint.sh"}                 # a left-out folder


def _tree(root: Path) -> Path:
    for dest, name in LAYOUT.items():
        (root / "examples" / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / name, root / "examples" / dest)
    return root


def _report(verl: Path, monkeypatch) -> dict:
    spec = importlib.util.spec_from_file_location("verl_report", REPO / "scripts" / "verl_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["verl_report.py", "--verl", str(verl), "--format", "json"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert module.main() == 0
    return json.loads(out.getvalue())


def _check(report: dict) -> None:
    status = {row["script"]: row["status"] for row in report["scripts"]}
    assert status == {"examples/cispo_trainer/cispo_rollout_corr.sh": "validates",
                      "examples/grpo_trainer/run_qwen_gsm8k_grpo.sh": "validates",
                      "examples/sft/gsm8k/sft_torchrun_gsm8k.sh": "validates",
                      "examples/tools/merge_checkpoint.sh": "not a trainer"}
    totals = report["totals"]
    assert (totals["training_scripts"], totals["converted"], totals["validates"], totals["not_a_trainer"]) == (3, 3, 3, 1)


def test_report_over_a_work_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _check(_report(_tree(tmp_path / "verl"), monkeypatch))


@pytest.mark.slow
def test_report_over_a_bare_git_dir(tmp_path, monkeypatch):
    """What the `fetch` tool gives: no work tree, read with git ls-tree / git show."""
    monkeypatch.setenv("HOME", str(tmp_path))
    work = _tree(tmp_path / "work")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "examples"]):
        subprocess.run([*git, *args], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(tmp_path / "bare")], check=True)
    report = _report(tmp_path / "bare", monkeypatch)
    _check(report)
    assert len(report["totals"]["verl_commit"]) >= 7
