"""Config check of vision-language data (the machine pass): every image row of data.train_files and
data.val_files decodes, matches its `<image>` markers and fits the model's processor, and the model
reads images at all. Problems carry kind "data": when they are the only errors, `rlctl config
validate` and `rlctl train` exit 3 (a data error), not 2, and start nothing.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext, resolve_path
from rlctl.config.loader import Problem
from rlctl.config.schema import Config

DATA_PROBLEM = "data"   # Problem.kind of a problem in the data itself (exit 3)


def _image_files(c: Config, ctx: CheckContext) -> list[tuple[str, object]]:
    """(config key, path) of each existing data file with the data.image_key column."""
    import pyarrow.parquet as pq

    found = []
    for key in ("train_files", "val_files"):
        for p in getattr(c.data, key):
            path = resolve_path(ctx.base_dir, p)
            try:
                names = pq.read_schema(path).names
            except Exception:
                continue   # missing or unreadable: check_data_files / the data load report it
            if c.data.image_key in names:
                found.append((f"data.{key}", path))
    return found


def _model_processor(c: Config, ctx: CheckContext):
    """(is the model a VLM, its processor or None); (None, None) when model.path is not a local folder."""
    from rlctl.errors import DataError
    from rlctl.models.vision import is_vision_model, load_processor

    folder = resolve_path(ctx.base_dir, c.model.path)
    if not (folder / "config.json").is_file():
        return None, None
    if not is_vision_model(folder):
        return False, None
    try:
        return True, load_processor(folder)
    except DataError:
        return True, None   # the model's own loading reports it


def check_image_data(c: Config, ctx: CheckContext) -> list[Problem]:
    files = _image_files(c, ctx)
    if not files:
        return []
    from rlctl.data.dataset import load_rows
    from rlctl.data.images import check_rows
    from rlctl.models.vision import processor_max_pixels

    vision, processor = _model_processor(c, ctx)
    if vision is False:
        return [Problem("model.path", f"{c.model.path} is a text-only model but {files[0][1].name} has images "
                                      f"(column {c.data.image_key!r}); use a vision-language model (rlctl model "
                                      "tiny --arch qwen2_5_vl makes one)")]
    max_pixels = processor_max_pixels(processor) if processor is not None else None
    problems = []
    for key, path in files:
        bad = check_rows(load_rows([path], c.data.image_key), image_key=c.data.image_key, max_pixels=max_pixels,
                         source=path.name)
        if bad:
            more = f" (and {len(bad) - 1} more bad row(s) in {path.name})" if len(bad) > 1 else ""
            problems.append(Problem(key, f"{bad[0]}{more}", kind=DATA_PROBLEM))
    return problems
