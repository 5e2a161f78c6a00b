"""Images in verl rows (rlctl.data.images): markers become content parts, the images column is
decoded from PNG bytes or paths relative to the parquet file, and each bad row is one DataError
line that names the row: a marker/image count mismatch, a missing file, bytes that are no image,
an image far larger than the processor's maximum."""

from __future__ import annotations

import pytest

from rlctl.data.images import (check_rows, load_vision_row, split_markers, to_png_struct, vision_messages)
from rlctl.errors import DataError


def _image(colour=(200, 0, 0), size=(32, 24)):
    from PIL import Image

    return Image.new("RGB", size, colour)


def _row(content="<image>What colour?", images=None, index=7):
    return {"data_source": "x", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": "red"}, "extra_info": {"index": index},
            "images": [to_png_struct(_image())] if images is None else images}


def test_markers_become_content_parts_in_order():
    assert split_markers("a <image> b<image>") == [{"type": "text", "text": "a "}, {"type": "image"},
                                                   {"type": "text", "text": " b"}, {"type": "image"}]
    system = {"role": "system", "content": "no images here"}
    out = vision_messages([system, {"role": "user", "content": "<image>x"}])
    assert out[0] is system and out[1]["content"] == [{"type": "image"}, {"type": "text", "text": "x"}]


def test_png_bytes_decode_and_a_text_row_has_no_images():
    messages, images = load_vision_row(_row())
    assert [im.size for im in images] == [(32, 24)] and images[0].getpixel((0, 0)) == (200, 0, 0)
    assert messages[0]["content"][0] == {"type": "image"}
    text = {**_row(content="plain"), "images": []}
    assert load_vision_row(text) == (text["prompt"], [])


def test_paths_relative_to_the_parquet_file_are_resolved_by_load_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.data.dataset import load_rows

    (tmp_path / "imgs").mkdir()
    _image((0, 0, 200)).save(tmp_path / "imgs" / "a.png")
    row = _row(images=[{"bytes": None, "path": "imgs/a.png"}])
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "d.parquet")
    elsewhere = load_rows([tmp_path / "d.parquet"])[0]   # the row no longer knows its file's folder
    assert elsewhere["images"][0]["path"] == str(tmp_path / "imgs" / "a.png")
    assert load_vision_row(elsewhere)[1][0].getpixel((0, 0)) == (0, 0, 200)


@pytest.mark.parametrize("row, says", [
    (_row(content="<image> and <image>"), "row 3 (extra_info.index 7) has 2 <image> marker(s) in its prompt but 1 "
                                          "image(s) in column 'images'"),
    (_row(images=[{"bytes": None, "path": "/nowhere/x.png"}]), "image file /nowhere/x.png does not exist"),
    (_row(images=[{"bytes": b"\x89PNG not really", "path": None}]), "15 bytes are not a readable image"),
    (_row(images=[to_png_struct(_image(size=(700, 700)))]), "is 700x700 = 490,000 pixels, over 4x the processor's "
                                                            "maximum of 50,176"),
])
def test_each_bad_row_is_one_line_naming_the_row(row, says):
    with pytest.raises(DataError) as e:
        load_vision_row(row, max_pixels=224 * 224, index=3, source="train.parquet")
    assert says in e.value.message and e.value.message.startswith("train.parquet row 3")
    assert "\n" not in str(e.value) and e.value.exit_code == 3 and e.value.hint


def test_check_rows_reports_every_bad_row():
    rows = [_row(), _row(content="none"), _row(images=[{"bytes": b"xx", "path": None}], index=2)]
    problems = check_rows(rows, max_pixels=224 * 224, source="f.parquet")
    assert [p.split(" has ")[0].split(" image 0")[0] for p in problems] == [
        "f.parquet row 1 (extra_info.index 7)", "f.parquet row 2"]
