"""The image side of a vision-language model folder: is it one, and its processor.

A VLM folder's config.json has a `vision_config`. Its processor (the image processor, the
tokenizer and the chat template together) is what turns chat messages plus PIL images into
`input_ids`, `pixel_values`, `image_grid_thw` and `mm_token_type_ids`.

Trap (measured on transformers 5.19 and 5.24): the stock Qwen2.5-VL / Qwen3-VL processors cannot be
built without torchvision, even for images only - their constructor checks the video processor's
class, and without torchvision that lookup raises. The image processor alone has a PIL backend
that needs no torchvision. So `load_processor` builds the stock processor when torchvision is
there, and otherwise the same class minus its video processor (`image_only`): same call, same
outputs, same saved files. A folder saved either way names the stock class, so AutoProcessor
loads it wherever torchvision is installed (a GPU machine, vLLM).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

from rlctl.errors import DataError


def vision_config(path: str | os.PathLike) -> dict | None:
    """The `vision_config` of a local model folder's config.json, or None (a text model, or not local)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        return json.loads(cfg.read_text()).get("vision_config")
    except (OSError, ValueError):
        return None


def is_vision_model(path: str | os.PathLike) -> bool:
    return vision_config(path) is not None


def _processor_class_name(path: Path) -> str:
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = path / name
        if file.is_file():
            found = json.loads(file.read_text()).get("processor_class")
            if found:
                return found
    raise DataError(f"{path} has no processor_config.json or preprocessor_config.json naming a processor_class",
                    hint="a vision-language model folder needs its processor files (rlctl model tiny --arch "
                         "qwen2_5_vl writes them; save_pretrained of the processor writes them for yours).")


@functools.lru_cache(maxsize=None)
def image_only(processor_class: type) -> type:
    """`processor_class` without its video processor: the ProcessorMixin reads its sub-processors from
    `__init__`'s parameter names, so an `__init__` without `video_processor` drops it (and the
    torchvision-only class check that comes with it). Everything else is the stock class's code."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        processor_class.__init__(self, image_processor=image_processor, tokenizer=tokenizer,
                                 chat_template=chat_template, **kwargs)

    def to_dict(self):
        out = processor_class.to_dict(self)
        out["processor_class"] = processor_class.__name__  # the folder stays loadable by AutoProcessor
        return out

    return type(f"ImageOnly{processor_class.__name__}", (processor_class,),
                {"__init__": __init__, "to_dict": to_dict, "__module__": __name__})


def needs_image_only(processor_class: type, folder: str | os.PathLike | None = None) -> bool:
    """Drop the video processor when torchvision (which it needs) is missing, or when `folder` has
    no video processor files (a folder written where torchvision was missing, loaded where it is)."""
    import inspect

    from transformers.utils import VIDEO_PROCESSOR_NAME

    has_video = "video_processor" in inspect.signature(processor_class.__init__).parameters
    no_files = folder is not None and not (Path(folder) / VIDEO_PROCESSOR_NAME).exists()
    return has_video and (importlib.util.find_spec("torchvision") is None or no_files)


def load_processor(path: str | os.PathLike):
    """The processor of a local VLM folder (see the module docstring for why not always AutoProcessor).

    One DataError line when the folder has no processor files or they do not load."""
    import transformers

    path = Path(path)
    name = _processor_class_name(path)
    processor_class = getattr(transformers, name, None)
    if processor_class is None:
        raise DataError(f"{path} names processor_class {name!r}, which transformers "
                        f"{transformers.__version__} does not have", hint="upgrade transformers, or fix the name")
    if needs_image_only(processor_class, path):
        processor_class = image_only(processor_class)
    try:
        return processor_class.from_pretrained(str(path))
    except Exception as e:  # broken or missing sub-processor files: one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(f"cannot load the processor of {path} ({reason})",
                        hint="check its preprocessor / processor / tokenizer files") from None


def cached_processor(path: str):
    """`load_processor(path)` once per process and version of the folder (the rollout ranks and the
    controller's turn loop ask for it with every batch; a folder rewritten in place, as by a second
    `rlctl model tiny` into the same path from a notebook, is read again)."""
    folder = Path(path)
    stamp = tuple(sorted((f.name, f.stat().st_mtime_ns) for f in folder.glob("*.json"))) if folder.is_dir() else ()
    return _processor_of_version(path, stamp)


@functools.lru_cache(maxsize=2)
def _processor_of_version(path: str, stamp: tuple):
    return load_processor(path)


IMAGES = "images"   # a prompt batch's column: each row's PIL images (rlctl.controller.prompts)


def without_images(batch):
    """The rlctl.runtime Batch less its PIL `images` column: rollout rows carry pixel_values instead."""
    from rlctl.runtime.batch import Batch

    if IMAGES not in batch:
        return batch
    return Batch({k: v for k, v in batch.tensors.items() if k != IMAGES}, batch.meta)


def processor_max_pixels(processor) -> int | None:
    """The most pixels the processor's image processor keeps (it scales larger images down)."""
    images = getattr(processor, "image_processor", None)
    size = getattr(images, "size", None) or {}
    get = size.get if isinstance(size, dict) else (lambda k: getattr(size, k, None))
    found = get("longest_edge") or get("max_pixels") or getattr(images, "max_pixels", None)
    return int(found) if found else None


def encode_prompt(processor, messages: list[dict], images: list, tools: list[dict] | None = None) -> dict:
    """One chat prompt with its images -> numpy arrays, as the model's forward takes them:

        input_ids [T]            the chat template's text, `<|image_pad|>` expanded per image
        mm_token_type_ids [T]    1 on image tokens (M-RoPE needs it: without, 1-D positions, no error)
        pixel_values [P, D]      the images' patches, all images of the prompt in order
        image_grid_thw [N, 3]    (t, h, w) patches of each of the N images

    `messages` as rlctl.data.images.load_vision_row returns them (image content parts)."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=tools or None)
    enc = processor(text=[text], images=images or None, return_tensors="np")
    out = {"input_ids": enc["input_ids"][0]}
    if "mm_token_type_ids" in enc:
        out["mm_token_type_ids"] = enc["mm_token_type_ids"][0]
    if images:
        out["pixel_values"], out["image_grid_thw"] = enc["pixel_values"], enc["image_grid_thw"]
    return out
