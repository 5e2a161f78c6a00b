"""What rlctl's own terminal output looks like: one log-line format, and no third-party progress bars.

rlctl reports its own progress (training steps, `generated N/M prompts`). The tqdm bars that
transformers ("Loading weights", "Writing model shards") and huggingface_hub draw while loading,
writing or downloading weights would interleave with it and fill Ray's worker logs, so every
command turns them off before those libraries are imported. Standard library only: the CLI calls
this before any command runs, and `rlctl --help` must stay light.
"""

from __future__ import annotations

import logging
import os
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

# Read by huggingface_hub when it is imported; transformers' bars follow huggingface_hub's switch.
# Worker processes (Ray actors, reward pools) get the same variable, so they start quiet too.
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def disable_progress_bars() -> None:
    """No tqdm bars from huggingface_hub or transformers in this process or the ones it starts."""
    os.environ.update(QUIET_ENV)
    # Already imported (a test process, a notebook): the variable came too late, switch them off directly.
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars as hub_disable

        hub_disable()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def setup_logging(debug: bool = False) -> None:
    """rlctl's log lines (serve, eval, warnings) on stderr as `date time LEVEL logger: message`.

    Other libraries log through the same handler at WARNING and above; rlctl's own loggers at INFO
    (DEBUG under RLCTL_DEBUG=1). A process that already configured logging keeps its handlers."""
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, datefmt=DATE_FORMAT)
    logging.getLogger("rlctl").setLevel(logging.DEBUG if debug else logging.INFO)


class PipeSafeStream:
    """sys.stdout / sys.stderr that outlive their reader. `rlctl train ... | tee log` and Ctrl-C:
    the terminal's SIGINT ends `tee` too, and the next write gets EPIPE while the run is on its way
    to its safe point. Unhandled, that is a BrokenPipeError in the middle of the stop (rich even
    turns it into SystemExit(1)), and the stop's checkpoint is lost. Here the first EPIPE points the
    stream's file descriptor at /dev/null: nobody is reading any more, the run finishes its stop."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
            self._stream.flush()   # what the buffer still holds goes to /dev/null
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def survive_closed_pipes() -> None:
    """Make this process's stdout and stderr survive a reader that went away (see PipeSafeStream)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PipeSafeStream):
            setattr(sys, name, PipeSafeStream(stream))


def flush_streams() -> None:
    """Flush stdout and stderr now, through PipeSafeStream: a dead pipe costs nothing here, where
    the interpreter's own flush at exit would print a BrokenPipeError and exit 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
