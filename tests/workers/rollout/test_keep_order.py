"""keep_order + DecoderRunner.select: a finished row's place is taken by the last live row, so a select
copies one cache row per finished row, and the cache ends as an in-order compaction would hold it."""

import torch

from rlctl.workers.rollout.decoder import DecoderRunner
from rlctl.workers.rollout.hf import keep_order


def test_the_last_live_rows_fill_the_finished_places():
    finished = torch.tensor([False, True, False, False, True, False, False])
    # 5 live rows stay as rows 0-4: rows 0, 2, 3 keep their place; 1 and 4 take live rows 5 and 6
    assert keep_order(finished).tolist() == [0, 5, 2, 3, 6]
    assert keep_order(torch.tensor([False, False, True])).tolist() == [0, 1]        # the last ended: nothing moves
    assert keep_order(torch.tensor([True, True])).tolist() == []


def test_select_copies_only_the_moved_rows():
    runner = DecoderRunner.__new__(DecoderRunner)   # the cache part alone: keys [layers, rows, kv, D, T], values [.., T, D]
    runner.kg = torch.arange(2 * 7 * 1 * 2 * 4, dtype=torch.float32).view(2, 7, 1, 2, 4)
    runner.vg = -runner.kg.transpose(-1, -2).clone()
    runner.slot, runner.generated = torch.arange(7) * 10, 3
    before_k, before_v = runner.kg.clone(), runner.vg.clone()
    keep = keep_order(torch.tensor([False, True, False, False, True, False, False]))
    runner.select(keep)
    assert torch.equal(runner.kg[:, :5, :, :, :3], before_k[:, keep, :, :, :3])
    assert torch.equal(runner.vg[:, :5, :, :3], before_v[:, keep, :, :3])
    assert runner.slot.tolist() == [0, 50, 20, 30, 60] and not runner.in_order
