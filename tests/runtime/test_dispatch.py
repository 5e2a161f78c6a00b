"""Dispatch rules without Ray: how arguments are split per rank and results joined."""

import numpy as np
import pytest

from rlctl.errors import ConfigError
from rlctl.runtime import Batch, Dispatch, register
from rlctl.runtime.dispatch import collect_results, dispatch_mode, shard_batch, split_arguments


class Worker:
    @register(Dispatch.DP)
    def infer(self, batch):
        return batch

    @register(Dispatch.DP_TRAIN)
    def train(self, batch):
        return {}

    def local(self):
        return None


def test_modes_are_declared_where_methods_are_defined():
    assert dispatch_mode(Worker, "infer") is Dispatch.DP
    assert dispatch_mode(Worker, "train") is Dispatch.DP_TRAIN
    with pytest.raises(AttributeError, match="not a worker method"):
        dispatch_mode(Worker, "local")
    with pytest.raises(TypeError):
        register("dp")


def test_dp_splits_batches_in_order_and_copies_other_arguments():
    b = Batch({"x": np.arange(5)})
    per_rank = split_arguments(Dispatch.DP, 2, (b, 3), {"scale": 2.0, "extra": b}, "w.infer")
    assert [a[0]["x"].tolist() for a, _ in per_rank] == [[0, 1, 2], [3, 4]]
    assert [k["extra"]["x"].tolist() for _, k in per_rank] == [[0, 1, 2], [3, 4]]
    assert all(a[1] == 3 and k["scale"] == 2.0 for a, k in per_rank)
    joined = collect_results(Dispatch.DP, [a[0] for a, _ in per_rank])
    assert joined["x"].tolist() == [0, 1, 2, 3, 4]


def test_all_and_rank0_send_the_same_arguments():
    per_rank = split_arguments(Dispatch.ALL, 3, (1,), {"k": 2}, "w.m")
    assert per_rank == [((1,), {"k": 2})] * 3
    assert collect_results(Dispatch.ALL, [0, 1, 2]) == [0, 1, 2]
    assert collect_results(Dispatch.RANK0, ["a", "b"]) == "a"


def test_dp_train_rejects_uneven_splits_clearly():
    with pytest.raises(ConfigError, match="5 rows in 1 mini-batch\\(es\\) do not split evenly over 2 workers"):
        split_arguments(Dispatch.DP_TRAIN, 2, (Batch({"x": np.arange(5)}),), {}, "actor.update_actor")
    with pytest.raises(ConfigError, match="cannot be split over 4 workers"):
        split_arguments(Dispatch.DP, 4, (Batch({"x": np.arange(3)}),), {}, "actor.compute_log_prob")


def test_dp_train_stripes_mini_batches_so_each_is_the_same_as_on_one_rank():
    # 8 rows, 2 mini-batches of 4: rank r gets the r-th half of each mini-batch.
    b = Batch({"x": np.arange(8)}, {"mini_batches": 2})
    shards = shard_batch(b, 2, even=True, label="t")
    assert [s["x"].tolist() for s in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # Mini-batch k of rank r is the k-th half of its shard; together they are rows 4k..4k+3.
    for k in range(2):
        union = sorted(sum((s.chunk(2)[k]["x"].tolist() for s in shards), []))
        assert union == list(range(4 * k, 4 * k + 4))
