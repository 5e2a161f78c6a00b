"""Bad images stop a run before anything starts: `rlctl config validate` and `rlctl train` report
each bad row in one line naming it (count mismatch, missing file, unreadable bytes, an image far
over the processor's maximum) and exit 3; `rlctl data inspect` shows image counts and sizes and
exits 3 on the same rows; a text-only model given image data is a config error (exit 2)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.cli.main import main
from rlctl.data.images import to_png_struct

TOML = """[run]
name = "vl"
output_dir = "runs"
total_steps = 1
[model]
path = "{model}"
[data]
train_files = ["train.parquet"]
batch_size = 4
max_prompt_length = 128
max_response_length = 8
[rollout]
n = 2
"""


def _big_png():
    from PIL import Image

    return to_png_struct(Image.new("RGB", (500, 500), (0, 0, 255)))


BAD = {
    "mismatch": (lambda row: {**row, "prompt": [{"role": "user", "content": "<image><image>Colour?"}]},
                 "train.parquet row 5 has 2 <image> marker(s) in its prompt but 1 image(s)"),
    "missing": (lambda row: {**row, "images": [{"bytes": None, "path": "gone.png"}]}, "gone.png does not exist"),
    "unreadable": (lambda row: {**row, "images": [{"bytes": b"GIF89a-nope", "path": None}]},
                   "train.parquet row 5 image 0: 11 bytes are not a readable image"),
    "too large": (lambda row: {**row, "images": [_big_png()]}, "is 500x500 = 250,000 pixels, over 4x the "
                                                               "processor's maximum of 50,176"),
}


def _project(tmp_path, model, shapes_dir, bad=None):
    table = pq.read_table(shapes_dir / "test.parquet")
    rows = table.slice(0, 8).to_pylist()
    if bad:
        rows[5] = BAD[bad][0](rows[5])
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(TOML.format(model=model))
    return tmp_path / "rlctl.toml"


@pytest.mark.parametrize("bad", list(BAD))
def test_validate_names_the_bad_row_and_exits_3(tmp_path, tiny_vlm_dir, shapes_dir, bad, capsys):
    toml = _project(tmp_path, tiny_vlm_dir, shapes_dir, bad)
    assert main(["config", "validate", str(toml), "--format", "json"]) == 3
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert len(errors) == 1 and BAD[bad][1] in errors[0] and "\n" not in errors[0]
    assert errors[0].split(": ", 2)[1] == "data.train_files"


def test_good_images_validate_and_inspect_shows_counts_and_sizes(tmp_path, tiny_vlm_dir, shapes_dir, capsys):
    toml = _project(tmp_path, tiny_vlm_dir, shapes_dir)
    assert main(["config", "validate", str(toml), "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["data", "inspect", str(tmp_path / "train.parquet"), "--model", str(tiny_vlm_dir),
                 "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == {"column": "images", "rows_with_images": 8, "images": 8,
                                "per_row": {"min": 1, "mean": 1.0, "max": 1},
                                "width": {"min": 56, "mean": 56.0, "max": 56},
                                "height": {"min": 56, "mean": 56.0, "max": 56}}
    assert report["prompt_tokens"]["max"] == 75   # 4 image tokens, not the 7 bytes of "<image>"


def test_train_and_inspect_refuse_bad_rows_with_exit_3_and_start_nothing(tmp_path, tiny_vlm_dir, shapes_dir, capsys):
    toml = _project(tmp_path, tiny_vlm_dir, shapes_dir, "unreadable")
    assert main(["train", str(toml)]) == 3
    err = capsys.readouterr().err
    assert "row 5 image 0: 11 bytes are not a readable image" in err
    assert "nothing was started" in err and not (tmp_path / "runs").exists()
    assert main(["data", "inspect", str(tmp_path / "train.parquet")]) == 3
    assert "row 5 image 0" in capsys.readouterr().err


def test_a_text_model_with_image_data_is_a_config_error(tmp_path, tiny_model_dir, shapes_dir, capsys):
    toml = _project(tmp_path, tiny_model_dir, shapes_dir)
    assert main(["config", "validate", str(toml), "--format", "json"]) == 2
    assert "is a text-only model but train.parquet has images" in json.loads(capsys.readouterr().out)["errors"][0]
