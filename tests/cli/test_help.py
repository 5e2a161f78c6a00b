"""Every command's --help works and imports none of the heavy libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.cli import rlctl_here

HEAVY = ("torch", "ray", "transformers", "peft", "vllm", "sglang")

PROBE = r"""
import json, sys, io, contextlib
import typer
from rlctl.cli.main import app

def walk(cmd, path):
    yield path
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from walk(sub, path + [name])

results = {}
for path in walk(typer.main.get_command(app), []):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            app(args=path + ["--help"], prog_name="rlctl")
        except SystemExit as e:
            code = e.code
    results[" ".join(path) or "(root)"] = {"code": code, "usage": "Usage:" in out.getvalue(),
                                            "example": "Example" in out.getvalue()}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"results": results, "heavy": heavy}))
""" % (HEAVY,)


@pytest.mark.slow   # a fresh interpreter: what --help imports is the point
def test_every_help_is_light_and_has_usage():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["heavy"] == [], f"--help imported {report['heavy']}"
    assert len(report["results"]) >= 10
    for name, r in report["results"].items():
        assert r["code"] == 0 and r["usage"], name
        # Leaf commands (not groups) show an example (STYLE.md "CLI").
        if name not in ("(root)",) and not any(k.startswith(name + " ") for k in report["results"]):
            assert r["example"], f"`rlctl {name} --help` has no example"


def test_version_and_no_args():
    from rlctl import __version__

    out = rlctl_here("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rlctl {__version__}"
    bare = rlctl_here()
    assert "Usage" in bare.stdout + bare.stderr
    assert bare.returncode in (0, 2)


def test_unknown_command_is_usage_error():
    out = rlctl_here("trian")
    assert out.returncode == 2


# Options typer itself adds (help and shell completion): their `<bool>` column is typer's own rendering.
TYPER_FLAGS = ("--help", "--install-completion", "--show-completion")


def test_flags_show_no_value_type():
    """`--version`, `--force` and every other on/off option read as plain flags in --help: a `<bool>`
    column beside them would say they take a value (`--force true`)."""
    import typer

    from rlctl.cli.main import app

    root = rlctl_here("--help")
    version_line = next(line for line in root.stdout.splitlines() if "--version" in line)
    assert "<bool>" not in version_line and "Print the version" in version_line

    def walk(cmd, path):
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, path + [name])

    for path in walk(typer.main.get_command(app), []):
        out = rlctl_here(*path, "--help")
        for line in out.stdout.splitlines():
            if "<bool>" in line:
                assert any(f in line for f in TYPER_FLAGS), f"`rlctl {' '.join(path)} --help`: {line.strip()}"


@pytest.mark.slow   # a real interpreter writing into a real pipe
@pytest.mark.parametrize("args", [["train", "-h"], ["--help"], ["--version"], ["config", "validate", "--help"]])
def test_help_into_a_closed_pipe_exits_0_quietly(args):
    """`rlctl train -h | head -1`: the reader is gone before the help is written. Like `git log | head -1`
    that is no error: exit 0 and nothing on stderr (Click alone exits 1 on the broken pipe)."""
    read_end, write_end = os.pipe()
    os.close(read_end)   # the reader closes before a byte is written: the first write meets EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "rlctl", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
