"""Images in the data: verl's columns, unchanged.

    prompt:  chat messages; the user content carries one `<image>` marker per image, in order
    images:  list<struct<bytes: binary, path: string>>   (Hugging Face's image column: PNG/JPEG
             bytes, or a path - absolute or relative to the parquet file's folder)
             a plain list of path strings is read too
    data.image_key names the column ("images", as verl's data.image_key).

`load_vision_row(row, ...) -> (messages, images)`: the chat messages with each marker turned into
an image content part (what VLM chat templates take) and the decoded PIL images, in marker order.
Every check raises one DataError line naming the row: marker/image count mismatch, a missing
image file, bytes that are no image, an image far larger than the processor's maximum.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

from rlctl.errors import DataError

IMAGE_MARKER = "<image>"
DEFAULT_IMAGE_KEY = "images"
# The processor scales any image above its max_pixels down; one this many times over it is a
# data mistake (a full-resolution photo where a thumbnail was meant), which would cost memory and
# decode time for nothing: refused rather than silently shrunk.
FAR_LARGER = 4


def marker_count(messages: list[dict]) -> int:
    """`<image>` markers over all messages' string contents."""
    return sum(m["content"].count(IMAGE_MARKER) for m in messages if isinstance(m.get("content"), str))


def split_markers(content: str) -> list[dict]:
    """`"a <image> b"` -> [{"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": " b"}]
    (verl's RLHFDataset does the same; empty text pieces are dropped)."""
    parts = []
    for i, piece in enumerate(re.split(re.escape(IMAGE_MARKER), content)):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def vision_messages(messages: list[dict]) -> list[dict]:
    """Messages whose string content holds markers get a list of content parts; others are unchanged."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and IMAGE_MARKER in content:
            m = {**m, "content": split_markers(content)}
        out.append(m)
    return out


def _image_source(value) -> tuple[bytes | None, str | None]:
    """(bytes, path) of one entry of the images column; either may be None."""
    if isinstance(value, dict):
        data = value.get("bytes")
        return (bytes(data) if data else None), value.get("path") or None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), None
    if isinstance(value, (str, os.PathLike)):
        return None, str(value)
    return None, None


def decode_image(value, *, base_dir: str | os.PathLike | None = None, where: str = "image"):
    """One entry of the images column -> an RGB PIL image (fully decoded, so truncated bytes fail here)."""
    from PIL import Image, UnidentifiedImageError

    data, path = _image_source(value)
    if data is None and path is None:
        raise DataError(f"{where} is neither image bytes nor a path (got {type(value).__name__})",
                        hint="store Hugging Face image structs {bytes, path} or file paths in the images column.")
    if data is None:
        file = Path(path) if base_dir is None or Path(path).is_absolute() else Path(base_dir) / path
        if not file.is_file():
            raise DataError(f"{where}: image file {file} does not exist",
                            hint="paths in the images column are absolute or relative to the parquet file's folder.")
        data = file.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except UnidentifiedImageError:
        reason = "no image format PIL knows"
    except (OSError, ValueError, SyntaxError) as e:   # a known format, damaged (truncated PNG, bad header)
        reason = (str(e).splitlines() or [type(e).__name__])[0][:120]
    raise DataError(f"{where}: {len(data)} bytes are not a readable image ({reason})",
                    hint="re-encode the image as PNG or JPEG, or drop the row.")


def check_size(image, max_pixels: int | None, where: str) -> None:
    if max_pixels is None:
        return
    w, h = image.size
    if w * h > FAR_LARGER * max_pixels:
        raise DataError(f"{where} is {w}x{h} = {w * h:,} pixels, over {FAR_LARGER}x the processor's maximum "
                        f"of {max_pixels:,}", hint="downscale the images before training (the processor would "
                                                   "shrink them anyway), or raise the processor's max_pixels.")


def row_where(row: dict, index: int | None, source: str | None) -> str:
    """How an error names a row: its file and position, plus extra_info.index when it has one."""
    where = f"row {index}" if index is not None else "row"
    extra = (row.get("extra_info") or {}).get("index")
    if extra is not None and extra != index:
        where += f" (extra_info.index {extra})"
    return f"{source} {where}" if source else where


def load_vision_row(row: dict, *, image_key: str = DEFAULT_IMAGE_KEY, base_dir: str | os.PathLike | None = None,
                    max_pixels: int | None = None, index: int | None = None, source: str | None = None):
    """(messages as content parts, [PIL.Image, ...]) of one verl row, checked (see the module docstring).

    A row without the image column (or with an empty list) and without markers is a text row:
    its messages come back unchanged with no images."""
    where = row_where(row, index, source)
    entries = list(row.get(image_key) or [])
    markers = marker_count(row["prompt"])
    if markers != len(entries):
        raise DataError(f"{where} has {markers} {IMAGE_MARKER} marker(s) in its prompt but {len(entries)} "
                        f"image(s) in column {image_key!r}",
                        hint=f"put one {IMAGE_MARKER} in the user content per image, in the images' order.")
    images = []
    for i, entry in enumerate(entries):
        image = decode_image(entry, base_dir=base_dir, where=f"{where} image {i}")
        check_size(image, max_pixels, f"{where} image {i}")
        images.append(image)
    return vision_messages(row["prompt"]), images


def check_rows(rows: list[dict], *, image_key: str = DEFAULT_IMAGE_KEY, base_dir=None, max_pixels: int | None = None,
               source: str | None = None) -> list[str]:
    """Every image problem of `rows`, one line each (what `config validate` and `data inspect` report)."""
    problems = []
    for i, row in enumerate(rows):
        try:
            load_vision_row(row, image_key=image_key, base_dir=base_dir, max_pixels=max_pixels, index=i,
                            source=source)
        except DataError as e:
            problems.append(f"{e.message}; {e.hint}" if e.hint else e.message)
    return problems


def absolute_image_paths(rows: list[dict], image_key: str, base_dir: Path) -> list[dict]:
    """`rows` with each relative path in their image column joined to `base_dir` (in place)."""
    for row in rows:
        entries = row.get(image_key)
        if not entries:
            continue
        for i, entry in enumerate(entries):
            data, path = _image_source(entry)
            if data is None and path and not Path(path).is_absolute():
                absolute = str((Path(base_dir) / path).absolute())
                entries[i] = {**entry, "path": absolute} if isinstance(entry, dict) else absolute
    return rows


def image_entry(value) -> dict:
    """One entry of the images column as {bytes, path} with the bytes in (a path's file read)."""
    data, path = _image_source(value)
    if data is None:
        data = Path(path).read_bytes()
    return {"bytes": data, "path": Path(path).name if path else None}


def with_images_column(schema, image_key: str = DEFAULT_IMAGE_KEY):
    """A pyarrow row schema plus the images column as Hugging Face stores it: list<struct<bytes, path>>."""
    import pyarrow as pa

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return schema.append(pa.field(image_key, pa.list_(image)))


def to_png_struct(image) -> dict:
    """A PIL image as one entry of a Hugging Face image column: {"bytes": PNG, "path": None}."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def _stats(values: list[int]) -> dict:
    return {"min": min(values), "mean": round(sum(values) / len(values), 1), "max": max(values)}


def image_report(rows: list[dict], *, image_key: str = DEFAULT_IMAGE_KEY, max_pixels: int | None = None,
                 source: str | None = None) -> dict:
    """`rlctl data inspect`'s image section: rows with images, images per row, widths and heights.
    Every row is checked (check_rows); the first bad one is a DataError with the count of the others."""
    per_row, widths, heights, problems = [], [], [], []
    for i, row in enumerate(rows):
        try:
            _, images = load_vision_row(row, image_key=image_key, max_pixels=max_pixels, index=i, source=source)
        except DataError as e:
            problems.append(e)
            continue
        per_row.append(len(images))
        widths += [im.size[0] for im in images]
        heights += [im.size[1] for im in images]
    if problems:
        more = f" (and {len(problems) - 1} more bad row(s))" if len(problems) > 1 else ""
        raise DataError(f"{problems[0].message}{more}", hint=problems[0].hint)
    report = {"column": image_key, "rows_with_images": sum(n > 0 for n in per_row), "images": sum(per_row),
              "per_row": _stats(per_row)}
    if widths:
        report.update(width=_stats(widths), height=_stats(heights))
    return report
