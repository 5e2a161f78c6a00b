"""Write a project folder from a recipe and the templates (`rlctl init`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl.recipes import bundled_dir, get_recipe
from rlctl.utils.fs import atomic_write_text

SCHEMA_FILE = "rlctl.schema.json"


def render_config(recipe_text: str, model: str | None) -> str:
    """The recipe with `model.path` replaced (comments kept) and a `#:schema` line for editors."""
    import tomlkit

    doc = tomlkit.parse(recipe_text)
    if model is not None:
        doc["model"]["path"] = model
    return f"#:schema ./{SCHEMA_FILE}\n" + tomlkit.dumps(doc)


def write_project(directory: Path, recipe_name: str, model: str | None) -> list[str]:
    """Write every project file (each atomically); returns the names written, in order."""
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
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        atomic_write_text(directory / name, text)
    return list(files)


def _model_for_project(model: str, directory: Path) -> str:
    """Paths in rlctl.toml are relative to the file: re-express a local folder given from the cwd."""
    p = Path(model).expanduser()
    if not p.exists():
        return model  # a hub id
    return os.path.relpath(p.resolve(), directory.resolve())


def _run_name(recipe_text: str) -> str:
    import tomlkit

    return str(tomlkit.parse(recipe_text).get("run", {}).get("name", "run"))
