"""Vision inputs of a vision-language policy (Qwen2.5-VL first) as they travel with the batch.

A row of a VLM batch carries, beside its tokens (image placeholders already expanded by the
processor: one `<|image_pad|>` per merged patch):

    pixel_values    object [B]  one float32 array [patches, C*t*p*p] per row (its images' patches,
                                in order), None for a row without an image
    image_grid_thw  object [B]  one int64 array [images, 3] per row (t, h, w of each image in patches)
    position_ids    int64 [B, 3, P+T]  the multimodal (M-RoPE) positions: temporal, height, width

The n samples of a prompt share its arrays (np.repeat copies references; pickle sends one copy).
The positions are computed ONCE, by the rollout worker (`rollout_positions`), from the prompt's
tokens and grids with the model's own `get_rope_index`; the rollout decodes with them and every
later forward (old / ref log-probs, the update) reads them from the batch. Two traps make that
necessary: without `mm_token_type_ids` the model silently falls back to 1-D positions (logits off
by ~4e-3), and it caches `rope_deltas` between calls, so a training forward after a generation
could reuse another batch's deltas. Passing position_ids explicitly sidesteps both.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

from rlctl.models.anatomy import causal_lm_parts
from rlctl.models.vision import IMAGES, cached_processor, without_images  # noqa: F401 (re-exported)
from rlctl.runtime.batch import Batch, object_array

PIXEL_VALUES, IMAGE_GRID_THW, POSITION_IDS = "pixel_values", "image_grid_thw", "position_ids"
VISION_KEYS = (PIXEL_VALUES, IMAGE_GRID_THW)


def vision_config(model: torch.nn.Module):
    """The model's vision config (peft passes `.config` through), or None for a text-only model."""
    return getattr(getattr(model, "config", None), "vision_config", None)


def has_vision_tower(model: torch.nn.Module) -> bool:
    return vision_config(model) is not None


def _core(model: torch.nn.Module) -> torch.nn.Module:
    """The multimodal base (Qwen2_5_VLModel: `visual`, `language_model`, `get_rope_index`) under
    peft's and the ForConditionalGeneration wrappers."""
    base = causal_lm_parts(model)
    return base.model if hasattr(base, "model") and hasattr(base.model, "get_rope_index") else base


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    return _core(model).visual


def placeholder_ids(model: torch.nn.Module) -> list[int]:
    """The vision placeholder tokens (image, video, vision start / end) of a vision-language model;
    [] for a text model. The policy never samples them: a sampled `<|image_pad|>` in a response
    would be taken for an image slot by every later forward (features and tokens would not match).
    The hf engine samples from the logits with them at BANNED_LOGIT and the trainer scores the same
    distribution (ban_placeholders), so rollout and training log-probs stay equal."""
    return config_placeholder_ids(model.config) if has_vision_tower(model) else []


