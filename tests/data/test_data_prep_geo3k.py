"""`rlctl data prep geo3k --source DIR` reads the Geometry3K layout verl's example reads
(data/{train,validation,test}-*.parquet: problem with `<image>`, answer, images) into verl rows
with the images kept (a relative path's file read in), the same question over another figure kept
as its own row, a row whose markers do not match its images refused; verl's geo3k reward scores it."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from rlctl.cli.main import main
from rlctl.tasks import geo3k


def _png(shade: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (shade, shade, shade)).save(buf, format="PNG")
    return buf.getvalue()


def _layout(root):
    (root / "data").mkdir(parents=True)
    (root / "data" / "fig.png").write_bytes(_png(9))
    train = [{"problem": "<image>Find x.", "answer": "5", "images": [{"bytes": _png(1), "path": None}]},
             {"problem": "<image>Find x.", "answer": "5", "images": [{"bytes": _png(2), "path": None}]},
             {"problem": "<image>Find y.", "answer": "2\\sqrt{3}", "images": [{"bytes": None, "path": "fig.png"}]},
             {"problem": "Find z.", "answer": "1", "images": [{"bytes": _png(3), "path": None}]}]
    test = [{"problem": "<image>Find m \\angle 1.", "answer": "60", "images": [{"bytes": _png(4), "path": None}]}]
    for split, rows in (("train", train), ("test", test)):
        pq.write_table(pa.Table.from_pylist(rows), root / "data" / f"{split}-00000-of-00001.parquet")


def test_prep_geo3k_keeps_images_and_refuses_mismatched_rows(tmp_path, capsys):
    _layout(tmp_path / "src")
    out = tmp_path / "out"
    assert main(["data", "prep", "geo3k", "--source", str(tmp_path / "src"), "--out", str(out)]) == 3
    assert "1 <image> marker(s) but" not in (err := capsys.readouterr().err) and "0 <image> marker(s) but 1" in err
    assert main(["data", "prep", "geo3k", "--source", str(tmp_path / "src"), "--out", str(out),
                 "--on-error", "skip", "--format", "json"]) == 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["5", "5", "2\\sqrt{3}"]   # "Find x." twice
    assert rows[0]["data_source"] == "hiyouga/geometry3k" and rows[0]["ability"] == "math"
    assert rows[0]["prompt"] == [{"role": "user", "content": "<image>Find x. " + geo3k.INSTRUCTION}]
    assert rows[2]["images"] == [{"bytes": _png(9), "path": "fig.png"}]   # the file's bytes, now in the row
    assert main(["data", "inspect", str(out / "test.parquet"), "--format", "json"]) == 0


def test_geo3k_reward_is_verls():
    good = "<think>angles</think> so \\boxed{60}"
    assert geo3k.score(good, "60") == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert geo3k.score("\\boxed{60}", "60")["score"] == 0.9
    assert geo3k.score("<think>x</think> \\boxed{61}", "60")["score"] == 0.1
    assert geo3k.score("<think>x</think> \\boxed{\\frac{1}{2}}", "0.5")["acc"] == 1.0
