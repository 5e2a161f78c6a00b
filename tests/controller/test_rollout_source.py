"""rollout.mode -> RolloutSource: every mode the schema accepts has a source, and each source has
the methods the trainer and checkpointing call."""

from __future__ import annotations

import dataclasses

from rlctl.config.schema import RolloutConfig
from rlctl.controller.rollout_source import MODES


def test_every_rollout_mode_has_a_source():
    mode = next(f for f in dataclasses.fields(RolloutConfig) if f.name == "mode")
    assert set(mode.metadata["choices"]) == set(MODES)


def test_every_source_has_the_protocols_methods():
    for cls in MODES.values():
        assert isinstance(cls.on_policy, bool)
        for method in ("start", "next", "after_update", "save", "restore", "close"):
            assert callable(getattr(cls, method)), (cls.__name__, method)
