"""Text from users, configs and hints prints as written: rich never reads "[...]" in it as markup."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlctl.cli.main import main
from rlctl.recipes import Recipe


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    proj = tmp_path_factory.mktemp("proj")
    assert main(["init", str(proj), "--recipe", "grpo-gsm8k"]) == 0
    return proj


def test_a_closing_tag_in_an_override_is_an_error_not_a_crash(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    assert main(["config", "validate", "--skip-machine", "algorithm.name=[/x]"]) == 2
    err = capsys.readouterr().err
    assert "'[/x]' is not a registered name" in err and "Traceback" not in err


def test_section_names_in_problems_survive(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    assert main(["config", "validate", "--skip-machine", "algorithm.name=gae"]) == 2
    assert "add a [critic] section" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_install_hints_keep_their_extras(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    assert main(["config", "validate", "rollout.engine=vllm", "resources.gpus_per_node=1"]) == 2
    assert 'pip install "rlctl[vllm]"' in capsys.readouterr().err


def test_doctor_prints_hints_and_problems_as_written(capsys, monkeypatch):
    report = {"rlctl": "0", "python": "3", "platform": "linux[x]", "core": {"torch": "2.13.0", "ray": None},
              "optional": {"vllm": {"installed": False, "version": None, "how": 'pip install "rlctl[vllm]"'}},
              "devices": {"cpus": 2, "cuda": False, "gpus": []}, "ray": {"address": "[/x]", "ray_cli": True},
              "hub": {"state": "offline-mode", "summary": "offline [mode]", "offline": True, "cache": "~"},
              "problems": ["torch failed to import: [/bad] tag"]}
    monkeypatch.setattr("rlctl.doctor.collect", lambda: report)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert 'pip install "rlctl[vllm]"' in out and "linux[x]" in out and "ray: [/x]" in out
    assert "problem: torch failed to import: [/bad] tag" in out and "hugging face hub: offline [mode]" in out


def test_recipe_descriptions_print_as_written(capsys, monkeypatch):
    recipe = Recipe(name="my[1]", path=Path("x.toml"), description="needs a [critic] section", paper="",
                    data_command="", algorithm="gae")
    monkeypatch.setattr("rlctl.recipes.list_recipes", lambda: [recipe])
    assert main(["recipes", "list"]) == 0
    out = capsys.readouterr().out
    assert "my[1]" in out and "needs a [critic] section" in out
