"""`rlctl init` and `rlctl recipes`: runnable projects, never overwriting, wheel-shipped recipes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit
from support.cli import rlctl_here

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.toml"))


def rlctl(*args, cwd=None):
    """`rlctl ARGS` in this process: what these tests check is what the command prints and returns."""
    return rlctl_here(*args, cwd=cwd)


def installed_rlctl(*args, cwd, env):
    """`rlctl ARGS` in a fresh interpreter whose rlctl is the one `env`'s PYTHONPATH points at."""
    return subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **env}, timeout=300)


def test_recipes_cover_the_six_algorithms():
    out = rlctl("recipes", "list", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {r["name"] for r in rows} >= {"ppo-gsm8k", "grpo-gsm8k", "dapo-gsm8k", "rloo-gsm8k", "remax-gsm8k",
                                         "reinforce-pp-gsm8k"}
    algos = {r["algorithm"] for r in rows}
    assert algos >= {"gae", "grpo", "rloo", "remax", "reinforce_plus_plus"}
    assert all(r["description"] and r["paper"] for r in rows)


def test_recipe_show_prints_commented_toml():
    out = rlctl("recipes", "show", "dapo-gsm8k")
    assert out.returncode == 0
    assert "clip_ratio_high = 0.28" in out.stdout and "# recipe:" in out.stdout
    doc = tomlkit.parse(out.stdout).unwrap()
    assert doc["algorithm"]["dynamic_sampling"]["enable"] is True
    assert doc["actor"]["use_kl_loss"] is False and doc["actor"]["loss_agg_mode"] == "token-mean"


def test_unknown_recipe_suggests(tmp_path):
    out = rlctl("init", tmp_path / "p", "--recipe", "grpo-gms8k")
    assert out.returncode == 2
    assert "did you mean 'grpo-gsm8k'" in out.stderr
    assert not (tmp_path / "p").exists()


def test_init_writes_project_and_refuses_overwrite(tmp_path, tiny_model_dir):
    proj = tmp_path / "proj"
    out = rlctl("init", proj, "--recipe", "grpo-gsm8k", "--model", tiny_model_dir)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in proj.iterdir())
    assert names == [".gitignore", "README.md", "reward.py", "rlctl.schema.json", "rlctl.toml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]  # nothing outside DIR
    text = (proj / "rlctl.toml").read_text()
    assert text.startswith("#:schema ./rlctl.schema.json\n")
    assert "# GRPO puts KL in the loss" in text  # recipe comments survive
    cfg = tomlkit.parse(text).unwrap()
    assert (proj / cfg["model"]["path"]).resolve() == Path(tiny_model_dir).resolve()
    assert cfg["reward"]["function"] == "reward.py:compute_score"
    assert "rlctl data prep gsm8k" in (proj / "README.md").read_text()
    json.loads((proj / "rlctl.schema.json").read_text())

    (proj / "reward.py").write_text("# my edits\n")
    again = rlctl("init", proj, "--recipe", "ppo-gsm8k")
    assert again.returncode == 2 and "--force" in again.stderr
    assert (proj / "reward.py").read_text() == "# my edits\n"
    forced = rlctl("init", proj, "--recipe", "ppo-gsm8k", "--force")
    assert forced.returncode == 0 and "gae" in (proj / "rlctl.toml").read_text()


def test_every_recipes_data_line_is_commands_the_readme_can_show():
    """init's README shows a recipe's `# data:` line in a bash block as the command to run: prose there
    (a note in parentheses) would be a broken command; notes go on the header's later lines."""
    from rlctl.recipes import list_recipes

    for recipe in list_recipes():
        for command in recipe.data_command.split("&&"):
            words = shlex.split(command)
            assert words[:3] == ["rlctl", "data", "prep"] and not any(w.startswith("(") for w in words), \
                f"{recipe.name}: {recipe.data_command}"


def test_init_hints_the_command_that_makes_the_recipes_own_model(tmp_path, monkeypatch):
    """A recipe whose model.path is a folder its comments tell how to make: init's warning gives that
    command, with the arguments it needs; a hub id keeps the generic hint."""
    from rlctl.recipes import model_command

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for recipe, command in (("grpo-arith-moe-ep2-cpu", "rlctl model tiny models/tiny-moe --arch qwen3_moe"),
                            ("grpo-shapes-cpu", "rlctl model tiny models/tiny-vl --arch qwen2_5_vl"),
                            ("grpo-arith-smollm2-cpu", "rlctl model get smollm2-135m-instruct models/smollm2"),
                            ("sft-calc-tools-cpu", "rlctl model tiny models/tiny")):
        out = rlctl("init", tmp_path / recipe, "--recipe", recipe)
        assert out.returncode == 0, out.stderr
        warning = out.stderr.strip()
        assert warning.count("\n") == 0 and f"make it with `{command}` inside" in warning, warning
    hub = rlctl("init", tmp_path / "hub", "--recipe", "grpo-gsm8k")
    assert "rlctl model tiny models/tiny` (add `--arch" in hub.stderr   # the generic hint
    assert model_command("# `rlctl model tiny models/tiny-moe --arch qwen3_moe`", "models/tiny") == ""


def test_init_into_a_file_is_refused(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    out = rlctl("init", f, "--recipe", "grpo-gsm8k")
    assert out.returncode == 2 and f.read_text() == "x"


def test_init_into_an_unwritable_place_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    places = [(afile / "p", "Not a directory")] + ([(Path("/proc/rlctl-p"), "")] if Path("/proc").is_dir() else [])
    for place, reason in places:
        out = rlctl("init", place, "--recipe", "grpo-gsm8k")
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and f"cannot create folder {place}" in out.stderr and reason in out.stderr


def test_init_force_over_a_folder_in_the_way_writes_nothing(tmp_path):
    proj = tmp_path / "proj"
    (proj / "README.md").mkdir(parents=True)
    (proj / "reward.py").write_text("# mine\n")
    out = rlctl("init", proj, "--recipe", "grpo-gsm8k", "--force")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"cannot write {proj / 'README.md'}" in out.stderr
    assert sorted(p.name for p in proj.iterdir()) == ["README.md", "reward.py"]
    assert (proj / "reward.py").read_text() == "# mine\n"


def test_config_schema_out_unwritable(tmp_path):
    (tmp_path / "afile").write_text("x")
    out = rlctl("config", "schema", "--out", tmp_path / "afile" / "s.json")
    assert out.returncode == 2 and "cannot write into" in out.stderr and out.stderr.count("\n") == 1


def test_config_show_and_schema(tmp_path):
    proj = tmp_path / "proj"
    assert rlctl("init", proj, "--recipe", "rloo-gsm8k").returncode == 0
    shown = rlctl("config", "show", "--format", "json", "rollout.n=6", cwd=proj)
    assert shown.returncode == 0, shown.stderr
    resolved = json.loads(shown.stdout)
    assert resolved["rollout"]["n"] == 6 and resolved["algorithm"]["name"] == "rloo"
    assert resolved["actor"]["clip_ratio_c"] == 3.0  # a default the recipe does not set
    toml_out = rlctl("config", "show", cwd=proj)
    assert tomlkit.parse(toml_out.stdout).unwrap() == {**resolved, "rollout": {**resolved["rollout"], "n": 4}}
    schema = json.loads(rlctl("config", "schema").stdout)
    assert schema["properties"]["actor"]["properties"]["loss_agg_mode"]["enum"][0] == "token-mean"
    assert schema["properties"]["model"]["properties"]["lora"]["properties"]["rank"]["minimum"] == 0
    assert schema["properties"]["actor"]["additionalProperties"] is False


@pytest.mark.slow
def test_non_editable_wheel_lists_recipes_and_inits(tmp_path):
    """A wheel installed elsewhere (not this checkout) carries recipes/ and templates/."""
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(ROOT), "-w", str(wheels)], capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    target = tmp_path / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           *map(str, wheels.glob("*.whl"))], capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr
    env = {"PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import rlctl; print(rlctl.__file__)"], capture_output=True,
                           text=True, env={**os.environ, **env}, cwd=tmp_path)
    assert where.stdout.startswith(str(target)), where.stdout
    listed = installed_rlctl("recipes", "list", "--format", "json", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == len(RECIPES)
    made = installed_rlctl("init", tmp_path / "p", "--recipe", "dapo-gsm8k", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "p" / "reward.py").is_file()
