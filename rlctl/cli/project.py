"""`rlctl recipes list|show`, `rlctl init` and `rlctl doctor`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlctl.cli.common import emit, flag, format_option

recipes_app = typer.Typer(help="The built-in recipes (PPO, GRPO, DAPO, RLOO, ReMax, REINFORCE++, SFT).",
                          no_args_is_help=True)

PROJECT_FILES = ("rlctl.toml", "reward.py", "README.md", ".gitignore", "rlctl.schema.json")


@recipes_app.command("list")
def recipes_list(fmt: str = format_option("text", "json", help="text or json.")) -> None:
    """List the built-in recipes.

    Example: rlctl recipes list --format json
    """
    from rlctl.recipes import list_recipes

    recipes = list_recipes()
    rows = [{"name": r.name, "algorithm": r.algorithm, "description": r.description, "paper": r.paper}
            for r in recipes]
    if fmt == "json":
        return emit(rows, fmt)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table("recipe", "algorithm", "description")
    for r in rows:  # cells are rich markup: a "[...]" in a description must print as written
        table.add_row(escape(r["name"]), escape(r["algorithm"]), escape(r["description"]))
    Console().print(table)


@recipes_app.command("show")
def recipes_show(name: str = typer.Argument(..., help="Recipe name, e.g. grpo-gsm8k."),
                 fmt: str = format_option("toml", "json", help="toml (commented file) or json.")) -> None:
    """Print a recipe's commented TOML.

    Example: rlctl recipes show grpo-gsm8k
    """
    from rlctl.recipes import get_recipe

    recipe = get_recipe(name)
    if fmt == "json":
        import tomlkit

        return emit({"name": recipe.name, "algorithm": recipe.algorithm, "description": recipe.description,
                     "paper": recipe.paper, "data_command": recipe.data_command,
                     "config": tomlkit.parse(recipe.text()).unwrap()}, fmt)
    typer.echo(recipe.text(), nl=False)


def init(
    directory: Path = typer.Argument(Path("."), help="Project folder (created if missing)."),
    recipe: str = typer.Option(..., "--recipe", "-r", help="Recipe name (see `rlctl recipes list`)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Hub id or local model folder."),
    force: bool = flag("--force", help="Overwrite existing project files."),
) -> None:
    """Create a runnable project: rlctl.toml, reward.py, README.md, .gitignore, rlctl.schema.json.

    Example: rlctl init myproj --recipe grpo-gsm8k --model Qwen/Qwen2.5-0.5B-Instruct
    """
    from rlctl.errors import UsageError
    from rlctl.project import write_project

    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} exists and is not a folder", hint="choose another project folder.")
    existing = [f for f in PROJECT_FILES if (directory / f).exists()]
    if existing and not force:
        raise UsageError(f"{directory} already has {', '.join(existing)}",
                         hint="pass --force to overwrite them, or choose another folder.")
    written = write_project(directory, recipe, model)
    typer.echo(f"created {directory}/ from recipe {recipe}: {', '.join(written)}")
    _warn_if_model_unavailable(directory, recipe if model is None else "")
    typer.echo(f"next: cd {directory} and follow README.md (data prep, config validate, train)")


def _warn_if_model_unavailable(directory: Path, recipe: str) -> None:
    """A project may be written offline for a machine with the hub, so a model that cannot be found
    here is a warning, not an error; `config validate` and `train` stop on it. When the recipe's own
    model.path is missing and its comments say how to make it (`recipe`: its name), that command is
    the hint."""
    import tomlkit

    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model
    from rlctl.recipes import get_recipe, model_command

    path = str(tomlkit.parse((directory / "rlctl.toml").read_text()).get("model", {}).get("path", ""))
    try:
        source = resolve_model(path, directory)
    except DataError as e:
        command = model_command(get_recipe(recipe).text(), path) if recipe else ""
        hint = f"make it with `{command}` inside {directory}/" if command else e.hint
        typer.echo(f"warning: {e.message}; training here needs it: {hint}", err=True)
        return
    if source.note:
        typer.echo(f"note: {source.note}", err=True)


def doctor(fmt: str = format_option("text", "json", help="text or json.")) -> None:
    """Check versions, devices, Ray and optional backends; say what is missing and how to get it.

    Example: rlctl doctor --format json
    """
    from rlctl.doctor import collect, render

    report = collect()
    if fmt == "json":
        return emit(report, fmt)
    render(report)


def register(app: typer.Typer) -> None:
    app.add_typer(recipes_app, name="recipes")
    app.command("init")(init)
    app.command("doctor")(doctor)

