"""`rlctl config validate | show | schema`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer

from rlctl.cli.common import emit, flag, format_option
from rlctl.errors import UsageError

config_app = typer.Typer(help="Check, show and describe rlctl.toml.", no_args_is_help=True)

FILE_ARG = typer.Argument(None, help="Config file or project folder (default ./rlctl.toml).", show_default=False)
OVERRIDES_ARG = typer.Argument(None, help="Overrides as section.key=value, e.g. actor.lr=1e-6.",
                               show_default=False)


CONFIG_OPTION = typer.Option(None, "--config", "-c", help="The config file, as TRL and torchtune users pass it "
                                                          "(the same as giving it first).", show_default=False)


def with_config_option(config: Optional[str], file: Optional[str],
                       overrides: Optional[List[str]]) -> tuple[Optional[str], list[str]]:
    """`--config FILE` is the file; a first word given beside it must then be an override."""
    words = list(overrides or [])
    if config is None:
        return file, words
    if file is not None and "=" not in file:
        raise UsageError(f"two config files: --config {config} and {file}",
                         hint="pass one: rlctl train FILE key=value ..., or --config FILE key=value ...")
    return config, ([file] if file is not None else []) + words


def split_file_and_overrides(file: Optional[str], overrides: Optional[List[str]]) -> tuple[Path, list[str]]:
    """`rlctl config validate actor.lr=1` has no file: the first word is then an override."""
    from rlctl.config.loader import find_config

    words = list(overrides or [])
    if file is not None and "=" in file and not Path(file).exists():
        words.insert(0, file)
        file = None
    return find_config(file), words


def load_checked(file: Optional[str], overrides: Optional[List[str]], *, strict: bool = True):
    from rlctl.config.loader import load_config

    path, words = split_file_and_overrides(file, overrides)
    return load_config(path, words, strict=strict)


@config_app.command("validate")
def validate_cmd(
    file: Optional[str] = FILE_ARG,
    overrides: Optional[List[str]] = OVERRIDES_ARG,
    skip_machine: bool = flag("--skip-machine",
                              help="Check the config alone: not files, model, GPUs or packages."),
    fmt: str = format_option("text", "json", help="text or json."),
    config: Optional[str] = CONFIG_OPTION,
) -> None:
    """Report every problem in the config at once, then the batch plan. Exit 2 on any error (3 on bad data rows).

    Example: rlctl config validate rlctl.toml actor.lr=1e-6 rollout.n=8
    """
    from rlctl.data.image_checks import DATA_PROBLEM
    from rlctl.validate import validate

    loaded, from_run = run_as_model(load_checked(*with_config_option(config, file, overrides), strict=False))
    problems, plan = validate(loaded, machine=not skip_machine)   # resolves gpus_per_node = "auto"
    problems = list(problems) + from_run
    gpus, auto = plan.gpus_per_node, plan.gpus_per_node_resolved
    lines = loaded.lines
    source = os.path.relpath(loaded.path) if loaded.path else "overrides"
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity != "error"]
    render = [_with_line(p, lines).placed(source, lines) for p in errors]
    if fmt == "json":
        emit({"ok": not errors, "errors": render,
              "warnings": [_with_line(p, lines).placed(source, lines) for p in warnings],
              "batch_plan": dict(plan.rows()), "gpus_per_node": gpus, "gpus_per_node_resolved": auto}, fmt)
    else:
        _print_report(source, errors, warnings, plan.rows() + [("GPUs per node", f"{gpus} ({auto})" if auto else gpus)],
                      lines)
    if errors:   # 3 when every error is in the data itself (a bad image row), as `rlctl train` exits
        raise typer.Exit(3 if all(p.kind == DATA_PROBLEM for p in errors) else 2)


def run_as_model(loaded):
    """model.path = an rlctl run folder: the checks read the model training will start from (its
    merged checkpoint, or until that exists the model the run itself started from), and the
    run folder's own word about it joins the report. Returns (loaded, those problems)."""
    import dataclasses

    from rlctl.checkpoint.run_folder import CONFIG_FILE, model_of_run, named_run_folder
    from rlctl.config.loader import Problem, load_config
    from rlctl.errors import DataError

    folder = named_run_folder(loaded.config.model.path, loaded.base_dir)
    if folder is None:
        return loaded, []
    try:
        source = model_of_run(folder)
    except DataError as e:
        source, problems = None, [Problem("model.path", e.message.removeprefix("model.path ") + f"; {e.hint}")]
    else:
        problems = [Problem("model.path", source.note, severity="warning")] if source.note else []
    if source is not None and source.folder is not None:
        model = str(source.folder)
    elif (folder / CONFIG_FILE).is_file():   # the run's own starting model: same architecture and context
        model = load_config(folder / CONFIG_FILE, strict=False).config.model.path
    else:
        return loaded, problems
    config = dataclasses.replace(loaded.config, model=dataclasses.replace(loaded.config.model, path=model))
    return dataclasses.replace(loaded, config=config), problems


def _with_line(problem, lines):
    from dataclasses import replace

    if problem.line:
        return problem
    key = problem.key
    while key and key not in lines:   # a key the file does not set: its table's line
        key = key.rpartition(".")[0]
    return replace(problem, line=lines.get(key))


