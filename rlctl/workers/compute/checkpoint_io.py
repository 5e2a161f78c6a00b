"""Saving and restoring an engine with torch.distributed.checkpoint, and exporting HF weights.

Layout of one engine's folder (all safetensors or JSON: nothing runs code when it is loaded):

    model/shard-0000<r>-model-00001-of-00001.safetensors   rank r's shards of the trained params
    optim/shard-0000<r>-...safetensors                      AdamW moments and steps, same sharding
    rng/rank_<r>.safetensors + rank_<r>.json                torch / CUDA / numpy / python RNG
    engine.json                                             train_steps, world size, tied aliases

DCP's HuggingFace storage writes each rank's DTensor shards with their offsets in the safetensors
header, so a checkpoint loads on any number of ranks (and in one process, for merge). Frozen
parameters (a LoRA base, a reference model) are not saved: they come from model.path.
"""

from __future__ import annotations

import contextlib
import json
import random
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from rlctl.errors import CheckpointError, CorruptCheckpointError
from rlctl.workers.parallel import fsdp
from rlctl.workers.parallel.expert_parallel import local_state, sharded_state

FORMAT = 1


def _options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, flatten_optimizer_state_dict=True, **extra)


def drop_aliases(state: dict) -> dict[str, str]:
    """Remove keys whose tensor is another key's (tied embeddings); returns {alias: kept key}."""
    seen: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for key in list(state):
        value = state[key]
        local = value.to_local() if hasattr(value, "to_local") else value
        if not torch.is_tensor(local) or local.numel() == 0:
            continue
        ptr = local.untyped_storage().data_ptr()
        if ptr in seen:
            aliases[key] = seen[ptr]
            del state[key]
        else:
            seen[ptr] = key
    return aliases


def _no_dist() -> bool:
    """True outside a process group (a single-process engine): DCP then skips its collectives."""
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def quiet_single_process():
    """DCP warns on every single-process save/load that it is one; here that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if fsdp.rank_and_world()[1] > 1:
        dist.barrier()


def save_engine(engine, path: str | Path) -> None:
    """Write the engine's trained params, optimizer and RNG under `path` (call on every rank)."""
    from rlctl.utils.atomic_files import write_failure
    from rlctl.utils.heap import release_free_heap

    release_free_heap()   # the state is gathered on top of what the heap retains: start from the live data
    with quiet_single_process():
        try:
            _save_engine(engine, Path(path))
        except BaseException as err:   # a full disk, a forbidden folder (DCP raises a BaseException): not a lost worker
            failed = write_failure(err)
            if failed is None:
                raise
            raise CheckpointError(f"could not write {failed.filename or path}: {failed.strerror}") from None


def load_engine(engine, path: str | Path) -> dict:
    """Restore what save_engine wrote into a freshly built engine (after checking this rank's share
    of the files, `verify_share`); returns engine.json."""
    verify_share(Path(path))
    with quiet_single_process():
        return _load_engine(engine, Path(path))


def verify_share(path: Path) -> None:
    """Before a load (call on every rank): file i of the role folder `path` is checked against the
    step's MANIFEST.json by rank i % world, so a checkpoint of N bytes costs each rank N / world of
    reading (crc32, bench/checksum_bench.py). The ranks then sum which files failed, so every rank
    raises the same CorruptCheckpointError naming them, before any rank enters the collective load."""
    from rlctl.utils.checksum import CHECKSUMS, MANIFEST, content_problems

    manifest = path.parent / MANIFEST
    if not manifest.is_file():   # not a checkpoint step folder: nothing to check against
        return
    entries = [e for e in json.loads(manifest.read_text())["files"] if e["path"].startswith(f"{path.name}/")]
    rank, world = fsdp.rank_and_world()
    mine = entries[rank::world]
    problems = content_problems(path.parent, mine)
    bad = [1.0 if any(p.startswith(f"{e['path']} ") for p in problems) else 0.0 for e in entries]   # own share only
    found = [e for e, flag in zip(entries, fsdp.all_reduce_sum(bad) if world > 1 else bad) if flag > 0]
    if found:
        first = found[0]
        checksum = next((a for a in CHECKSUMS if isinstance(first.get(a), str)), "checksum")
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        raise CorruptCheckpointError(f"checkpoint {path.parent.name} is broken: {first['path']} does not match its "
                                     f"{checksum} in the manifest (corrupted){more}")


