"""The synthetic visual task `shapes`: coloured shapes on a small canvas; say their colour, then count them.

Offline and seeded, for vision-language RL on CPU with a tiny model. Each image is a CANVAS x CANVAS
(56 x 56) white canvas cut into a 2 x 2 grid of 28-pixel cells (one Qwen2.5-VL image token per
cell: 14-pixel patches, merged 2 x 2); 1..4 cells hold a square, circle or triangle of one colour
(red, green or blue), of random size and place inside its cell. Nothing but the image says the
colour or the count, so a model that ignores the image scores the no-image baseline that
`rlctl data prep` prints (chance, and the majority answer of the training split).

    shapes         "red 3"   the colour, then the count; data_source rlctl/shapes
    shapes-colour  "red"     the colour only (the first stage, learnt sooner); data_source rlctl/shapes-colour

Reward (verl signature), shaped so a random byte-level model gets a signal before it writes the
exact words: per part, 1 when right; the colour part also earns the share of the colour's leading
letters the response gets right (r/g/b: the first letter already decides it). score = 1.0 for the
exact answer, else the mean of the parts times 0.9; `acc` is exact, `colour_acc` / `count_acc` per part.
Test images are held out: no test image's pixels equal a training image's.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter

from rlctl.data.sources import Generated, PrepSource, rule_row

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 30), "blue": (30, 60, 220)}
KINDS = ("square", "circle", "triangle")
CANVAS, CELL, MAX_COUNT = 56, 28, 4
ROWS = 2400                   # train + test, before the test share is carved out
DEFAULT_VAL_FRACTION = 1 / 12
DATA_SOURCE, COLOUR_SOURCE = "rlctl/shapes", "rlctl/shapes-colour"
DATA_SOURCES = (DATA_SOURCE, COLOUR_SOURCE)
QUESTIONS = {DATA_SOURCE: "<image>Colour and number of the shapes? Reply like: red 2",
             COLOUR_SOURCE: "<image>Colour of the shapes? Reply with one word."}
_WORD = re.compile(r"[a-z]+|\d+")


def _draw(rng: random.Random, colour: str, count: int):
    """One canvas: `count` shapes of `colour` in distinct cells; returns (PIL image, shape kinds)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (CANVAS, CANVAS), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    cells = rng.sample([(x, y) for y in range(CANVAS // CELL) for x in range(CANVAS // CELL)], count)
    kinds = []
    for cx, cy in cells:
        size = rng.randint(10, 20)
        x0 = cx * CELL + rng.randint(2, CELL - size - 2)
        y0 = cy * CELL + rng.randint(2, CELL - size - 2)
        box, kind = (x0, y0, x0 + size, y0 + size), rng.choice(KINDS)
        fill = COLOURS[colour]
        if kind == "square":
            draw.rectangle(box, fill=fill)
        elif kind == "circle":
            draw.ellipse(box, fill=fill)
        else:
            draw.polygon([(x0, y0 + size), (x0 + size, y0 + size), (x0 + size // 2, y0)], fill=fill)
        kinds.append(kind)
    return img, kinds


def _row(data_source: str, image, colour: str, count: int, kinds: list, split: str, index: int) -> dict:
    from rlctl.data.images import to_png_struct

    truth = colour if data_source == COLOUR_SOURCE else f"{colour} {count}"
    question = QUESTIONS[data_source]
    row = rule_row(data_source, [{"role": "user", "content": question}], "vision", truth, split, index,
                   question=question, answer=truth)
    row["extra_info"].update(colour=colour, count=count, shapes=",".join(kinds))
    row["images"] = [to_png_struct(image)]
    return row


def _generate(data_source: str, seed: int, val_fraction: float) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: ROWS distinct images; a seeded share of them is the test split."""
    rng, seen, drawn = random.Random(seed), set(), []
    while len(drawn) < ROWS:
        colour, count = rng.choice(sorted(COLOURS)), rng.randint(1, MAX_COUNT)
        image, kinds = _draw(rng, colour, count)
        digest = hashlib.sha256(image.tobytes()).digest()
        if digest not in seen:   # every image once: the test images are never training images
            seen.add(digest)
            drawn.append((image, colour, count, kinds))
    n_test = round(ROWS * val_fraction)
    splits = {"train": drawn[n_test:], "test": drawn[:n_test]}
    return {split: [_row(data_source, *item, split, i) for i, item in enumerate(items)]
            for split, items in splits.items() if items}


def generate(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    return _generate(DATA_SOURCE, seed, val_fraction)


def generate_colour(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    return _generate(COLOUR_SOURCE, seed, val_fraction)


def arrow_schema():
    """rlctl's row schema plus the images column and the image facts in extra_info."""
    import pyarrow as pa

    from rlctl.data.images import with_images_column
    from rlctl.data.schema import arrow_schema as row_schema

    return with_images_column(row_schema(extra_info=(("colour", pa.string()), ("count", pa.int64()),
                                                     ("shapes", pa.string()))))


def baseline(splits: dict[str, list[dict]]) -> list[str]:
    """The no-image baseline: chance, and the training split's majority answer scored on the test split."""
    train, test = splits.get("train", []), splits.get("test") or splits.get("train", [])
    truths = Counter(r["reward_model"]["ground_truth"] for r in train)
    majority, _ = truths.most_common(1)[0]
    hits = sum(r["reward_model"]["ground_truth"] == majority for r in test)
    source = train[0]["data_source"]
    chance = 1 / len(COLOURS) if source == COLOUR_SOURCE else 1 / (len(COLOURS) * MAX_COUNT)
    colour_hits = sum(r["extra_info"]["colour"] == majority.split()[0] for r in test)
    return [f"no-image baseline: chance {chance:.1%} exact; always answering the training majority {majority!r} "
            f"scores {hits / len(test):.1%} exact and {colour_hits / len(test):.1%} colour on the "
            f"{len(test)} held-out images (acc above this needs the image)"]


def _prefix_share(said: str, truth: str) -> float:
    n = 0
    for a, b in zip(said, truth):
        if a != b:
            break
        n += 1
    return n / len(truth)


def score(solution_str: str, ground_truth: str) -> dict:
    """`score` in [0, 1], `acc` (exact), `colour_acc` and `count_acc` (see the module docstring)."""
    said, truth = solution_str.strip().lower(), str(ground_truth).strip().lower().split()
    words = _WORD.findall(said)
    colour_said = next((w for w in words if not w.isdigit()), said)
    colour_part = 1.0 if colour_said == truth[0] else _prefix_share(said, truth[0])
    parts = {"colour_acc": float(colour_said == truth[0])}
    if len(truth) > 1:
        numbers = [w for w in words if w.isdigit()]
        parts["count_acc"] = float(bool(numbers) and numbers[0] == truth[1])
        partial = (colour_part + parts["count_acc"]) / 2
    else:
        partial = colour_part
    exact = said == " ".join(truth)
    return {"score": 1.0 if exact else 0.9 * partial, "acc": float(exact), **parts}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """The shapes tasks' reward (format_score unused: the shaping is built in)."""
    return score(solution_str, ground_truth)


REWARDS = {"shapes": compute_score}
_NO_SFT = "is image data, and SFT of vision-language models is not built (GRPO trains them: docs/vision.md)"
PREP = (
    PrepSource("shapes", Generated(DATA_SOURCE, generate, DEFAULT_VAL_FRACTION, arrow_schema, baseline),
               help="synthetic coloured shapes on 56x56 images: colour, then count (vision)", no_sft=_NO_SFT),
    PrepSource("shapes-colour", Generated(COLOUR_SOURCE, generate_colour, DEFAULT_VAL_FRACTION, arrow_schema,
                                          baseline), help="the shapes images, colour only (vision)", no_sft=_NO_SFT),
)
