"""Saving and restoring a run: what the trainer writes into a checkpoint, and how resume reads it.

A checkpoint step folder holds actor/ (and critic/): DCP shards of model + optimizer + schedule +
RNG per rank, written by the workers; trainer_state.json: global step, data-loader position,
KL-controller value, the best-checkpoint record so far (run.best_metric); config.resolved.toml:
the run's config. MANIFEST.json (written by the CheckpointManager, which makes the folder appear
atomically) carries the run's fingerprint (config + content hashes of model, tokenizer, data,
reward file), so resume can refuse a config that would break the run.
Generation seeds are a pure function of (seed, step, round), so no sampler state is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.checkpoint.manifest import CONFIG_FILE, MANIFEST
from rlctl.utils.fs import atomic_write_text

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup

STATE_FILE = "trainer_state.json"


def fingerprint(setup: TrainSetup) -> dict:
    from rlctl.checkpoint.compat import run_fingerprint
    from rlctl.config.loader import config_to_dict

    return run_fingerprint(config_to_dict(setup.config), setup.config_dir, setup.config.model.path)


def save(setup: TrainSetup, step: int, *, final: bool = False) -> Path | None:
    """Write checkpoint `step` (skipped when that step is already the newest saved one)."""
    if step == 0 or step == setup.state.get("saved_step"):
        return None
    import tomlkit

    from rlctl.config.loader import config_to_dict

    def write(tmp: Path) -> None:
        setup.actor.save_checkpoint(str(tmp / "actor"))
        if setup.critic is not None:
            setup.critic.save_checkpoint(str(tmp / "critic"))
        kl_ctrl = setup.kl_ctrl.state_dict() if setup.kl_ctrl is not None else None   # None: an SFT run
        state = {"step": step, "loader": setup.loader.state_dict(), "kl_ctrl": kl_ctrl,
                 "world_size": setup.config.resources.workers, "best": setup.state.get("best")}
        atomic_write_text(tmp / STATE_FILE, json.dumps(state, indent=1) + "\n")
        atomic_write_text(tmp / CONFIG_FILE, tomlkit.dumps(config_to_dict(setup.config)))

    with_notice = setup.display.print if final else (lambda _msg: None)
    meta = {"run": setup.config.run.name, "fingerprint": fingerprint(setup)}
    path = setup.checkpoints.save(step, write, meta=meta, best=setup.state.get("best"))
    setup.state["saved_step"] = step
    with_notice(f"checkpoint saved: {path}")
    return path


def prepare_resume(run_dir: Path, step: int | None, overrides: list[str] | tuple = ()):
    """Pick the checkpoint, check the config (plus `overrides`) still fits it, trim logs past it.

    Returns (loaded config, notices, checkpoint step, checkpoint path).
    """
    from rlctl.checkpoint.compat import check_resume, saved_fingerprint
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.errors import CheckpointError
    from rlctl.config.loader import load_config
    from rlctl.controller.logging import truncate_logs

    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{run_dir} has no {CONFIG_FILE}", hint="pass a run folder made by `rlctl train`.")
    loaded = load_config(config_path, list(overrides))
    manager = CheckpointManager.for_run(run_dir, loaded.config.run.keep_last)
    notices = manager.clean_leftovers()
    ckpt_step, ckpt_path, warning = manager.latest_valid(step)
    if warning:
        notices.append(warning)
    saved = saved_fingerprint(json.loads((ckpt_path / MANIFEST).read_text()))
    if saved is None:
        raise CheckpointError(f"{ckpt_path} has no run fingerprint in its {MANIFEST}",
                              hint="it was not written by `rlctl train`; start a new run instead")
    current = _current_fingerprint(loaded)
    notices += check_resume(saved, current)
    if overrides:
        import tomlkit

        from rlctl.config.loader import config_to_dict

        atomic_write_text(config_path, tomlkit.dumps(config_to_dict(loaded.config)))
    dropped = truncate_logs(run_dir, ckpt_step)
    notices.append(f"resuming from checkpoint step {ckpt_step}" + (f" ({dropped} log rows after it dropped)"
                                                                    if dropped else ""))
    return loaded, notices, ckpt_step, ckpt_path


def _current_fingerprint(loaded) -> dict:
    from rlctl.checkpoint.compat import run_fingerprint
    from rlctl.config.loader import config_to_dict
    from rlctl.controller.setup import resolve_paths

    config = resolve_paths(loaded.config, loaded.base_dir)
    return run_fingerprint(config_to_dict(config), loaded.base_dir, config.model.path)


def restore(setup: TrainSetup, ckpt_path: Path) -> None:
    """Load workers, data position and KL controller from a checkpoint folder."""
    state = json.loads((ckpt_path / STATE_FILE).read_text())
    setup.actor.load_checkpoint(str(ckpt_path / "actor"))
    if setup.critic is not None:
        setup.critic.load_checkpoint(str(ckpt_path / "critic"))
    setup.loader.load_state_dict(state["loader"])
    if setup.kl_ctrl is not None:
        setup.kl_ctrl.load_state_dict(state["kl_ctrl"])
    setup.state.update(step=int(state["step"]), saved_step=int(state["step"]))
    setup.state["best"] = restore_best(setup, state.get("best"))


def restore_best(setup, record: dict | None) -> dict | None:
    """The best-checkpoint record as of the checkpoint resumed from, written back to BEST.json (which
    a run that went further, before `resume --step`, may have moved on). Dropped, and BEST.json with
    it, when run.best_metric / best_mode changed or the checkpoint it names no longer exists."""
    run = setup.config.run
    kept = (record is not None and record.get("metric") == run.best_metric and record.get("mode") == run.best_mode
            and (setup.checkpoints.step_dir(record["step"]) / MANIFEST).is_file())
    setup.checkpoints.write_best(record if kept else None)
    return record if kept else None