def _save_engine(engine, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank, world = fsdp.rank_and_world()
    optim_empty = not engine.optimizer.state   # nothing trained yet: saving would invent a state
    model_sd, optim_sd = get_state_dict(engine.module, [] if optim_empty else engine.optimizer, options=_options())
    sharded_state(engine.module, model_sd, optim_sd)   # expert-parallel banks: each rank its experts
    aliases = drop_aliases(model_sd)
    dcp.save(model_sd, storage_writer=HuggingFaceStorageWriter(str(path / "model"), save_distributed=True),
             no_dist=_no_dist())
    if not optim_empty:
        tensors = {k: v for k, v in optim_sd.items() if torch.is_tensor(v)}
        dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(path / "optim"), save_distributed=True),
                 no_dist=_no_dist())
    save_rng(path / "rng", rank)
    if rank == 0:
        meta = {"format": FORMAT, "train_steps": engine.train_steps, "world_size": world,
                "aliases": aliases, "optimizer_state": not optim_empty}
        (path / "engine.json").write_text(json.dumps(meta, indent=1) + "\n")
    _barrier()


def _load_engine(engine, path: Path) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = read_engine_meta(path)
    has_optim = meta["optimizer_state"]
    model_sd, optim_sd = get_state_dict(engine.module, engine.optimizer if has_optim else [], options=_options())
    sharded_state(engine.module, model_sd, optim_sd)
    drop_aliases(model_sd)
    try:
        dcp.load(model_sd, storage_reader=HuggingFaceStorageReader(str(path / "model")), no_dist=_no_dist())
        tensors = {k: v for k, v in optim_sd.items() if torch.is_tensor(v)}
        if has_optim:
            dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(path / "optim")),
                     no_dist=_no_dist())
    except (RuntimeError, ValueError, KeyError, FileNotFoundError) as err:
        raise CheckpointError(f"cannot load {path}: {str(err).splitlines()[0][:300]}",
                              hint="the checkpoint does not match this model/config (model.path, LoRA rank?)") from None
    local_state(model_sd, optim_sd, tensors if has_optim else {})
    for alias, kept in meta["aliases"].items():
        model_sd[alias] = model_sd[kept]
    # strict=False: frozen params (a LoRA base) are absent on purpose; anything else must load.
    options = _options(strict=False)
    if has_optim:
        result = set_state_dict(engine.module, engine.optimizer, model_state_dict=model_sd,
                                optim_state_dict={**optim_sd, **tensors}, options=options)
    else:
        result = set_state_dict(engine.module, [], model_state_dict=model_sd, optim_state_dict={}, options=options)
    frozen = {name for name, p in engine.module.named_parameters() if not p.requires_grad}
    missing = [k for k in getattr(result, "missing_keys", []) if k not in frozen and k not in meta["aliases"]]
    if missing or getattr(result, "unexpected_keys", []):
        raise CheckpointError(f"{path} does not fit this model: missing {missing[:3]}, "
                              f"unexpected {list(result.unexpected_keys)[:3]}",
                              hint="resume with the model.path and LoRA settings the run was started with")
    engine.set_train_steps(int(meta["train_steps"]))
    load_rng(path / "rng", fsdp.rank_and_world()[0])
    return meta


def read_engine_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / "engine.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path / 'engine.json'} is missing or broken ({err})",
                              hint="pick another checkpoint (rlctl resume --step N)") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {meta.get('format')}, this rlctl reads {FORMAT}")
    return meta


def save_rng(folder: Path, rank: int) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["torch_cuda"] = torch.cuda.get_rng_state()
    save_file(tensors, str(folder / f"rank_{rank}.safetensors"))
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {"numpy": [kind, keys.tolist(), pos, has_gauss, cached],
             "python": [py_version, list(py_state), py_gauss]}
    (folder / f"rank_{rank}.json").write_text(json.dumps(state))


def load_rng(folder: Path, rank: int) -> bool:
    """Restore this rank's RNG; False when the checkpoint had fewer ranks (RNG left as is)."""
    from safetensors.torch import load_file

    if not (folder / f"rank_{rank}.safetensors").is_file():
        return False
    tensors = load_file(str(folder / f"rank_{rank}.safetensors"))
    torch.set_rng_state(tensors["torch_cpu"])
    if "torch_cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["torch_cuda"])
    state = json.loads((folder / f"rank_{rank}.json").read_text())
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    return True
