"""tests/support/gloo_ranks.py keeps the rank processes of the gloo parity tests between calls: a call must
still start like one on new processes (the caller's environment, no fault planted by an earlier call,
no process group left), and a failing rank must fail the call with its traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.gloo_ranks import run_ranks

pytestmark = pytest.mark.slow   # it starts rank processes


def _plant_and_report(rank: int, out: str) -> None:
    import torch.distributed as dist

    from rlctl.workers.parallel import fsdp

    state = {"pid": os.getpid(), "env": os.environ.get("GLOO_RANKS_TEST"), "group": dist.is_initialized(),
             "shard_planted": getattr(fsdp.shard, "planted", False)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(state))
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=2)
    dist.barrier()   # no rank leaves (and closes its side) while the other still connects

    def planted(*args, **kwargs):
        raise AssertionError("a planted fault")

    planted.planted = True
    fsdp.shard = planted   # left planted, and the process group left open


def _fail_on_rank_1(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 was told to fail")


def _report(out: str, name: str) -> list[dict]:
    return [json.loads(Path(out, name, f"rank{r}.json").read_text()) for r in range(2)]


def test_a_call_starts_clean_on_the_kept_ranks_and_a_failing_rank_fails_the_call(tmp_path, monkeypatch):
    for call in ("first", "second"):
        (tmp_path / call).mkdir()
        monkeypatch.setenv("GLOO_RANKS_TEST", call)
        run_ranks(_plant_and_report, (str(tmp_path / call),), 2)
    first, second = _report(tmp_path, "first"), _report(tmp_path, "second")
    assert [r["pid"] for r in first] == [r["pid"] for r in second]      # the same processes
    assert [r["env"] for r in second] == ["second", "second"]           # the caller's environment of that call
    assert not any(r["shard_planted"] or r["group"] for r in second), second    # the first call's plant and group are gone

    with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed:(.|\n)*ValueError: rank 1 was told to fail"):
        run_ranks(_fail_on_rank_1, (), 2)
    (tmp_path / "after").mkdir()
    run_ranks(_plant_and_report, (str(tmp_path / "after"),), 2)          # a failed call's ranks are replaced
    assert not {r["pid"] for r in _report(tmp_path, "after")} & {r["pid"] for r in second}
