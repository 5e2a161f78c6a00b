"""May this checkpoint be resumed with the current config? Breaking changes refuse, harmless ones notify.

At save time the trainer stores `run_fingerprint(...)` in the manifest's meta (key "fingerprint"):
the resolved config plus content hashes of what paths only name (model files, tokenizer files,
training data, a reward file). At resume, `check_resume(saved, current)` compares the two:

    BREAKING (CheckpointError, exit 3): anything that changes what the next step computes --
        model.* (but gradient_checkpointing / trust_remote_code), algorithm.*, actor.* and
        critic.* (but micro_batch_size, micro_batch_max_tokens and ulysses_sequence_parallel_size; critic keys only when
        the algorithm has a critic),
        data.* for training, rollout.n / temperature / top_p / top_k, reward.function (and the
        file's content), algorithm.plugins (and the files' contents), reward.format_score /
        overlong.*, run.seed, the model's and the tokenizer's files, the training files' contents,
        the distillation teachers (distill.*, and each teacher's model files: "teachers").
    HARMLESS (a notice): run length, logging, saving and validation cadence, validation
        sampling, rollout engine and its memory settings, reward timeout / workers / on_error,
        resources.* (DCP reshards to any worker count), micro-batch sizes, sequence-parallel
        sizes, moved paths whose contents are unchanged.

docs/checkpoints.md has the table with the reason for each row.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path

from rlctl.checkpoint.manifest import hash_file
from rlctl.errors import CheckpointError

# Settings that may change between save and resume, with what the change does.
HARMLESS: dict[str, str] = {
    "run.name": "the run folder is the one being resumed",
    "run.output_dir": "the run folder is the one being resumed",
    "run.total_steps": "the run is longer or shorter",
    "run.total_epochs": "the run is longer or shorter",
    "run.save_every": "checkpoint cadence", "run.keep_last": "checkpoint retention",
    "run.val_every": "validation cadence", "run.val_before_train": "validation cadence",
    "run.best_metric": "best-checkpoint tracking", "run.best_mode": "best-checkpoint tracking",
    "run.loggers": "metric sinks", "run.log_samples": "logged samples",
    "run.max_restarts": "automatic restarts after a lost worker",
    "run.restart_backoff_s": "automatic restarts after a lost worker",
    "model.gradient_checkpointing": "memory only: the same gradients",
    "model.trust_remote_code": "permission to run the model's code",
    "data.val_files": "validation only", "data.val_batch_size": "validation only",
    "actor.micro_batch_size": "gradient accumulation: the same update up to float rounding",
    "critic.micro_batch_size": "gradient accumulation: the same update up to float rounding",
    "actor.micro_batch_max_tokens": "gradient accumulation by tokens: the same update up to float rounding",
    "critic.micro_batch_max_tokens": "gradient accumulation by tokens: the same update up to float rounding",
    "actor.expert_parallel_size": "the experts are resharded (DCP): the same update up to float rounding",
    "actor.ulysses_sequence_parallel_size": "the same update split over ranks, up to float rounding",
    "critic.ulysses_sequence_parallel_size": "the same update split over ranks, up to float rounding",
    "rollout.engine": "the same sampling distribution from another engine (not bitwise the same tokens)",
    "rollout.val_*": "validation only", "rollout.gpu_memory_utilization": "engine memory",
    "rollout.tensor_parallel_size": "engine layout",
    "reward.timeout_s": "reward process pool", "reward.workers": "reward process pool",
    "reward.on_error": "what happens only when the reward function fails",
    "resources.workers": "the checkpoint is resharded (DCP); per-rank sampling streams differ from the "
                         "uninterrupted run",
    "resources.*": "placement only",
}

# Path settings whose meaning is the files' contents: compared by fingerprint, not by spelling.
FINGERPRINTED = {"model.path": "model", "data.train_files": "train_files", "reward.function": "reward_function",
                 "algorithm.plugins": "plugins"}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "vocab.txt", "spiece.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")
EDGE = 1 << 20  # bytes hashed at each end of a weight file


# --- fingerprints at save time ----------------------------------------------------------------

def run_fingerprint(config_dict: dict, config_dir: str | os.PathLike,
                    tokenizer_dir: str | os.PathLike | None = None) -> dict:
    """{"config": the resolved config, "fingerprints": {model, tokenizer, train_files, reward_function}}.

    config_dir: what relative paths in the config are relative to. tokenizer_dir: where the
    tokenizer was loaded from, a folder or hub id (default: the model). A fingerprint is None when there is
    nothing local to hash (a hub id that is not in the local cache, a built-in reward).
    """
    base = Path(config_dir)
    model_dir = local_model_dir(config_dict["model"]["path"], base)
    tok_dir = local_model_dir(str(tokenizer_dir), base) if tokenizer_dir is not None else model_dir
    return {"config": config_dict, "fingerprints": {
        "model": model_fingerprint(model_dir) if model_dir else None,
        "tokenizer": tokenizer_fingerprint(tok_dir) if tok_dir else None,
        "train_files": _data_fingerprint(config_dict["data"]["train_files"], base),
        "reward_function": _reward_fingerprint(config_dict["reward"]["function"], base),
        "plugins": _plugins_fingerprint(config_dict["algorithm"].get("plugins", []), base),
        "teachers": teachers_fingerprint(config_dict.get("distill") or {}, base),
    }}


def teachers_fingerprint(distill: dict, base: Path) -> str | None:
    """sha256 over the distillation teachers: each name with its model's fingerprint (a hub id not in
    the cache, or a teacher_url, by its name alone). None without distillation."""
    teachers = dict(distill.get("teachers") or {}) or ({"teacher": distill["teacher"]} if distill.get("teacher") else {})
    if distill.get("teacher_url"):
        teachers = {"teacher": f"{distill['teacher_url']} {distill.get('teacher_model', '')}"}
    if not teachers:
        return None
    outer = hashlib.sha256()
    for name, path in sorted(teachers.items()):
        folder = None if distill.get("teacher_url") else local_model_dir(path, base)
        outer.update(f"{name} {model_fingerprint(folder) if folder else path}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def _resolve(path: str, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def local_model_dir(path: str, base: Path) -> Path | None:
    """The folder holding the model's files: a local folder, or a hub id's cached snapshot."""
    from rlctl.models.hub import cached_snapshot

    if not path:
        return None
    local = _resolve(path, base)
    if local.is_dir():
        return local
    return cached_snapshot(path)  # None when not cached: nothing to hash


def model_fingerprint(model_dir: str | os.PathLike) -> str:
    """sha256 over config.json and each weight file's name, size and first/last MiB.

    Reading every byte of a 15 GB model at each start would cost tens of seconds; the two ends of
    each file (the safetensors header and the last tensors) change whenever the weights do.
    """
    root = Path(model_dir)
    outer = hashlib.sha256()
    config = root / "config.json"
    if config.is_file():
        outer.update(b"config.json " + hash_file(config)[1].encode() + b"\n")
    for path in sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)):
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(EDGE)
            f.seek(max(0, size - EDGE))
            tail = f.read(EDGE)
        edges = hashlib.sha256(head + tail).hexdigest()
        outer.update(f"{path.name} {size} {edges}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def tokenizer_fingerprint(tokenizer_dir: str | os.PathLike) -> str:
    """sha256 over the tokenizer files present (vocabulary, merges, special tokens, chat template)."""
    root = Path(tokenizer_dir)
    outer = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (root / name).is_file():
            outer.update(f"{name} {hash_file(root / name)[1]}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def _data_fingerprint(files: list, base: Path) -> str | None:
    from rlctl.data.dataset import files_fingerprint

    return files_fingerprint([_resolve(f, base) for f in files]) if files else None


def _plugins_fingerprint(files: list, base: Path) -> str | None:
    """algorithm.plugins: the files that define the run's own estimators and losses (missing ones
    are validate's to report, so they are left out here)."""
    present = [str(p) for p in (_resolve(f, base) for f in files) if p.is_file()]
    return _data_fingerprint(present, base)


