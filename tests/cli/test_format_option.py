"""Every --format is checked while parsing: an unknown value is exit 2 before any work is done."""

from __future__ import annotations

import typer

from rlctl.cli.main import app, main


def commands_with_format() -> list[list[str]]:
    """["data", "prep"], ... for every command that has a --format option."""
    def walk(cmd, path):
        if "--format" in {opt for p in getattr(cmd, "params", []) for opt in getattr(p, "opts", [])}:
            yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, path + [name])

    return list(walk(typer.main.get_command(app), []))


# Required arguments, so that --format is the only thing wrong on each command line.
ARGS = {"recipes show": ["grpo-gsm8k"], "data prep": ["arith"], "data inspect": ["x.parquet"],
        "model tiny": ["m"], "merge": ["run", "--to-hf", "hf"], "eval": ["model", "--data", "d.parquet"]}


def test_unknown_format_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = commands_with_format()
    assert len(commands) >= 10 and ["doctor"] in commands and ["recipes", "list"] in commands
    for path in commands:
        code = main([*path, *ARGS.get(" ".join(path), []), "--format", "yaml"])
        err = capsys.readouterr().err
        assert code == 2, f"rlctl {' '.join(path)} --format yaml exited {code}"
        assert err.count("\n") == 1 and "--format 'yaml' is not one of" in err and "json" in err, err
    assert list(tmp_path.iterdir()) == []  # data prep and model tiny wrote nothing


def test_known_formats_still_work(capsys):
    assert main(["recipes", "show", "grpo-gsm8k", "--format", "toml"]) == 0
    assert "[algorithm]" in capsys.readouterr().out
    assert main(["recipes", "list", "--format", "json"]) == 0
    assert capsys.readouterr().out.lstrip().startswith("[")
