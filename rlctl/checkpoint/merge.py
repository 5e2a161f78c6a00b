"""`rlctl merge`: a run's checkpoint -> a verified Hugging Face folder (and `export_hf` for serve).

    merge_run(run_dir, out, step=None, best=False, dtype="auto", lora="merge", force=False) -> MergeResult
    export_hf(run_dir, out_dir, step=None) -> Path        # what `rlctl serve RUN_DIR` calls

One process, no Ray: the newest valid checkpoint (or `step`, or with best=True the one
checkpoints/BEST.json names; every file's sha256 checked) is rebuilt from
its own config.resolved.toml, written into a temporary folder next to OUT (safetensors, sharded
above max_shard_size; config.json, generation_config.json, tokenizer + chat template; LoRA merged
with alpha / r, or kept as a PEFT adapter folder), loaded back and compared logit by logit with
the trained weights (rlctl.checkpoint.verify_export). Only then is it renamed to OUT; any failure
leaves no OUT and no temporary folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from rlctl.checkpoint.manager import CheckpointManager, ResumePoint
from rlctl.errors import CheckpointError, UsageError

# The run's resolved config, kept next to the weights: `rlctl eval OUT` scores with the training
# reward and response length, as it does for the run folder. Model loaders ignore the file.
TRAINING_CONFIG = "rlctl_training.toml"
# Where the weights came from: {"run_dir", "step", "manifest_sha256", "best"} (best: the run's
# BEST.json record when --best picked the step, else null).
SOURCE_FILE = "rlctl_source.json"

DTYPES = ("auto", "float32", "bfloat16", "float16")
LORA_MODES = ("merge", "adapter")
MAX_SHARD_SIZE = "5GB"


@dataclass(frozen=True)
class MergeResult:
    out: Path
    step: int
    dtype: str
    lora: str            # "none" (full fine-tuning), "merge" or "adapter"
    files: list[str]
    verification: dict   # verify_export.Verification.as_dict()
    warning: str | None  # set when LATEST was broken and an older checkpoint was used
    best: dict | None = None  # the BEST.json record when best=True picked the checkpoint


def pick_checkpoint(run_dir: Path, step: int | None, *, best: bool = False) -> tuple[ResumePoint, dict | None]:
    """The checkpoint LATEST names (or `step`, or with best=True the one BEST.json names), every file
    checked against its sha256; a broken one is an error that names the newest valid step, never a
    quiet fallback. Returns the checkpoint and the BEST.json record (best=True) or None."""
    if best and step is not None:
        raise UsageError("--best and --step both pick the checkpoint; pass one of them")
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir} does not exist", hint="pass <output_dir>/<run name>, e.g. runs/my-run")
    manager = CheckpointManager.for_run(run_dir)
    if not manager.dir.is_dir():
        raise CheckpointError(f"{run_dir} has no checkpoints",
                              hint="train until a checkpoint is saved (run.save_every, or the end of the run)")
    record = manager.read_best() if best else None
    if best and record is None:
        raise CheckpointError(f"{run_dir} has no best checkpoint recorded (checkpoints/BEST.json)",
                              hint="train with run.best_metric set (e.g. \"val/reward/mean\"), or pick a step with "
                                   "--step N")
    point = manager.latest_valid(record["step"] if record else step, hashes=True)
    if point.warning:   # resume may fall back; a merge meant for the newest weights must not, silently
        reason = point.warning.removeprefix("WARNING: ").split("; using", 1)[0]
        raise CheckpointError(f"the newest checkpoint cannot be merged: {reason}",
                              hint=f"merge the newest valid one explicitly with --step {point.step}")
    return point, record


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder", hint="choose another --to-hf path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} is not empty", hint="pass --force to replace it, or choose another --to-hf path")


def check_same_model(step_dir: Path, config) -> None:
    """Refuse when model.path no longer holds the model (or tokenizer) the run was trained from."""
    from rlctl.checkpoint.compat import local_model_dir, model_fingerprint, saved_fingerprint, tokenizer_fingerprint
    from rlctl.checkpoint.manifest import read_manifest

    saved = saved_fingerprint(read_manifest(step_dir))
    model_dir = local_model_dir(config.model.path, Path.cwd())
    if saved is None or model_dir is None:
        return  # nothing recorded or nothing local to compare: the key/shape checks still apply
    fingerprints = saved["fingerprints"]
    for name, current in (("model", model_fingerprint), ("tokenizer", tokenizer_fingerprint)):
        if fingerprints.get(name) and fingerprints[name] != current(model_dir):
            raise CheckpointError(f"{step_dir.name} was trained from a different {name} than {config.model.path} "
                                  "holds now (its files changed since the run)",
                                  hint="point model.path in the checkpoint's config.resolved.toml at the original model")


def _find_base_model(config) -> None:
    """The run's model.path (tokenizer, base weights of a LoRA run): a one-line DataError when it is
    neither a folder nor cached and the hub is out of reach, before anything is written."""
    from rlctl.models.hub import resolve_model

    resolve_model(config.model.path, Path.cwd())


def merge_run(run_dir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None, best: bool = False,
              dtype: str = "auto", lora: str = "merge", force: bool = False,
              max_shard_size: str | int = MAX_SHARD_SIZE) -> MergeResult:
    """Write the checkpoint of `run_dir` as a verified HF folder at `out` (atomically).
    step / best=True: that step / the best one (run.best_metric) instead of the newest.

    The run folder is locked (rlctl.checkpoint.run_lock) for the merge: a live run's keep_last could
    delete the checkpoint being read, and <run>/hf/ exports write into it; a `out` that is a run
    folder is locked too, so --force never replaces a live run."""
    run_dir, out = Path(run_dir), Path(out)
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if lora not in LORA_MODES:
        raise UsageError(f"--lora {lora!r} is not one of {', '.join(LORA_MODES)}")
    check_out(out, force)
    from contextlib import ExitStack

    from rlctl.checkpoint.run_lock import RunLock

    with ExitStack() as locks:
        for folder in (run_dir, out):
            if folder.is_dir():
                locks.enter_context(RunLock.acquire(folder, "merge"))
        return _merge(run_dir, out, step=step, best=best, dtype=dtype, lora=lora, max_shard_size=max_shard_size)


def _merge(run_dir: Path, out: Path, *, step, best, dtype, lora, max_shard_size) -> MergeResult:
    point, best_record = pick_checkpoint(run_dir, step, best=best)
    from rlctl.checkpoint.trained import load_step_config

    config = load_step_config(point.path)
    _find_base_model(config)
    check_same_model(point.path, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        verification, written_dtype = _export(point.path, config, tmp, dtype=dtype, lora=lora,
                                              max_shard_size=max_shard_size)
        from rlctl.checkpoint.manifest import CONFIG_FILE

        shutil.copyfile(point.path / CONFIG_FILE, tmp / TRAINING_CONFIG)
        _write_source(tmp, run_dir, point, best_record)
        _usual_modes(tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    mode = "none" if config.model.lora.rank == 0 else lora
    return MergeResult(out=out, step=point.step, dtype=written_dtype, lora=mode, files=files,
                       verification=verification.as_dict(), warning=point.warning, best=best_record)


def _write_source(folder: Path, run_dir: Path, point: ResumePoint, best: dict | None) -> None:
    import json

    from rlctl.checkpoint.manifest import MANIFEST, hash_file

    source = {"run_dir": str(run_dir.resolve()), "step": point.step,
              "manifest_sha256": hash_file(point.path / MANIFEST)[1], "best": best}
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")


def _usual_modes(folder: Path) -> None:
    """0666 - umask for every file: some writers (safetensors via save_pretrained) leave 0600,
    which an inference server running as another user cannot read."""
    from rlctl.utils.atomic_files import FILE_MODE

    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(FILE_MODE)


def _export(step_dir: Path, config, tmp: Path, *, dtype: str, lora: str, max_shard_size) -> tuple:
    """Rebuild, write into tmp, verify; returns (Verification, dtype name written)."""
    from rlctl.models.loading import quiet_transformers

    quiet_transformers()
    with warnings.catch_warnings():
        # DCP's "no process group: single process" and transformers/peft deprecation notices
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return _export_quiet(step_dir, config, tmp, dtype=dtype, lora=lora, max_shard_size=max_shard_size)


def _export_quiet(step_dir: Path, config, tmp: Path, *, dtype: str, lora: str, max_shard_size) -> tuple:
    from rlctl.checkpoint import verify_export as V
    from rlctl.checkpoint.trained import load_trained_model
    from rlctl.models.loading import policy_tokenizer
    from rlctl.models.vision import is_vision_model, load_processor

    model = load_trained_model(step_dir, config)
    tokenizer = policy_tokenizer(config.model)
    processor = load_processor(config.model.path) if is_vision_model(config.model.path) else None
    prompts = V.prompt_ids(tokenizer) + (V.vision_prompts(processor) if processor is not None else [])
    adapter = config.model.lora.rank > 0 and lora == "adapter"
    return verified_export(model, prompts, tmp, merge=config.model.lora.rank > 0 and not adapter, adapter=adapter,
                           what="the merged model vs the trained weights",
                           dtype_of=lambda: _export_dtype(dtype, config.model), saver=processor or tokenizer,
                           base_path=config.model.path, trust_remote_code=config.model.trust_remote_code,
                           max_shard_size=max_shard_size)


def verified_export(model, prompts, tmp: Path, *, merge: bool, adapter: bool, what: str, dtype_of, saver,
                    base_path: str, trust_remote_code: bool, max_shard_size) -> tuple:
    """Merge the adapter of `model` (if `merge`), check the merged logits against the model's own ("what"),
    save it rounded to dtype_of() at `tmp` with `saver` (tokenizer or processor), load what was written and
    check it against the weights it should hold; returns (Verification, the dtype's name). Shared by a run's
    checkpoint and an adapter folder (rlctl.checkpoint.adapter_merge)."""
    from rlctl.checkpoint import verify_export as V

    trained = V.logits_of(model, prompts)
    tolerance = V.TOLERANCE * V.scale_of(trained)
    if merge:
        model = model.merge_and_unload()   # W + (alpha / r) B A, in float32
    merged = V.logits_of(model, prompts)
    merge_diff = V.max_abs_diff(merged, trained)
    V.check(what, merge_diff, tolerance)
    torch_dtype = dtype_of()
    tmp.mkdir(parents=True)
    _save_rounded(model, tmp, torch_dtype, adapter=adapter, max_shard_size=max_shard_size)
    saver.save_pretrained(tmp)   # a VLM's processor: image processor, tokenizer, template
    expected = V.logits_of(model, prompts)  # the weights exactly as written, computed in float32
    written_model = V.load_written(tmp, adapter=adapter, base_path=base_path, trust_remote_code=trust_remote_code)
    written = V.logits_of(written_model, prompts)
    del written_model
    result = V.Verification(merge_diff=merge_diff, written_diff=V.max_abs_diff(written, expected),
                            trained_diff=V.max_abs_diff(written, trained), tolerance=tolerance)
    V.check("the written folder vs the weights it should hold", result.written_diff, tolerance)
    return result, str(torch_dtype).removeprefix("torch.")


def _export_dtype(name: str, model_cfg):
    """--dtype; auto = the dtype model.path was published in (bf16 in, bf16 out)."""
    import torch
    from transformers import AutoConfig

    if name != "auto":
        return getattr(torch, name)
    stored = getattr(AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code),
                     "dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    return stored if isinstance(stored, torch.dtype) and stored.is_floating_point else torch.float32


def _save_rounded(model, folder: Path, dtype, *, adapter: bool, max_shard_size) -> None:
    """save_pretrained in `dtype`, then leave the model holding those rounded values in float32.

    A full model: transformers writes config.json + generation_config.json and drops the tied
    lm_head.weight. An adapter: peft writes adapter_config.json (r, lora_alpha, base path, the
    modules that carry adapters by full name) and adapter_model.safetensors with the adapter
    weights only.
    """
    import torch

    if adapter:
        from rlctl.workers.compute.lora import pin_adapted_targets

        pin_adapted_targets(model)
        lora_params = [p for n, p in model.named_parameters() if "lora_" in n]
        for p in lora_params:
            p.data = p.data.to(dtype)
        model.save_pretrained(folder, safe_serialization=True)
        for p in lora_params:
            p.data = p.data.to(torch.float32)
        return
    # Non-persistent buffers (rotary inv_freq) are not written; a loader recomputes them in float32,
    # so they are restored rather than left rounded.
    persistent = model.state_dict().keys()
    buffers = {n: b.clone() for n, b in model.named_buffers() if n not in persistent}
    model.to(dtype).save_pretrained(folder, safe_serialization=True, max_shard_size=max_shard_size)
    model.to(torch.float32)
    for name, value in buffers.items():
        model.get_buffer(name).copy_(value)


def _replace(tmp: Path, out: Path) -> None:
    """Rename the finished tmp folder to out; a replaced out is moved aside first, then deleted."""
    old = None
    if out.is_dir() and any(out.iterdir()):
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    elif out.is_dir():
        out.rmdir()
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def push_to_hub(folder: Path, repo: str, *, private: bool) -> str:
    """Upload a merged folder to the Hugging Face Hub; returns the commit URL."""
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        info = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                                 commit_message="Upload model merged with rlctl")
    except Exception as err:  # noqa: BLE001 - offline, no token, no network, no permission
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise CheckpointError(f"could not push {folder} to the hub repo {repo}: {reason}",
                              hint=f"the merged folder is complete at {folder}; check HF_TOKEN, the network and "
                                   "HF_HUB_OFFLINE, then push it with `hf upload`") from None
    return str(getattr(info, "commit_url", info))


def export_hf(run_dir: str | os.PathLike, out_dir: str | os.PathLike, step: int | None = None) -> Path:
    """The run's checkpoint as a verified HF folder in out_dir (empty or new); for `rlctl serve`."""
    result = merge_run(run_dir, out_dir, step=step)
    if result.warning:
        logging.getLogger("rlctl.merge").warning("%s", result.warning)
    return result.out
