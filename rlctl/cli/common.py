"""Small helpers shared by the cli modules (stdlib + typer only)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlctl.errors import UsageError

FORMATS = ("text", "json")


def format_option(*choices: str, help: str):
    """`--format`, checked while the command line is parsed: a bad value stops before any work.

    The first choice is the default. Raising UsageError (not typer.BadParameter) keeps the
    one-line `error: ...` of every other known error.
    """
    def check(value: str) -> str:
        if value not in choices:
            raise UsageError(f"--format {value!r} is not one of {', '.join(choices)}",
                             hint=f"pass --format {choices[-1]} for scripts, or leave it out for {choices[0]}.")
        return value

    return typer.Option(choices[0], "--format", help=help, callback=check, autocompletion=lambda: list(choices))


def emit(data, fmt: str, *, text: str | None = None) -> None:
    """Print `data` as JSON (`--format json`) or `text` for people."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "json":
        typer.echo(json.dumps(data, indent=2, default=str))
    elif text is not None:
        typer.echo(text)


def refuse_overwrite(path: Path, force: bool) -> None:
    """Refuse to write into an existing non-empty folder or over a file unless --force."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} exists and is not a folder", hint="choose another path.")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UsageError(f"{path} is not empty", hint="pass --force to overwrite, or choose another path.")


def flag(*names: str, **kwargs):
    """An on/off option (`--force`), off by default. The empty metavar keeps typer's rich help from
    printing a `<bool>` type column beside it, which reads as if the flag took a value (`--force true`)."""
    return typer.Option(False, *names, metavar="", **kwargs)
