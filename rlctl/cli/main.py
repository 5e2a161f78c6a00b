"""The `rlctl` command line: one typer app, commands registered from small modules.

Nothing here (or in any cli module at import time) imports torch, ray, transformers or peft:
`rlctl --help` must stay fast. Heavy imports happen inside command bodies.
"""

from __future__ import annotations

import os
import signal
import sys

import typer

from rlctl import __version__
from rlctl.cli.common import flag
from rlctl.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, Interrupted, RlctlError, unusable_path
from rlctl.utils.output import disable_progress_bars, flush_streams, setup_logging, survive_closed_pipes

app = typer.Typer(
    name="rlctl",
    help="RL post-training of LLMs: init -> data prep -> config validate -> train -> merge -> serve.\n\n"
         "Example: rlctl init myproj --recipe grpo-gsm8k",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = flag("--version", callback=_version, is_eager=True,
                               help="Print the version and exit.")) -> None:
    """RL post-training of LLMs from the command line."""


# Each module adds its commands to `app`; keep this list in help order.
from rlctl.cli import project as _project  # noqa: E402
from rlctl.cli import data_cmd as _data_cmd  # noqa: E402
from rlctl.cli import config_cmd as _config_cmd  # noqa: E402
from rlctl.cli import train_cmd as _train_cmd  # noqa: E402
from rlctl.cli import model_cmd as _model_cmd  # noqa: E402
from rlctl.cli import merge_cmd as _merge_cmd  # noqa: E402
from rlctl.cli import serve_cmd as _serve_cmd  # noqa: E402
from rlctl.cli import sandbox_cmd as _sandbox_cmd  # noqa: E402
from rlctl.cli import view_cmd as _view_cmd  # noqa: E402
from rlctl.cli import tinker_cmd as _tinker_cmd  # noqa: E402

for _module in (_project, _data_cmd, _config_cmd, _train_cmd, _model_cmd, _merge_cmd, _serve_cmd, _sandbox_cmd,
                _view_cmd, _tinker_cmd):
    _module.register(app)


def _raise_interrupted(signum, _frame):
    raise Interrupted("interrupted", exit_code=128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: known errors become one line and their exit code."""
    debug = os.environ.get("RLCTL_DEBUG", "") not in ("", "0")
    survive_closed_pipes()   # `rlctl train | tee log`, then Ctrl-C: tee is gone, the run still stops cleanly
    signal.signal(signal.SIGTERM, _raise_interrupted)
    disable_progress_bars()  # before any command imports transformers / huggingface_hub
    setup_logging(debug)
    try:
        app(args=argv, prog_name="rlctl")
    except SystemExit as e:
        if _from_ctrl_c(e):   # typer turns a Ctrl-C in a command into a silent exit 130
            print("interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except RlctlError as e:
        return _report(e, debug)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        known = unusable_path(e)   # a read-only or non-folder destination the user named: exit 2
        if known is not None:
            return _report(known, debug)
        import traceback   # a bug: show it in full so it can be reported

        traceback.print_exc()
        print("error: internal error (a bug in rlctl); please report it with the traceback above",
              file=sys.stderr)
        return EXIT_INTERNAL
    return 0


def _from_ctrl_c(exc: BaseException) -> bool:
    """A SystemExit that typer raised for a KeyboardInterrupt (its Exit(130), from the interrupt)."""
    for _ in range(4):   # SystemExit <- typer's Exit(130) <- KeyboardInterrupt
        exc = exc.__cause__ or exc.__context__
        if exc is None:
            return False
        if isinstance(exc, KeyboardInterrupt):
            return True
    return False


def _report(e: RlctlError, debug: bool) -> int:
    if debug:
        import traceback
        traceback.print_exc()
    msg = e.message if e.hint is None else f"{e.message}; {e.hint}"
    # A stop the user asked for is not an error: say how it ended and how to go on (e.hint).
    print(msg if isinstance(e, Interrupted) else f"error: {msg}", file=sys.stderr)
    for problem in getattr(e, "problems", ()):
        print(f"  {problem}", file=sys.stderr)
    return e.exit_code


def run() -> None:  # pragma: no cover - exercised through the console script
    code = main()
    flush_streams()
    sys.exit(code)
