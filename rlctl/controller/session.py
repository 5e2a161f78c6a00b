"""What every run holds, RL or SFT: `RunSession` (config, run folder, logger, display, checkpoints)
and `RunState` (how far it got). `TrainSetup` and `SFTSetup` each hold one.

The session also says what a checkpoint holds, so checkpointing (rlctl.controller.checkpointing)
asks it rather than the kind of run: `roles`, the worker roles whose state is saved under
<step>/<name>/ (the trained roles of the role table the run started, rlctl.workers.roles.table: the actor,
and the critic or PRIME's PRM when the algorithm has one); `stateful`, the trainer-side
state in trainer_state.json (the data loader, and the KL controller of an RL run); `extras`, what
writes its own files into the step folder (the one-step-off rollout's batch in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.config.schema import Config
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.metrics_log import MetricsLogger


class Stateful(Protocol):
    """Trainer-side state saved as JSON in trainer_state.json (a loader, a KL controller)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class CheckpointedRole(Protocol):
    """A worker role whose ranks write and read their own shards."""

    def save_checkpoint(self, path: str) -> None: ...

    def load_checkpoint(self, path: str) -> Any: ...


class FolderState(Protocol):
    """Something that writes its own files into a checkpoint's step folder and reads them back."""

    def save(self, folder: Path) -> None: ...

    def restore(self, folder: Path) -> None: ...


@dataclass
class RunState:
    """How far the run got; checkpoints save and restore it."""

    step: int = 0                 # the last completed step
    saved_step: int = 0           # the newest checkpoint this session wrote or resumed from (0: none)
    best: dict | None = None      # run.best_metric: {"step", "metric", "mode", "value"}, None before one


@dataclass
class RunSession:
    """The run folder and its writers, shared by the RL and the SFT loop."""

    config: Config
    config_dir: Path
    run_dir: Path
    logger: MetricsLogger
    display: LiveDisplay
    checkpoints: CheckpointManager
    roles: dict[str, CheckpointedRole]
    stateful: dict[str, Stateful]
    extras: list[FolderState] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    state: RunState = field(default_factory=RunState)

    def log_progress(self, step: int, metrics: dict) -> None:
        """The step's metrics to the display, and its number to run.json."""
        from rlctl.checkpoint.run_folder import write_run_info

        self.display.update(step, metrics)
        write_run_info(self.run_dir, step=step)
