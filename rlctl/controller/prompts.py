"""Training prompts: parquet rows -> chat-templated token ids, batched in a seeded, resumable order.

Rows follow the verl schema (rlctl.data.schema). Each prompt is rendered once, up front, with
the tokenizer's chat template; prompts over `max_prompt_length` are filtered, truncated (from
the left, keeping the question's end and the generation prompt) or rejected, per
`data.overlong_prompts`. The order of epoch e is a permutation seeded by (seed, e), so the
loader's whole state is two integers — which is what makes exact resume cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlctl.data.dataset import chat_prompt_ids
from rlctl.errors import DataError


@dataclass(frozen=True)
class PromptRow:
    prompt_ids: list[int]
    data_source: str
    ground_truth: str | dict | list   # text, or verl's struct ground truth (Search-R1: {"target": [...]})
    extra_info: dict
    messages: list
    images: tuple | None = None   # vision-language models: the row's PIL images (maybe none); text models: None


@dataclass
class PromptSet:
    rows: list[PromptRow]
    filtered: int = 0
    truncated: int = 0
    data_sources: dict = field(default_factory=dict)


def read_rows(files: list[Path]) -> list[dict]:
    """All rows of the given parquet files, schema-checked (DataError names the bad column)."""
    from rlctl.data.dataset import load_rows

    rows = load_rows(files)
    if not rows:
        raise DataError(f"no rows in {', '.join(map(str, files))}", hint="prepare data with `rlctl data prep`.")
    return rows


def render_prompts(rows: list[dict], tokenizer, max_prompt_length: int, overlong: str,
                   tools: list[dict] | None = None, vision: "VisionData | None" = None) -> PromptSet:
    """Tokenize every row's chat prompt once; apply the overlong policy; count what happened.
    `vision` (a vision-language model): rows are read with their images and their prompts go
    through the processor, which expands each image's placeholder to its patch count."""
    out = PromptSet(rows=[])
    for i, row in enumerate(rows):
        images = None
        if vision is None:
            ids = chat_prompt_ids(row["prompt"], tokenizer, tools)
        else:
            ids, images = vision.encode(row, i, tools)
        if len(ids) > max_prompt_length:
            if overlong == "error":
                raise DataError(f"row {i} ({row['data_source']}) has a {len(ids)}-token prompt, over "
                                f"data.max_prompt_length = {max_prompt_length}",
                                hint="raise the limit, or set data.overlong_prompts = \"filter\" or \"truncate\".")
            if overlong == "filter":
                out.filtered += 1
                continue
            if images:
                raise DataError(f"row {i} ({row['data_source']}) has a {len(ids)}-token prompt with images, over "
                                f"data.max_prompt_length = {max_prompt_length}: cutting it would cut image tokens",
                                hint="raise the limit, or set data.overlong_prompts = \"filter\".")
            ids = ids[-max_prompt_length:]
            out.truncated += 1
        reward_model = row.get("reward_model") or {}
        out.rows.append(PromptRow(prompt_ids=ids, data_source=row["data_source"],
                                  ground_truth=_truth(reward_model.get("ground_truth", "")),
                                  extra_info=dict(row.get("extra_info") or {}), messages=row["prompt"],
                                  images=images))
        out.data_sources[row["data_source"]] = out.data_sources.get(row["data_source"], 0) + 1
    if not out.rows:
        raise DataError(f"every prompt is longer than data.max_prompt_length = {max_prompt_length} "
                        f"({out.filtered} filtered)", hint="raise data.max_prompt_length.")
    return out


class VisionData:
    """How a vision-language model reads a row: its images (rlctl.data.images: checked, one line
    naming the row) and its chat prompt through the processor (rlctl.models.vision.encode_prompt)."""

    def __init__(self, model_path: str, image_key: str, source: str):
        from rlctl.models.vision import load_processor, processor_max_pixels

        self.processor, self.image_key, self.source = load_processor(model_path), image_key, source
        self.max_pixels = processor_max_pixels(self.processor)

    def encode(self, row: dict, index: int, tools: list[dict] | None) -> tuple[list[int], tuple]:
        from rlctl.data.images import load_vision_row
        from rlctl.models.vision import encode_prompt

        messages, images = load_vision_row(row, image_key=self.image_key, max_pixels=self.max_pixels,
                                           index=index, source=self.source)
        return encode_prompt(self.processor, messages, images, tools)["input_ids"].tolist(), tuple(images)


class PromptLoader:
    """Batches of `batch_size` prompts; epoch e is a permutation seeded by (seed, e); drops the tail."""

    def __init__(self, prompts: PromptSet, batch_size: int, *, seed: int, shuffle: bool = True):
        if len(prompts.rows) < batch_size:
            raise DataError(f"{len(prompts.rows)} usable prompts but data.batch_size = {batch_size}",
                            hint="lower data.batch_size or add training rows.")
        self.rows, self.batch_size, self.seed, self.shuffle = prompts.rows, batch_size, seed, shuffle
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_batch(self) -> list[PromptRow]:
        if self.cursor + self.batch_size > len(self.rows):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        idx = self._order[self.cursor:self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return [self.rows[i] for i in idx]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


def _truth(value):
    """A row's ground truth as the reward gets it: text, or verl's struct (Search-R1's {"target": [...]})
    as the dict / list it is, as verl's reward managers pass it."""
    return value if isinstance(value, (dict, list)) else str(value)
