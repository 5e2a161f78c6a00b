"""Write a project folder from a recipe and the templates (`rlctl init`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl.utils.atomic_files import write_files
from rlctl.recipes import bundled_dir, get_recipe

SCHEMA_FILE = "rlctl.schema.json"


def render_config(recipe_text: str, model: str | None) -> str:
    """The recipe with `model.path` replaced (comments kept) and a `#:schema` line for editors."""
    import tomlkit

    doc = tomlkit.parse(recipe_text)
    if model is not None:
        doc["model"]["path"] = model
    return f"#:schema ./{SCHEMA_FILE}\n" + tomlkit.dumps(doc)


def write_project(directory: Path, recipe_name: str, model: str | None) -> list[str]:
    """Write every project file (all or none); returns the names written, in order."""
    from rlctl.config.jsonschema import config_json_schema

    recipe = get_recipe(recipe_name)
    templates = bundled_dir("templates")
    if model is not None:
        model = _model_for_project(model, directory)
    run_name = _run_name(recipe.text())
    readme = (templates / "README.md").read_text(encoding="utf-8")
    for token, value in (("{name}", directory.resolve().name), ("{recipe}", recipe.name),
                         ("{description}", recipe.description), ("{run_name}", run_name),
                         ("{data_command}", recipe.data_command or "rlctl data prep ...")):
        readme = readme.replace(token, value)
    files = {
        "rlctl.toml": render_config(recipe.text(), model),
        "reward.py": (templates / "reward.py").read_text(encoding="utf-8"),
        "README.md": readme,
        ".gitignore": (templates / "gitignore").read_text(encoding="utf-8"),
        SCHEMA_FILE: json.dumps(config_json_schema(), indent=2) + "\n",
        **agent_files(recipe.text()),
    }
    write_files(directory, {name: text.encode("utf-8") for name, text in files.items()},
                hint="choose a project folder you can write to.")
    return list(files)


def _model_for_project(model: str, directory: Path) -> str:
    """Paths in rlctl.toml are relative to the file: re-express a relative local folder given from
    the cwd; an absolute one stays absolute."""
    p = Path(model).expanduser()
    if not p.exists():
        return model  # a hub id
    if p.is_absolute():   # kept as written: still right when the project is opened through another path
        return str(p)
    return os.path.relpath(p.resolve(), directory.resolve())


def _run_name(recipe_text: str) -> str:
    import tomlkit

    return str(tomlkit.parse(recipe_text).get("run", {}).get("name", "run"))


def agent_files(recipe_text: str) -> dict[str, str]:
    """The agent program a recipe's [rollout.agent] function names, when rlctl ships it (examples/agents/)."""
    import tomllib

    spec = tomllib.loads(recipe_text).get("rollout", {}).get("agent", {}).get("function", "")
    name = spec.rpartition(":")[0]
    path = bundled_dir("agents") / name if name and "/" not in name else None
    return {name: path.read_text(encoding="utf-8")} if path is not None and path.is_file() else {}