def _print_report(source, errors, warnings, rows, lines) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Problems quote user values and hints like `pip install "rlctl[vllm]"`: escape them, or rich
    # reads "[...]" as markup (drops it, or raises MarkupError on "[/x]").
    out, err = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    for p in errors:
        err.print(f"[red]error[/red]: {escape(_with_line(p, lines).placed(source, lines))}", highlight=False)
    for p in warnings:
        err.print(f"[yellow]warning[/yellow]: {escape(_with_line(p, lines).placed(source, lines))}", highlight=False)
    title = "batch plan (keys with errors counted at their defaults)" if errors else "batch plan"
    table = Table(title=title, show_header=False, title_justify="left")
    for name, value in rows:
        table.add_row(escape(name), escape(str(value)))
    out.print(table)
    if errors:
        err.print(f"{len(errors)} error(s), {len(warnings)} warning(s) in {source}", highlight=False, markup=False)
        return
    out.print(f"[green]ok[/green]: {escape(source)} is valid ({len(warnings)} warning(s))", highlight=False)


@config_app.command("show")
def show_cmd(
    file: Optional[str] = FILE_ARG,
    overrides: Optional[List[str]] = OVERRIDES_ARG,
    fmt: str = format_option("toml", "json", help="toml or json."),
) -> None:
    """Print the resolved config: your settings, overrides and every default.

    Example: rlctl config show rlctl.toml rollout.n=8 --format json
    """
    import tomlkit

    from rlctl.config.loader import config_to_dict

    resolved = config_to_dict(load_checked(file, overrides).config)
    if fmt == "json":
        typer.echo(json.dumps(resolved, indent=2))
    else:
        typer.echo(tomlkit.dumps(resolved), nl=False)


@config_app.command("schema")
def schema_cmd(out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to a file instead of stdout.")) -> None:
    """Print a JSON schema of rlctl.toml for editors (Even Better TOML / taplo: `#:schema`).

    Example: rlctl config schema --out rlctl.schema.json
    """
    from rlctl.config.jsonschema import config_json_schema

    text = json.dumps(config_json_schema(), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        from rlctl.utils.atomic_files import write_files

        write_files(out.parent, {out.name: text.encode("utf-8")}, hint="pass --out a file you can write to.")
        typer.echo(f"wrote {out}")


@config_app.command("from-verl", context_settings={"ignore_unknown_options": True})
def from_verl_cmd(
    words: List[str] = typer.Argument(..., metavar="SCRIPT_OR_OVERRIDES...",
                                      help="A verl launch script (then its arguments, as $@ passes them) or verl's "
                                           "key=value overrides."),
    out: Path = typer.Option(Path("rlctl.toml"), "--out", "-o", help="The rlctl.toml to write."),
    model: str = typer.Option(None, "--model", metavar="ID_OR_PATH",
                              help="model.path in place of the script's (a local folder offline)."),
    force: bool = flag("--force", help="Overwrite --out if it exists."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Turn a verl launch (main_ppo, a recipe's main, or torchrun of its SFT trainer) into an rlctl.toml.

    Every override becomes rlctl's key, verl's defaults that differ from rlctl's are written when the
    script relied on them, and each key rlctl does not honour is listed with the reason (in the file
    and on stdout). docs/verl.md has the key table.

    Example: rlctl config from-verl examples/grpo_trainer/run_qwen2-7b.sh --model models/smollm2

    Example: rlctl config from-verl data.train_batch_size=256 actor_rollout_ref.actor.optim.lr=1e-6 --out grpo.toml

    Example: rlctl config from-verl examples/sft/gsm8k/run_qwen_05_sp2.sh 8 ckpt --out sft.toml   (an SFT launch)
    """
    from rlctl.config.from_verl import convert_launch

    text, typed, conversion = convert_launch(list(words), known_algorithms(), model)
    if out.exists() and not force:
        raise UsageError(f"{out} already exists", hint="pass --force to overwrite it, or --out another file.")
    from rlctl.utils.atomic_files import write_files

    write_files(out.parent if str(out.parent) else Path("."), {out.name: text.encode("utf-8")},
                hint="pass --out a file you can write to.")
    report = {"out": str(out), "keys": len(typed), "not_honoured": [
        {"key": k, "value": v, "why": why} for k, v, why in conversion.not_honoured]}
    emit(report, fmt)
    if fmt == "text":
        _print_not_honoured(report)


def known_algorithms():
    """rlctl's registered estimators and losses, for from-verl (the config layer does not import them)."""
    from rlctl.algorithms import estimator_names, get_estimator, policy_loss_names
    from rlctl.config.from_verl import KnownAlgorithms

    return KnownAlgorithms(estimators=estimator_names(), losses=policy_loss_names(),
                           grouped=frozenset(n for n in estimator_names() if get_estimator(n).needs_group))


def _print_not_honoured(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"wrote {report['out']} ({report['keys']} keys)", markup=False)
    if report["not_honoured"]:
        table = Table(title="verl keys rlctl does not honour")
        for column in ("key", "value", "why"):
            table.add_column(column)
        for row in report["not_honoured"]:
            table.add_row(row["key"], str(row["value"]), row["why"])
        console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