def _reward_fingerprint(spec: str, base: Path) -> str | None:
    file, sep, _ = spec.strip().rpartition(":")
    path = _resolve(file, base) if sep and file else None
    return f"sha256:{hash_file(path)[1]}" if path is not None and path.is_file() else None


# --- comparison at resume time ------------------------------------------------------------------

def flatten(config: dict, prefix: str = "") -> dict:
    """{"model": {"lora": {"rank": 8}}} -> {"model.lora.rank": 8}."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def harmless_reason(key: str, saved_config: dict) -> str | None:
    """Why changing `key` is harmless, or None when it breaks the run."""
    if key.startswith("critic.") and not _has_critic(saved_config):
        return "this algorithm has no critic"
    for pattern, reason in HARMLESS.items():
        if fnmatch.fnmatchcase(key, pattern):
            return reason
    return None


def _has_critic(saved_config: dict) -> bool:
    try:
        from rlctl.algorithms import algorithm_needs

        # a saved config.resolved.toml as a dict: the same reads as run_needs (KL settings start no critic)
        return algorithm_needs(saved_config["algorithm"]["name"], policy_loss=saved_config["actor"]["policy_loss"]).critic
    except Exception:  # an estimator this process does not know: assume the worst
        return True


def check_resume(saved: dict, current: dict) -> list[str]:
    """Notices for harmless differences; CheckpointError (exit 3) naming every breaking one.

    saved / current: run_fingerprint() results of the checkpoint and of this resume.
    """
    breaking, notices = [], []
    old, new = flatten(saved["config"]), flatten(current["config"])
    old_fp, new_fp = saved.get("fingerprints") or {}, current.get("fingerprints") or {}
    for key in sorted(old.keys() | new.keys()):
        if key in FINGERPRINTED and old_fp.get(FINGERPRINTED[key]) and new_fp.get(FINGERPRINTED[key]):
            _compare_fingerprinted(key, old, new, old_fp, new_fp, breaking, notices)
            continue
        if old.get(key, _ABSENT) == new.get(key, _ABSENT):
            continue
        change = f"{key}: {_show(old.get(key, _ABSENT))} -> {_show(new.get(key, _ABSENT))}"
        reason = harmless_reason(key, saved["config"]) if key in old and key in new else _absent_reason(key, old, new)
        if reason is None:
            breaking.append(change)
        else:
            notices.append(f"{change} ({reason}){_schedule_note(key, new)}")
    if old_fp.get("teachers") != new_fp.get("teachers") and (old_fp.get("teachers") or new_fp.get("teachers")):
        breaking.append("the distillation teachers changed (another set, or a teacher's weights): the run's "
                        "advantages would come from other models")
    if old_fp.get("tokenizer") and new_fp.get("tokenizer") and old_fp["tokenizer"] != new_fp["tokenizer"]:
        breaking.append("the tokenizer files changed (token ids would mean other text)")
    if breaking:
        raise CheckpointError(f"the config differs from the checkpoint's in ways that break the run: "
                              f"{'; '.join(breaking)}",
                              hint="resume with the saved settings (drop those overrides or restore the files), "
                                   "or start a new run with `rlctl train` and run.name=NEW")
    return notices


class _Absent:
    def __repr__(self) -> str:
        return "(not set)"


_ABSENT = _Absent()


def _show(value) -> str:
    return repr(value) if isinstance(value, _Absent) else str(value)


def _absent_reason(key: str, old: dict, new: dict) -> str | None:
    """A key only one side has: a setting added or removed by another rlctl version."""
    if key not in new:
        return "no longer a setting; ignored"
    from rlctl.config.loader import LEAF_KEYS

    field = LEAF_KEYS.get(key)
    if field is not None and new[key] == _default(field):
        return "a newer setting, at its default"
    return harmless_reason(key, {})


def _default(field):
    import dataclasses

    value = field.default_factory() if field.default is dataclasses.MISSING else field.default
    return list(value) if isinstance(value, tuple) else value


def _compare_fingerprinted(key, old, new, old_fp, new_fp, breaking, notices) -> None:
    name = FINGERPRINTED[key]
    if old_fp[name] != new_fp[name]:
        breaking.append(f"{key}: the contents changed ({old_fp[name][:19]}... -> {new_fp[name][:19]}...)")
    elif old.get(key) != new.get(key):
        notices.append(f"{key}: {_show(old.get(key, _ABSENT))} -> {_show(new.get(key, _ABSENT))} "
                       "(same contents, moved)")


def _schedule_note(key: str, new: dict) -> str:
    if key in ("run.total_steps", "run.total_epochs") and new.get("actor.lr_schedule") == "cosine":
        return "; actor.lr_schedule is cosine, so the learning-rate curve changes from here on"
    return ""


def saved_fingerprint(manifest: dict) -> dict | None:
    """The run_fingerprint the trainer stored in a checkpoint's manifest (meta["fingerprint"])."""
    meta = manifest.get("meta")
    found = meta.get("fingerprint") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) and "config" in found else None