def config_placeholder_ids(config) -> list[int]:
    """placeholder_ids of a vision-language model's transformers config."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return sorted({int(getattr(config, n)) for n in names if getattr(config, n, None) is not None})


BANNED_LOGIT = -1e9   # softmax gives exactly 0; finite, so an entropy bonus's gradient stays finite (-inf: NaN)


def ban_placeholders(logits: torch.Tensor, banned: list[int]) -> torch.Tensor:
    """logits [..., V] with the `banned` token ids at BANNED_LOGIT (the same tensor when there are none)."""
    if not banned:
        return logits
    return logits.index_fill(-1, torch.tensor(banned, device=logits.device), BANNED_LOGIT)


def freeze_vision_tower(model: torch.nn.Module) -> None:
    """model.freeze_vision_tower: the tower (patch embedding, blocks, merger) keeps its weights; the
    optimizer never sees them (TrainEngine trains what requires grad)."""
    from rlctl.errors import ConfigError

    if not has_vision_tower(model):
        raise ConfigError(f"model.freeze_vision_tower is set but {type(model).__name__} has no vision tower",
                          hint="remove model.freeze_vision_tower, or point model.path at a vision-language model")
    vision_tower(model).requires_grad_(False)


def language_model_linears(model: torch.nn.Module) -> list[str]:
    """Full names of the linear layers inside the language model of a vision-language `model`
    (the output head excluded); [] for a text-only model."""
    if not has_vision_tower(model):
        return []
    lm = _core(model).language_model
    inside = {id(m) for m in lm.modules()}
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and id(m) in inside]


def process_images(processor, model: torch.nn.Module, batch) -> dict[str, np.ndarray]:
    """The prompt batch's `images` column (each row's PIL images, in marker order) through the
    processor's image processor: pixel_values and image_grid_thw per row (None for a row without
    images), the same arrays the processor's own call makes. Each row's image tokens must number
    what its grids say (the controller expanded them with the same processor): DataError if not."""
    from rlctl.errors import DataError

    merge = vision_config(model).spatial_merge_size
    pixels, grids = [], []
    for row, (ids, mask, images) in enumerate(zip(batch["input_ids"], batch["attention_mask"], batch[IMAGES])):
        if not images:
            pixels.append(None)
            grids.append(None)
            continue
        enc = processor.image_processor(images=list(images), return_tensors="np")
        pixels.append(np.asarray(enc[PIXEL_VALUES], dtype=np.float32))
        grids.append(np.asarray(enc[IMAGE_GRID_THW], dtype=np.int64))
        tokens = int((ids[mask != 0] == model.config.image_token_id).sum())
        if tokens != int(grids[-1].prod(-1).sum()) // merge ** 2:
            raise DataError(f"prompt {row} of the batch has {tokens} image tokens but its {len(images)} image(s) "
                            f"make {int(grids[-1].prod(-1).sum()) // merge ** 2}",
                            hint="the prompts and the images must go through the processor of model.path")
    return {PIXEL_VALUES: object_array(pixels), IMAGE_GRID_THW: object_array(grids)}


def with_pixels(batch: Batch, model: torch.nn.Module, model_path: str) -> Batch:
    """A vision-language prompt batch plus pixel_values and image_grid_thw per row from its `images`
    column (PIL), by model_path's processor (the hf engine takes those, vLLM the images); a batch
    without the column as it is. The actor's rollout and the separate rollout group both call it."""
    if IMAGES not in batch:
        return batch
    return batch.union(Batch(process_images(cached_processor(str(model_path)), model, batch)))


def stack_images(pixel_rows, grid_rows) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows' images in row order as the model takes them: pixel_values [sum patches, D] and
    image_grid_thw [images, 3]; None when no row has an image."""
    pixels = [p for p in pixel_rows if p is not None and len(p)]
    if not pixels:
        return None
    grids = [g for g in grid_rows if g is not None and len(g)]
    return np.concatenate(pixels).astype(np.float32), np.concatenate(grids).astype(np.int64)


def model_inputs(batch, device: torch.device) -> dict:
    """A micro-batch's vision inputs as forward kwargs: pixel_values and image_grid_thw of its rows
    (absent when none has an image) and position_ids [3, b, P+T]; {} for a text batch."""
    if POSITION_IDS not in batch:
        return {}
    out = {POSITION_IDS: torch.from_numpy(np.ascontiguousarray(batch[POSITION_IDS])).to(device).transpose(0, 1)}
    stacked = stack_images(batch[PIXEL_VALUES], batch[IMAGE_GRID_THW]) if PIXEL_VALUES in batch else None
    if stacked is not None:
        out[PIXEL_VALUES] = torch.from_numpy(stacked[0]).to(device)
        out[IMAGE_GRID_THW] = torch.from_numpy(stacked[1]).to(device)
    return out


def pad_turn_positions(out: dict, input_width: int) -> dict:
    """A generate_turn result's position_ids [rows, 3, P'+T] (input part: this rank's widest input P')
    padded on the left to the call's input width W, so every rank's rows line up (and concatenate):
    column W-1 is each row's last input token, as in the call's left-padded input_ids."""
    if POSITION_IDS not in out:
        return out
    positions = out[POSITION_IDS]
    extra = input_width + out["responses"].shape[1] - positions.shape[2]
    return {**out, POSITION_IDS: np.pad(positions, ((0, 0), (0, 0), (extra, 0)))}


def token_types(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """mm_token_type_ids as the processor makes them: 1 on image tokens, 2 on video tokens, else 0."""
    cfg = model.config
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[input_ids == cfg.image_token_id] = 1
    if getattr(cfg, "video_token_id", None) is not None:
        types[input_ids == cfg.video_token_id] = 2
    return types


def prompt_positions(model: torch.nn.Module, input_ids: torch.Tensor, valid: torch.Tensor,
                     image_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE positions [3, B, P] of left-padded prompts (0 on padding) and each row's delta [B]:
    a text token at real index i after the images sits at position i + delta, so the response
    continues at prompt_len + j + delta."""
    positions, deltas = _core(model).get_rope_index(
        input_ids, mm_token_type_ids=token_types(model, input_ids), image_grid_thw=image_grid_thw,
        attention_mask=valid.long())
    return positions, deltas.reshape(-1)


