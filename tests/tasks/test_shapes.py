"""The synthetic visual task: each image shows what its answer says (colour from the pixels, count
from the occupied cells), test images are held out, the reward gives partial credit per part, and
`rlctl data prep shapes` writes verl rows with an images column and prints the no-image baseline."""

from __future__ import annotations

import io

from rlctl.tasks import shapes


def _decode(row):
    from PIL import Image

    return Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")


def _seen(image):
    """(colour, count) read back from the pixels: the non-white colour, and the cells holding it."""
    pixels = image.load()
    found = {}
    for y in range(shapes.CANVAS):
        for x in range(shapes.CANVAS):
            if pixels[x, y] != (255, 255, 255):
                found.setdefault(pixels[x, y], set()).add((x // shapes.CELL, y // shapes.CELL))
    colour = max(found, key=lambda c: len(found[c]))    # anti-aliasing aside, one fill colour
    name = next(n for n, rgb in shapes.COLOURS.items() if rgb == colour)
    return name, len(found[colour])


def test_each_image_shows_its_answer_and_test_images_are_held_out():
    splits = shapes.generate(seed=5)
    assert {s: len(r) for s, r in splits.items()} == {"train": 2200, "test": 200}
    for row in splits["train"][:40] + splits["test"][:40]:
        colour, count = row["reward_model"]["ground_truth"].split()
        image = _decode(row)
        assert image.size == (56, 56) and _seen(image) == (colour, int(count))
        assert row["prompt"][0]["content"].count("<image>") == len(row["images"]) == 1
    train = {_decode(r).tobytes() for r in splits["train"]}
    assert not any(_decode(r).tobytes() in train for r in splits["test"])
    again = shapes.generate(seed=5)["test"][:5]
    assert [r["images"] for r in again] == [r["images"] for r in splits["test"][:5]]


def test_reward_exact_and_partial_credit():
    assert shapes.score(" red 3\n", "red 3") == {"score": 1.0, "acc": 1.0, "colour_acc": 1.0, "count_acc": 1.0}
    wrong_count = shapes.score("red 2", "red 3")
    assert wrong_count["acc"] == 0 and wrong_count["colour_acc"] == 1 and wrong_count["score"] == 0.45
    assert shapes.score("blue 3", "red 3")["score"] == 0.45
    assert shapes.score("r", "red")["score"] == 0.3 and shapes.score("g", "red")["score"] == 0.0
    assert shapes.score("green", "green")["score"] == 1.0


def test_prep_writes_images_and_prints_the_no_image_baseline(tmp_path, capsys):
    import pyarrow.parquet as pq

    from rlctl.cli.main import main
    from rlctl.data.images import check_rows

    assert main(["data", "prep", "shapes-colour", "--out", str(tmp_path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "no-image baseline: chance 33.3% exact" in printed
    table = pq.read_table(tmp_path / "test.parquet")
    assert table.schema.field("images").type.value_type.names == ["bytes", "path"]
    rows = table.to_pylist()
    assert check_rows(rows) == [] and {r["reward_model"]["ground_truth"] for r in rows} == set(shapes.COLOURS)
    assert main(["data", "prep", "shapes", "--sft", "--out", str(tmp_path / "sft")]) == 2   # no VLM SFT yet
    assert "SFT of vision-language models is not built" in capsys.readouterr().err
