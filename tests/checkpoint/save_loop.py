"""Saves checkpoints forever (steps after the newest valid one) until the test kills it with SIGKILL.

Each step writes ~3 MiB in a few files and a nested JSON naming the step, so a kill lands inside
every phase of a save: the writer, hashing, the manifest, the rename, LATEST, retention.
Prints each committed step, flushed, so the parent knows what must survive the kill.
"""

import json
import sys
from pathlib import Path

from rlctl.checkpoint.manager import CheckpointManager
from rlctl.errors import CheckpointError

root = Path(sys.argv[1])
manager = CheckpointManager(root, keep_last=2, notify=lambda message: None)
manager.clean_leftovers()
try:
    start = manager.latest_valid().step + 1
except CheckpointError:
    start = 1


def writer(step):
    def write(tmp: Path) -> None:
        (tmp / "actor" / "model").mkdir(parents=True)
        for i in range(3):
            (tmp / "actor" / "model" / f"shard-{i}.safetensors").write_bytes(bytes([step % 251]) * (1 << 20))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    return write


for step in range(start, start + 100_000):
    manager.save(step, writer(step), meta={"step": step})
    print(step, flush=True)
