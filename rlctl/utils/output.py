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
