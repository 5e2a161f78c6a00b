"""Paths in a run's config made absolute, once, before the run folder records it.

rlctl.toml names files relative to itself; workers, `rlctl resume` (which reads the run's
config.resolved.toml) and the resume fingerprint see them from elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rlctl.config.schema import Config


def resolve_paths(config: Config, base: Path) -> Config:
    """Paths in rlctl.toml are relative to the file; workers (and `rlctl resume`, which reads the run's
    config.resolved.toml) see them from elsewhere, so make them absolute."""
    def absolute(p: str) -> str:
        path = Path(p).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())

    from rlctl.models.hub import looks_local

    from rlctl.models.chat_template import resolve

    model_path = config.model.path
    if looks_local(model_path, base):
        model_path = absolute(model_path)
    template = str(resolve(config.model.chat_template, base).resolve()) if config.model.chat_template else ""
    data = dataclasses.replace(config.data, train_files=tuple(map(absolute, config.data.train_files)),
                               val_files=tuple(map(absolute, config.data.val_files)))
    reward = config.reward
    if ":" in reward.function:
        file, _, fn = reward.function.rpartition(":")
        reward = dataclasses.replace(reward, function=f"{absolute(file)}:{fn}")
    if reward.model and looks_local(reward.model, base):
        reward = dataclasses.replace(reward, model=absolute(reward.model))  # a folder, not a hub id
    run = dataclasses.replace(config.run, output_dir=absolute(config.run.output_dir))
    multi_turn = _absolute_specs(config.rollout.multi_turn, absolute)
    ag = config.rollout.agent   # the agent's file, and a command's arguments that are files beside rlctl.toml
    # a command's files keep their links (os.path.abspath, not resolve): a virtual environment's python is a
    # link to the base interpreter, and run through the link's own path is what makes it the environment's
    agent = dataclasses.replace(ag, function=_absolute_specs_one(ag.function, absolute),
                                command=tuple(os.path.abspath(base / a) if (base / a).is_file() else a
                                              for a in ag.command))
    algorithm = dataclasses.replace(config.algorithm, plugins=tuple(map(absolute, config.algorithm.plugins)))
    d = config.distill   # teachers: folders made absolute, hub ids kept
    local = {name: absolute(p) if looks_local(p, base) else p for name, p in d.teachers.items()}
    distill = dataclasses.replace(d, teachers=local, teacher=absolute(d.teacher) if d.teacher and
                                  looks_local(d.teacher, base) else d.teacher)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=model_path, chat_template=template), data=data,
                               reward=reward, run=run, algorithm=algorithm, distill=distill,
                               rollout=dataclasses.replace(config.rollout, multi_turn=multi_turn, agent=agent))


def _absolute_specs_one(value: str, absolute) -> str:
    """A "file.py:name" with its file made absolute ("" and built-in names stay)."""
    file, _, name = value.rpartition(":")
    return f"{absolute(file)}:{name}" if file else value


def _absolute_specs(mt, absolute):
    """[rollout.multi_turn] with "file.py:name" tools and interaction made absolute (built-ins stay)."""
    def spec(value: str) -> str:
        return _absolute_specs_one(value, absolute)

    return dataclasses.replace(mt, tools=tuple(map(spec, mt.tools)), interaction=spec(mt.interaction))
