"""`rlctl data inspect`: what is in a parquet file, and how long its prompts are in tokens."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

from rlctl.data.dataset import prompt_token_lengths, read_parquet
from rlctl.data.images import DEFAULT_IMAGE_KEY, image_report, load_vision_row
from rlctl.errors import DataError
from rlctl.models.loading import load_tokenizer
from rlctl.models.vision import encode_prompt, processor_max_pixels

PERCENTILES = (50, 90, 95, 99)
HISTOGRAM_BINS = 10
SAMPLE_CHARS = 160


def _counts(values) -> dict:
    """{value: count}, most common first."""
    return dict(Counter(values).most_common())


def _sample(row: dict) -> dict:
    """A short view of one row: its data source, last prompt message and ground truth."""
    last = row["prompt"][-1]["content"] if row["prompt"] else ""
    text = last if len(last) <= SAMPLE_CHARS else last[: SAMPLE_CHARS - 3] + "..."
    return {"data_source": row["data_source"], "roles": [m["role"] for m in row["prompt"]],
            "prompt": text, "ground_truth": row["reward_model"]["ground_truth"]}


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (q in (0, 100])."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def histogram(values: list[int], bins: int = HISTOGRAM_BINS) -> list[dict]:
    """Equal-width integer bins [lo, hi] over min..max, each with its count."""
    lo, hi = min(values), max(values)
    width = max(1, math.ceil((hi - lo + 1) / bins))
    edges = list(range(lo, hi + 1, width))
    counts = [0] * len(edges)
    for v in values:
        counts[(v - lo) // width] += 1
    return [{"lo": e, "hi": min(e + width - 1, hi), "count": c} for e, c in zip(edges, counts)]


def length_report(lengths: list[int], tokenizer, max_prompt_length: int | None) -> dict:
    """Prompt lengths in tokens after the chat template: stats, percentiles, histogram, over limit."""
    ordered = sorted(lengths)
    report = {
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "min": ordered[0], "mean": round(sum(ordered) / len(ordered), 1), "max": ordered[-1],
        "percentiles": {f"p{q}": percentile(ordered, q) for q in PERCENTILES},
        "histogram": histogram(ordered),
    }
    if max_prompt_length is not None:
        over = sum(n > max_prompt_length for n in lengths)
        report.update(max_prompt_length=max_prompt_length, over_limit=over,
                      over_limit_share=round(over / len(lengths), 4))
    return report


def inspect_file(path: str | os.PathLike, *, model: str | None = None, max_prompt_length: int | None = None,
                 samples: int = 3, image_key: str = DEFAULT_IMAGE_KEY) -> dict:
    """Validate `path` (DataError naming the wrong column, or the first bad image row) and describe
    it; token lengths with `model` (a vision-language model's count its image tokens)."""
    from rlctl.data.dataset import load_rows

    table = read_parquet(Path(path))
    rows = load_rows([Path(path)], image_key) if image_key in table.column_names else table.to_pylist()
    if not rows:
        raise DataError(f"{path} has no rows", hint="re-run `rlctl data prep`.")
    splits = [(r.get("extra_info") or {}).get("split") for r in rows]
    report = {
        "file": str(path),
        "rows": len(rows),
        "columns": table.column_names,
        "data_sources": _counts(r["data_source"] for r in rows),
        "abilities": _counts(r.get("ability") for r in rows) if "ability" in table.column_names else {},
        "splits": _counts(s for s in splits if s is not None),
        # an environment library's rows may have none by design (its environment holds the answer)
        "empty_ground_truth": sum(not str(r["reward_model"]["ground_truth"]).strip() for r in rows
                                  if _has_ground_truth(r["data_source"])),
        "samples": [_sample(r) for r in rows[:samples]],
    }
    processor = vision_processor(model) if model is not None else None
    if image_key in table.column_names:
        report["images"] = image_report(rows, image_key=image_key, source=Path(path).name,
                                        max_pixels=processor_max_pixels(processor) if processor else None)
    if processor is not None:
        lengths = [len(encode_prompt(processor, *load_vision_row(r, image_key=image_key))["input_ids"]) for r in rows]
        report["prompt_tokens"] = {"model": str(model), **length_report(lengths, processor.tokenizer,
                                                                         max_prompt_length)}
    elif model is not None:
        tokenizer = load_tokenizer(model, trust_remote_code=None, key="--model")
        lengths = prompt_token_lengths([r["prompt"] for r in rows], tokenizer)
        report["prompt_tokens"] = {"model": str(model), **length_report(lengths, tokenizer, max_prompt_length)}
    return report


def _has_ground_truth(data_source) -> bool:
    from rlctl.rollouts.table import environment_of

    env = environment_of(data_source)
    return env is None or env.ground_truth


def vision_processor(model: str):
    """The processor of a local vision-language model folder; None for a text model (or a hub id)."""
    from rlctl.models.vision import is_vision_model, load_processor

    return load_processor(model) if is_vision_model(model) else None
