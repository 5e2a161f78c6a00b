"""Batch: rows of numpy arrays that split, join and select without losing order."""

import numpy as np
import pytest

from rlctl.runtime import Batch


def _batch(rows=7):
    uid = np.empty(rows, dtype=object)
    uid[:] = [f"u{i}" for i in range(rows)]
    return Batch({"x": np.arange(rows * 3).reshape(rows, 3), "uid": uid}, {"temperature": 0.7})


def test_rows_must_share_first_dimension():
    b = _batch()
    with pytest.raises(ValueError, match="has 2 rows but the batch has 7"):
        b["y"] = np.zeros((2, 3))
    with pytest.raises(ValueError, match="row dimension"):
        b["s"] = np.float32(1.0)


def test_split_chunk_concat_roundtrip_keeps_order_and_meta():
    b = _batch(7)
    parts = b.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    chunks = b.chunk(3)
    assert [len(p) for p in chunks] == [3, 2, 2]
    for pieces in (parts, chunks):
        joined = Batch.concat(pieces)
        assert np.array_equal(joined["x"], b["x"]) and list(joined["uid"]) == list(b["uid"])
        assert joined.meta == {"temperature": 0.7}
    with pytest.raises(ValueError, match="do not split evenly"):
        b.chunk(2, even=True)


def test_select_repeat_union():
    b = _batch(3)
    picked = b.select([2, 0])
    assert picked["x"][:, 0].tolist() == [6, 0] and list(picked["uid"]) == ["u2", "u0"]
    rep = b.repeat(2)
    assert rep["x"][:, 0].tolist() == [0, 0, 3, 3, 6, 6]
    both = b.union(Batch({"y": np.ones(3)}, {"step": 1}))
    assert sorted(both.keys()) == ["uid", "x", "y"] and both.meta == {"temperature": 0.7, "step": 1}
    with pytest.raises(ValueError, match="cannot join"):
        b.union(Batch({"y": np.ones(4)}))


def test_concat_rejects_different_keys():
    with pytest.raises(ValueError, match="cannot concat"):
        Batch.concat([Batch({"a": np.ones(1)}), Batch({"b": np.ones(1)})])


def test_torch_roundtrip_goes_through_numpy():
    torch = pytest.importorskip("torch")
    b = Batch({"ids": np.arange(4).reshape(2, 2), "w": torch.ones(2, 3, dtype=torch.bfloat16)})
    assert isinstance(b["w"], np.ndarray) and b["w"].dtype == np.float32  # bf16 has no numpy type
    t = _batch(2).to_torch()
    assert set(t) == {"x"} and t["x"].dtype == torch.int64  # object columns stay behind
