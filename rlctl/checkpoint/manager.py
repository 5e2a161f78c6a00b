"""`CheckpointManager`: atomic saves, LATEST, retention, listing, and picking the checkpoint to resume.

The one owner of a run folder's checkpoints/ (train, resume, status, merge all go through it):

    checkpoints/.tmp-step_<N>-<pid>/   a save in progress (the trainer's writer fills it)
    checkpoints/step_<N>/MANIFEST.json written last inside the folder, before the rename
    checkpoints/LATEST                 "step_<N>": the commit point, replaced atomically
    checkpoints/BEST.json              {"step", "metric", "mode", "value"}: the best validated
                                       checkpoint (run.best_metric), written after LATEST

A save is: write into the temporary folder, hash + fsync every file, write the manifest, one
rename to step_<N>, replace LATEST, replace BEST.json (when given), then retention, which never
deletes the step BEST.json names. Killed at any instant (kill -9), the run is
left with LATEST naming either the previous or the new complete checkpoint; what the kill left
behind (.tmp-*) is cleaned, or recovered when it is the checkpoint LATEST names, at the next start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, NamedTuple

from rlctl.checkpoint.manifest import MANIFEST, fsync_dir, verify, write_manifest
from rlctl.errors import CheckpointError
from rlctl.utils.atomic_files import atomic_write_text

CHECKPOINTS_DIR = "checkpoints"   # <run folder>/checkpoints
LATEST = "LATEST"
BEST = "BEST.json"
TMP = ".tmp-"
_STEP = re.compile(r"^step_(\d+)$")
_NEW = re.compile(r"^\.tmp-step_(\d+)-(\d+)$")            # a save in progress
_REPLACED = re.compile(r"^\.tmp-replaced-step_(\d+)-(\d+)$")  # the old step_<N> while it is replaced
_PID = re.compile(r"-(\d+)$")


class ResumePoint(NamedTuple):
    """The checkpoint to resume from; `warning` says why it is not the one LATEST names."""

    step: int
    path: Path
    warning: str | None


def pid_alive(pid) -> bool:
    """Whether process `pid` runs on this host (a live run's controller, a save in progress)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    """Delete a checkpoint folder: renamed out of the step_* namespace first, so a kill during
    rmtree never leaves a half-deleted folder that still looks like a checkpoint."""
    doomed = path.with_name(f"{TMP}delete-{path.name}-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


class CheckpointManager:
    """The checkpoints of one run. keep_last: complete checkpoints to keep (0 = all).

    notify(message) also receives the notices that clean_leftovers returns (leftovers removed,
    a checkpoint recovered); default: none, the caller prints what clean_leftovers returns.
    """

    def __init__(self, checkpoints_dir: str | os.PathLike, keep_last: int, *,
                 notify: Callable[[str], None] | None = None):
        self.dir = Path(checkpoints_dir)
        self.keep_last = int(keep_last)
        self.notify = notify or (lambda message: None)

    @classmethod
    def for_run(cls, run_dir: str | os.PathLike, keep_last: int = 0, **kwargs) -> "CheckpointManager":
        """The checkpoints of the run folder `run_dir` (keep_last 0: reading, no retention)."""
        return cls(Path(run_dir) / CHECKPOINTS_DIR, keep_last, **kwargs)

    # --- layout ------------------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return self.dir / f"step_{int(step)}"

    def steps(self) -> list[int]:
        """Steps with a step_<N> folder (complete or not), ascending."""
        if not self.dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if p.is_dir() and (m := _STEP.match(p.name)))

    def has_checkpoints(self) -> bool:
        """Anything a save committed (LATEST or a step_<N> folder): the run can be resumed, not restarted."""
        return self.dir.is_dir() and any(p.name == LATEST or p.name.startswith("step_") for p in self.dir.iterdir())

    def listing(self) -> list[dict]:
        """step_<N> folders by step: step, path, bytes, and `valid` = its manifest is there and every
        file it lists has the size it records (the cheap check resume makes; merge also compares
        hashes), else `problem` says what is wrong."""
        out = []
        for step in self.steps():
            path = self.step_dir(step)
            problems = verify(path, hashes=False)
            out.append({"step": step, "path": str(path), "valid": not problems,
                        "problem": problems[0] if problems else None,
                        "bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file())})
        return out

    def latest_named(self) -> int | None:
        """The step LATEST names, or None when LATEST is missing or unreadable."""
        try:
            text = (self.dir / LATEST).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        match = _STEP.match(text)
        return int(match.group(1)) if match else None

    def read_best(self) -> dict | None:
        """The best-checkpoint record ({"step", "metric", "mode", "value"}), or None when there is none."""
        try:
            record = json.loads((self.dir / BEST).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            return None
        return record

    def write_best(self, record: dict | None) -> None:
        """Replace BEST.json atomically (None removes it: no best checkpoint)."""
        if record is None:
            (self.dir / BEST).unlink(missing_ok=True)
            return
        atomic_write_text(self.dir / BEST, json.dumps(record, indent=1) + "\n")

    # --- saving ---------------------------------------------------------------------------------
    def save(self, step: int, write: Callable[[Path], None], *, meta: dict, best: dict | None = None) -> Path:
        """Write checkpoint `step` atomically; returns checkpoints/step_<step>.

        best: the best-checkpoint record to hold once this step is committed (it may name this step
        or an earlier kept one); written before retention, so retention keeps the step it names.

        write(tmp) fills the temporary folder (actor/, critic/, trainer_state.json, ...). If it
        raises (or the process is interrupted) before the commit, the temporary folder is removed
        and LATEST still names the previous checkpoint.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f"{TMP}step_{int(step)}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            write(tmp)
            write_manifest(tmp, step, meta)
            final = self._rename_into_place(tmp, step)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if best is not None:
            self.write_best(best)
        self.apply_retention()
        return final

    def _rename_into_place(self, tmp: Path, step: int) -> Path:
        """One rename to step_<N> (an older step_<N> is moved aside first), then LATEST."""
        final = self.step_dir(step)
        replaced = None
        if final.exists():
            replaced = self.dir / f"{TMP}replaced-step_{int(step)}-{os.getpid()}"
            os.rename(final, replaced)
        os.rename(tmp, final)
        fsync_dir(self.dir)
        atomic_write_text(self.dir / LATEST, f"step_{int(step)}\n")  # the commit point
        fsync_dir(self.dir)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        return final

    def apply_retention(self) -> list[int]:
        """Delete complete checkpoints beyond the newest keep_last; returns the deleted steps.

        Only steps up to the one LATEST names count: newer folders are from before a
        `resume --step` to an earlier step and are left alone; LATEST's own step and the one
        BEST.json names are always kept, and so is the newest step that verifies (sizes, the cheap
        check) when none of the kept ones does, so retention never deletes the only loadable one.
        """
        latest = self.latest_named()
        if self.keep_last <= 0 or latest is None:
            return []
        complete = [s for s in self.steps() if s <= latest and (self.step_dir(s) / MANIFEST).is_file()]
        best = self.read_best()
        keep = set(complete[-self.keep_last:]) | {latest} | ({best["step"]} if best else set())
        keep |= self._newest_loadable(complete, keep)
        doomed = [s for s in complete if s not in keep]
        for step in doomed:
            _remove(self.step_dir(step))
        return doomed

    def _newest_loadable(self, complete: list[int], keep: set[int]) -> set[int]:
        """{the newest step of `complete` that verifies} when no step in `keep` does, else {}."""
        if any(s in complete and not verify(self.step_dir(s), hashes=False) for s in keep):
            return set()
        return next(({s} for s in reversed(complete) if not verify(self.step_dir(s), hashes=False)), set())

    # --- leftovers ------------------------------------------------------------------------------
    def clean_leftovers(self) -> list[str]:
        """Remove what a killed save left (.tmp-* folders, LATEST / BEST.json temp files); returns the notices.

        One exception: killed while replacing step_<N> (between moving the old folder aside and
        renaming the new one in), LATEST names a step_<N> that is missing while a complete copy
        sits in .tmp-*: that copy is renamed back into place instead of being deleted.
        """
        if not self.dir.is_dir():
            return []
        notices = self._recover_named_step()
        for path in sorted(self.dir.iterdir()):
            if path.name.startswith(TMP) and path.is_dir():
                pid = _PID.search(path.name)
                # our own leftovers (an earlier failed save in this process) go; another live
                # process on this host may still be saving there
                if pid and int(pid.group(1)) != os.getpid() and pid_alive(int(pid.group(1))):
                    continue
                shutil.rmtree(path, ignore_errors=True)
                notices.append(f"removed {path.name} in {self.dir}, left by a save that did not finish")
            elif path.name.startswith((f".{LATEST}.", f".{BEST}.")) and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
        for message in notices:
            self.notify(message)
        return notices

    def _recover_named_step(self) -> list[str]:
        latest = self.latest_named()
        if latest is None or self.step_dir(latest).exists():
            return []
        # Prefer the new checkpoint (its manifest is written last), then the one it was replacing.
        for pattern in (_NEW, _REPLACED):
            for path in sorted(self.dir.iterdir()):
                match = pattern.match(path.name)
                if match and int(match.group(1)) == latest and not verify(path, hashes=False):
                    os.rename(path, self.step_dir(latest))
                    fsync_dir(self.dir)
                    return [f"recovered step_{latest} from {path.name} (the process was killed while replacing it)"]
        return []

    # --- choosing a checkpoint ----------------------------------------------------------------
    def verify(self, step_dir: str | os.PathLike, *, hashes: bool) -> list[str]:
        return verify(step_dir, hashes=hashes)

    def latest_valid(self, step: int | None = None, *, hashes: bool = False,
                     content_of: Callable[[str], bool] | None = None) -> ResumePoint:
        """The checkpoint to resume (or merge) from.

        step=None: the step LATEST names when it verifies, else the newest complete step before
        it (or the newest overall when LATEST is unreadable) with a warning. step=N: that step,
        or CheckpointError. hashes=True also checks the files' checksums (crc32, or sha256 in
        older manifests): every file's (merge), or those content_of(path) selects (resume, whose
        ranks check the shards they load).
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoints in {self.dir}",
                                  hint="the run has not saved one yet (run.save_every, or it stopped before a save)")
        if step is not None:
            return self._exact(step, steps, hashes, content_of)
        named = self.latest_named()
        if named is None:
            reason = f"{self.dir / LATEST} is missing or unreadable"
        else:
            problems = (verify(self.step_dir(named), hashes=hashes, content_of=content_of) if named in steps
                        else ["the folder is missing"])
            if not problems:
                return ResumePoint(named, self.step_dir(named), None)
            reason = f"LATEST names step_{named}, which is broken ({_summary(problems)})"
        return self.newest_valid_below(named, reason, hashes=hashes, content_of=content_of)

    def newest_valid_below(self, below: int | None, reason: str, *, hashes: bool,
                           content_of: Callable[[str], bool] | None = None) -> ResumePoint:
        """The newest step before `below` (any step: None) that verifies, with a warning giving
        `reason`; CheckpointError when none does."""
        for candidate in reversed(self.steps()):
            if (below is None or candidate < below) and not verify(self.step_dir(candidate), hashes=hashes,
                                                                   content_of=content_of):
                return ResumePoint(candidate, self.step_dir(candidate),
                                   f"WARNING: {reason}; using step_{candidate}, the newest valid checkpoint")
        raise CheckpointError(f"no valid checkpoint in {self.dir}: {reason}, and no earlier step verifies",
                              hint="the checkpoints are damaged; start a new run (rlctl train with run.name=NEW)")

    def _exact(self, step: int, steps: list[int], hashes: bool, content_of) -> ResumePoint:
        if step not in steps:
            raise CheckpointError(f"checkpoint step {step} does not exist in {self.dir}",
                                  hint=f"steps there: {', '.join(map(str, steps))}")
        problems = verify(self.step_dir(step), hashes=hashes, content_of=content_of)
        if problems:
            raise CheckpointError(f"checkpoint step_{step} is broken: {_summary(problems)}",
                                  hint="pick another step with --step, or leave it out for the newest valid one")
        return ResumePoint(step, self.step_dir(step), None)


def _summary(problems: list[str]) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"
