"""Images in `rlctl serve` and `rlctl eval` (the built-in hf engine, vision-language models).

Requests: OpenAI content parts `{"type": "image_url", "image_url": {"url": ...}}` (or the url as a
string). A `data:image/...;base64,` URL is decoded here; an http(s) URL is fetched only when the
server was started with --allow-remote-images (a server that fetches any URL a client names can
be made to reach hosts the client cannot), with a timeout and a size cap.

Prefill: the processor expanded each image into `<|image_pad|>` tokens; the model needs the images'
`pixel_values` and `image_grid_thw` plus M-RoPE positions [3, B, T] from its own
`get_rope_index`. They are passed explicitly: without `mm_token_type_ids` the model silently falls
back to 1-D positions, and its cached `rope_deltas` would leak between batches. A row's decode
position is then its real-token count plus its rope delta (max position + 1 - prompt length),
the same for all three M-RoPE axes, as transformers' own generate does.
"""

from __future__ import annotations

import base64
import binascii
import io

from rlctl.api.api_error import APIError

MAX_REMOTE_BYTES = 20 * 1024 * 1024
REMOTE_TIMEOUT_S = 10.0


def _image_url(part: dict, where: str) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{where}.image_url must be an object with a 'url' string", param=where)
    return url


def _fetch(url: str, where: str, allow_remote: bool) -> bytes:
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.startswith("data:image/") or ";base64" not in header:
            raise APIError(400, f"{where}: a data URL must be data:image/<type>;base64,<data>", param=where)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(400, f"{where}: the data URL's base64 does not decode", param=where) from None
    if not url.startswith(("http://", "https://")):
        raise APIError(400, f"{where}: image URLs are data: URLs (or http(s) with --allow-remote-images)",
                       param=where)
    if not allow_remote:
        raise APIError(400, f"{where}: remote image URLs are refused by this server; send the image as a "
                            "data:image/...;base64 URL (or start rlctl serve with --allow-remote-images)", param=where)
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=REMOTE_TIMEOUT_S) as resp:
            data = resp.read(MAX_REMOTE_BYTES + 1)
    except OSError as e:
        raise APIError(400, f"{where}: cannot fetch {url} ({e})", param=where) from None
    if len(data) > MAX_REMOTE_BYTES:
        raise APIError(400, f"{where}: {url} is over {MAX_REMOTE_BYTES} bytes", param=where)
    return data


def content_parts(content: list, i: int, allow_remote: bool) -> tuple[list[dict], list]:
    """A message's OpenAI content parts -> (parts for the chat template, PIL images in order)."""
    from PIL import Image, UnidentifiedImageError

    parts, images = [], []
    for k, part in enumerate(content):
        where = f"messages[{i}].content[{k}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            data = _fetch(_image_url(part, where), where, allow_remote)
            try:
                with Image.open(io.BytesIO(data)) as img:
                    img.load()
                    images.append(img.convert("RGB"))
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
                raise APIError(400, f"{where}: {len(data)} bytes are not a readable image", param=where) from None
            parts.append({"type": "image"})
        else:
            raise APIError(400, f"{where}: parts are text or image_url", param=where)
    return parts, images


def has_images(messages) -> bool:
    return any(isinstance(m, dict) and isinstance(m.get("content"), list)
               and any(isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"]) for m in messages)


def vision_inputs(model, input_ids, mask, visions: list):
    """Forward kwargs for a left-padded prefill whose rows may carry images, and the rows' rope
    deltas [B, 1]. `visions[b]`: None (text) or encode_prompt's arrays for row b."""
    import numpy as np
    import torch

    from rlctl.workers.compute.vision import prompt_positions, token_types

    device = input_ids.device
    rows = [v for v in visions if v is not None and "pixel_values" in v]
    pixels = torch.as_tensor(np.concatenate([v["pixel_values"] for v in rows]), device=device)
    grids = torch.as_tensor(np.concatenate([v["image_grid_thw"] for v in rows]), dtype=torch.long, device=device)
    # the rollout's own M-RoPE code: token types from the ids (pads are never image tokens)
    positions, deltas = prompt_positions(model, input_ids, mask, grids)
    kwargs = {"position_ids": positions, "pixel_values": pixels.to(model.dtype), "image_grid_thw": grids,
              "mm_token_type_ids": token_types(model, input_ids)}
    return kwargs, deltas.to(device=device, dtype=torch.long).view(-1, 1)
