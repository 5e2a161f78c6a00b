"""`rlctl model convert`: a GGUF file (llama.cpp's format) to a Hugging Face folder rlctl trains.

transformers reads GGUF itself (with the `gguf` package): the config and tokenizer from the file's
metadata, the weights dequantised to float32 (`GgufConfig(dequantize=True)`; quantised blocks
cannot be saved). `save_pretrained` then writes a plain folder (config.json, model.safetensors,
tokenizer files, the chat template). The weights are the file's quantised values made dense:
real pretrained weights, not bit-identical to the checkpoint the GGUF was made from.

The folder appears in one rename of a finished temporary sibling, so a failure (an unreadable
architecture, a full disk, Ctrl-C) never leaves a half-written model where OUT should be.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from rlctl.errors import DataError, UsageError

GGUF_MAGIC = b"GGUF"
BYTES_PER_PARAM = 4   # float32 safetensors
TOKENIZER_BYTES = 32 * 2**20   # tokenizer.json, vocab, merges, config: SmolLM2's are ~4 MB


def check_gguf_file(path: Path) -> None:
    """UsageError for a missing path, DataError for a file that is not GGUF (checked by its magic)."""
    if not path.exists():
        raise UsageError(f"{path} does not exist", hint="pass the path of a .gguf file.")
    if not path.is_file():
        raise UsageError(f"{path} is not a file", hint="pass the path of a .gguf file, not a folder.")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise DataError(f"{path} is not a GGUF file (it starts with {head!r}, a GGUF file with b'GGUF')",
                        hint="pass a llama.cpp .gguf model file; a Hugging Face folder needs no conversion.")


def _reader(path: Path):
    """gguf's reader of `path`; a file that starts like GGUF but does not parse is a DataError."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError, struct.error, IndexError... on junk
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise DataError(f"{path} is not a readable GGUF file ({reason})",
                        hint="the file is damaged or truncated; download it again.") from None


def gguf_metadata(path: Path) -> tuple[str, int]:
    """The `general.architecture` field of a GGUF file and its tensors' element count (the weights
    the Hugging Face folder will hold), read from its header only."""
    reader = _reader(path)
    field = reader.fields.get("general.architecture")
    if field is None:
        raise DataError(f"{path} has no general.architecture field", hint="the file is damaged or not a model.")
    arch = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return arch, sum(int(t.n_elements) for t in reader.tensors)


def _check_supported(path: Path) -> tuple[str, int]:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError("reading GGUF files needs the `gguf` package",
                         hint='pip install "gguf>=0.10" (rlctl depends on it; reinstall rlctl).') from None
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch, params = gguf_metadata(path)
    known = {a.replace("_", "") for a in GGUF_SUPPORTED_ARCHITECTURES}
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and arch.replace("-", "").replace("_", "") not in known:
        raise DataError(f"{path.name} holds a {arch!r} model, which transformers cannot read from GGUF",
                        hint=f"transformers reads: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}.")
    return arch, params


def space_needed(params: int) -> int:
    """Bytes the folder of a `params`-weight model takes: float32 safetensors, plus the tokenizer
    and config files (a few MB) and 5% for the safetensors header and the filesystem's blocks."""
    return int(params * BYTES_PER_PARAM * 1.05) + TOKENIZER_BYTES


def _check_space(out: Path, params_estimate: int) -> None:
    parent = out.parent if out.parent.exists() else Path.cwd()
    need = space_needed(params_estimate)
    free = shutil.disk_usage(parent).free
    if free < need:
        raise DataError(f"not enough disk space for {out}: about {need / 1e6:.0f} MB needed, "
                        f"{free / 1e6:.0f} MB free", hint="free some space or choose another OUT.")


def check_out_writable(out: Path) -> None:
    """Refuse (exit 2, one line) an OUT whose folder cannot be written, before anything is fetched
    or converted: the temporary sibling staged_folder writes is made and removed."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.probe-")).rmdir()
    except OSError as e:
        why = f"{e.filename} is not a folder" if isinstance(e, FileExistsError) else (e.strerror or str(e)).lower()
        raise UsageError(f"cannot write {out}: {why}",
                         hint="choose a path this user can write (a folder you own, on a writable disk)") from None


@contextmanager
def staged_folder(out: Path):
    """Yield a temporary folder beside `out`; on success it replaces `out` in one rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield stage
        _plain_modes(stage)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            stage.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _plain_modes(folder: Path) -> None:
    """What mkdir/open would have given (mkdtemp and some writers make private 0700/0600 files)."""
    from rlctl.utils.atomic_files import DIR_MODE, FILE_MODE

    folder.chmod(DIR_MODE)
    for f in folder.rglob("*"):
        f.chmod(DIR_MODE if f.is_dir() else FILE_MODE)


def _load(path: Path):
    """transformers' model and tokenizer from one GGUF file, weights dense float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.models.loading import quiet_transformers

    quiet_transformers()
    if not sys.stderr.isatty():   # transformers' per-tensor bar is for people at a terminal, not for logs
        os.environ.setdefault("TQDM_DISABLE", "1")
    kwargs = {"gguf_file": path.name}
    try:
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:   # transformers before GgufConfig dequantised GGUF weights on load anyway
        pass
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    return model, tokenizer


def convert_gguf(src: Path, out: Path, extra_files: dict[str, str] | None = None) -> dict:
    """Write the Hugging Face folder of GGUF file `src` to `out`, with `extra_files` (name -> text,
    e.g. LICENSE) inside it before its one rename; returns what was written."""
    check_gguf_file(src)
    check_out_writable(out)
    arch, params = _check_supported(src)
    _check_space(out, params_estimate=params)
    try:
        model, tokenizer = _load(src.resolve())
    except (ValueError, KeyError, OSError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(f"transformers cannot read {src.name} ({reason})",
                        hint="the file may be damaged, or its architecture or quantisation unsupported.") from None
    with staged_folder(out) as stage:
        model.config.architectures = [type(model).__name__]
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config   # the folder holds dense weights: no quantisation left
        model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        for name, text in (extra_files or {}).items():
            (stage / name).write_text(text)
    cfg = model.config
    return {"out": str(out), "gguf_file": str(src), "gguf_architecture": arch, "architecture": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()), "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}
