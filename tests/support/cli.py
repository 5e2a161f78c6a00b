"""`rlctl ...` inside the test's own process: the console entry (rlctl.cli.main.main) with its
stdout / stderr captured, for tests of what a command prints and which exit code it returns.

A `python -m rlctl` subprocess spends 2-4 s importing torch and transformers on the 2-core CI
machine before it does anything; the tests of process behaviour (signals, a fresh interpreter,
`--help` importing no heavy library, progress bars on a real stderr) keep real subprocesses.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from pathlib import Path


def rlctl_here(*args, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run `rlctl ARGS` in `cwd` as the console script would, in this process: a CompletedProcess
    with the exit code and what the command wrote (the SIGTERM handler main installs is put back)."""
    from rlctl.cli.main import main

    out, err, before, handler = io.StringIO(), io.StringIO(), os.getcwd(), signal.getsignal(signal.SIGTERM)
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(before)
        signal.signal(signal.SIGTERM, handler)
    return subprocess.CompletedProcess(["rlctl", *map(str, args)], code, out.getvalue(), err.getvalue())