def rollout_positions(prompt_pos: torch.Tensor, deltas: torch.Tensor, prompt_len: torch.Tensor, n: int,
                      response_width: int) -> np.ndarray:
    """The rows' whole positions [B*n, 3, P+T] (prompt-major, like the rollout's rows): the prompt's
    M-RoPE positions, then prompt_len + j + delta on response token j (all three axes: text)."""
    steps = torch.arange(response_width, device=deltas.device)
    response = (prompt_len + deltas)[:, None] + steps[None, :]                # [B, T]
    full = torch.cat([prompt_pos.transpose(0, 1), response[:, None, :].expand(-1, 3, -1)], dim=-1)
    return full.repeat_interleave(n, dim=0).cpu().numpy().astype(np.int64)


def engine_vision(model: torch.nn.Module, input_ids: torch.Tensor, valid: torch.Tensor, rows: dict) -> dict:
    """What the hf engine's prefill takes for left-padded prompts [B, P] whose images are `rows`
    ({pixel_values, image_grid_thw}: one entry per prompt, None without an image): the stacked
    images, the prompts' M-RoPE positions [3, B, P] and deltas [B]."""
    stacked = stack_images(rows[PIXEL_VALUES], rows[IMAGE_GRID_THW])
    out: dict = {}
    if stacked is not None:
        out[PIXEL_VALUES] = torch.from_numpy(stacked[0]).to(input_ids.device)
        out[IMAGE_GRID_THW] = torch.from_numpy(stacked[1]).to(input_ids.device)
    out[POSITION_IDS], out["deltas"] = prompt_positions(model, input_ids, valid, out.get(IMAGE_GRID_THW))
    return out


def batch_positions(model: torch.nn.Module, batch, n: int, response_width: int) -> np.ndarray:
    """position_ids [B*n, 3, P+T] of a prompt batch's rows (left-padded input_ids / attention_mask
    [B, P]) when the engine sampled with its own (vLLM computes the same M-RoPE positions)."""
    device = _device_of(model)
    input_ids = torch.from_numpy(np.ascontiguousarray(batch["input_ids"])).to(device)
    valid = torch.from_numpy(np.ascontiguousarray(batch["attention_mask"])).to(device).bool()
    stacked = stack_images(batch[PIXEL_VALUES], batch[IMAGE_GRID_THW])
    grid = torch.from_numpy(stacked[1]).to(device) if stacked is not None else None
    with torch.no_grad():
        positions, deltas = prompt_positions(model, input_ids, valid, grid)
    return rollout_positions(positions, deltas, valid.sum(-1), n, response_width)


@contextlib.contextmanager
def tower_always_runs(model: torch.nn.Module, micro: dict, sharded: bool) -> Iterator[None]:
    """Training forward of a vision model sharded over > 1 rank whose micro-batch has no image: the
    vision tower runs on one blank image anyway, and its output enters the language model's
    input embeddings times 0 (the value and every gradient unchanged). FSDP2 matches collectives
    by order, so the tower must run where it runs on a rank with images (before the language
    model; in backward, after it): otherwise that rank's tower all-gather meets this rank's
    language-model all-gather (a size mismatch or a hang)."""
    if not sharded or PIXEL_VALUES in micro.get("vision", {}):
        yield
        return

    def add_blank(module, args, kwargs):
        kwargs["inputs_embeds"] = kwargs["inputs_embeds"] + 0.0 * blank_image_embeds(model).mean()
        return args, kwargs

    handle = _core(model).language_model.register_forward_pre_hook(add_blank, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def blank_image_embeds(model: torch.nn.Module) -> torch.Tensor:
    """The vision tower's output for one blank image of the smallest grid (merge x merge patches)."""
    cfg = vision_config(model)
    merge = cfg.spatial_merge_size
    grid = torch.tensor([[1, merge, merge]], device=_device_of(model))
    patch = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    out = vision_tower(model)(torch.zeros(merge * merge, patch, device=grid.device), grid_thw=grid)
    return out.pooler_output if hasattr(out, "pooler_output") else out


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
