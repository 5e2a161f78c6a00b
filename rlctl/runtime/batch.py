"""`Batch`: the one container that travels between the controller and the workers.

A Batch is a dict of numpy arrays that all share their first dimension (B rows), plus a small
`meta` dict (plain JSON-able values: temperature, step, ...). Numpy, never torch, goes through the
Ray object store: a 50 MB numpy array moves in 1-2 ms, the same torch tensor in 75-300 ms.
Per-row strings (uid, ground truth) are numpy object arrays and ride along untouched.

The keys the workers read and write (B rows; P = prompt width, T = response width):

    input_ids       int64   [B, P+T]  left-padded prompt ++ right-padded response
    attention_mask  int64   [B, P+T]  1 on real tokens (prompt and response), 0 on padding
    prompts         int64   [B, P]    the left-padded prompt part of input_ids
    responses       int64   [B, T]    the right-padded response part of input_ids
    response_mask   float32 [B, T]    1 on response tokens that count in losses
    response_length int64   [B]       real response tokens per row
    old_log_prob    float32 [B, T]    log pi_old(response token), 0 on padding
    ref_log_prob    float32 [B, T]    log pi_ref(response token)
    entropy         float32 [B, T]    entropy of the policy at each response position
    values          float32 [B, T]    critic values V(s_t) before each response token
    advantages      float32 [B, T]
    returns         float32 [B, T]
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np


class Batch:
    """Rows of numpy arrays sharing dimension 0, plus a small `meta` dict copied to every part."""

    __slots__ = ("tensors", "meta")

    def __init__(self, tensors: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None):
        self.tensors: dict[str, np.ndarray] = {}
        self.meta: dict[str, Any] = dict(meta or {})
        for key, value in (tensors or {}).items():
            self[key] = value

    # --- mapping-like access -------------------------------------------------------------
    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.tensors[key]
        except KeyError:
            raise KeyError(f"batch has no {key!r}; it has {sorted(self.tensors)}") from None

    def __setitem__(self, key: str, value: Any) -> None:
        array = _as_numpy(value)
        if array.ndim == 0:
            raise ValueError(f"batch[{key!r}] must have a row dimension; put scalars in batch.meta")
        if self.tensors and array.shape[0] != len(self):
            raise ValueError(f"batch[{key!r}] has {array.shape[0]} rows but the batch has {len(self)}")
        self.tensors[key] = array

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get(self, key: str) -> np.ndarray | None:
        return self.tensors.get(key)

    def pop(self, key: str) -> np.ndarray:
        return self.tensors.pop(key)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.tensors.items())
        return f"Batch(rows={len(self)}, {shapes}, meta={self.meta})"

    # --- row operations --------------------------------------------------------------------
    def select(self, indices: Sequence[int] | np.ndarray) -> "Batch":
        """Rows `indices` in that order (fancy indexing: copies)."""
        idx = np.asarray(indices, dtype=np.int64)
        return Batch({k: v[idx] for k, v in self.tensors.items()}, self.meta)

    def slice(self, start: int, stop: int) -> "Batch":
        """Rows [start, stop) as views (no copy)."""
        return Batch({k: v[start:stop] for k, v in self.tensors.items()}, self.meta)

    def select_keys(self, keys: Iterable[str]) -> "Batch":
        return Batch({k: self[k] for k in keys}, self.meta)

    def split(self, size: int) -> list["Batch"]:
        """Consecutive parts of `size` rows; the last part holds the remainder."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        return [self.slice(i, min(i + size, len(self))) for i in range(0, len(self), size)]

    def chunk(self, parts: int, *, even: bool = False) -> list["Batch"]:
        """`parts` consecutive parts whose sizes differ by at most one (earlier parts larger).

        even=True insists on equal parts and raises ValueError naming the sizes otherwise.
        """
        if even and len(self) % parts:
            raise ValueError(f"{len(self)} rows do not split evenly into {parts} parts")
        bounds = chunk_bounds(len(self), parts)
        return [self.slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    def repeat(self, n: int) -> "Batch":
        """Each row n times in a row (row i becomes rows i*n .. i*n+n-1), like GRPO groups."""
        return Batch({k: np.repeat(v, n, axis=0) for k, v in self.tensors.items()}, self.meta)

    def union(self, other: "Batch") -> "Batch":
        """Keys of both batches (same rows); `other` wins on a clash, metas are merged."""
        if self.tensors and other.tensors and len(self) != len(other):
            raise ValueError(f"cannot join batches of {len(self)} and {len(other)} rows")
        return Batch({**self.tensors, **other.tensors}, {**self.meta, **other.meta})

    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        """Rows of all batches in order; every batch must have the same keys and trailing shapes."""
        batches = [b for b in batches if b.tensors]
        if not batches:
            return Batch()
        keys = batches[0].keys()
        for b in batches[1:]:
            if sorted(b.keys()) != sorted(keys):
                raise ValueError(f"cannot concat batches with keys {sorted(keys)} and {sorted(b.keys())}")
        merged = {k: np.concatenate([b[k] for b in batches], axis=0) for k in keys}
        return Batch(merged, batches[0].meta)

    # --- torch -----------------------------------------------------------------------------
    def to_torch(self, device: Any = None, keys: Iterable[str] | None = None) -> dict:
        """Numeric arrays as torch tensors on `device` (object arrays are left out)."""
        import torch

        out = {}
        for k in keys if keys is not None else self.keys():
            v = self[k]
            if v.dtype != object:
                out[k] = torch.from_numpy(np.ascontiguousarray(v)).to(device)
        return out


def object_array(values: list) -> np.ndarray:
    """A 1-D object array with one element per value (np.array would turn equal-length lists, such
    as chat message lists, into a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _as_numpy(value: Any) -> np.ndarray:
    """numpy arrays stay as they are; torch tensors come to the CPU (bf16/fp16 -> float32)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        t = value.detach().cpu()
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.numpy()
    return np.asarray(value)


def chunk_bounds(rows: int, parts: int) -> list[int]:
    """Where Batch.chunk cuts `rows` rows into `parts` parts: parts + 1 offsets, part i being rows
    bounds[i]:bounds[i + 1] (sizes differ by at most one, earlier parts larger)."""
    if parts < 1:
        raise ValueError(f"chunk parts must be >= 1, got {parts}")
    base, extra = divmod(rows, parts)
    return [int(b) for b in np.cumsum([0] + [base + (i < extra) for i in range(parts)])]
