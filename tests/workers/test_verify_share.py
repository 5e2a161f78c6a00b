"""Loading a checkpoint, each rank checks its share of the role's files against the manifest
(file i by rank i % world), and all ranks raise the same error naming a corrupted file, whoever
read it. Two real processes in a gloo group (forked), real files, a real manifest."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch.distributed as dist

import rlctl.utils.checksum as checksum
from rlctl.checkpoint.manifest import write_manifest
from rlctl.utils.net import free_port
from rlctl.workers.compute.checkpoint_io import verify_share   # imported before the fork: the ranks start at once

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


def _rank(rank: int, port: int, step_dir: str, out) -> None:
    read = []
    real = checksum.checksum_file
    checksum.checksum_file = lambda path, *a, **k: (read.append(os.path.relpath(path, step_dir)), real(path, *a, **k))[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        verify_share(Path(step_dir) / "actor")
        error = None
    except Exception as err:   # noqa: BLE001 - reported to the test
        error = f"{type(err).__name__}: {err}"
    dist.destroy_process_group()
    out.put((rank, sorted(read), error))


def run_ranks(step_dir) -> dict:
    ctx = mp.get_context("fork")
    out, port = ctx.Queue(), free_port("127.0.0.1")
    procs = [ctx.Process(target=_rank, args=(r, port, str(step_dir), out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, read, error = out.get(timeout=60)
        results[rank] = (read, error)
    for p in procs:
        p.join(10)
    return results


@pytest.fixture
def step_dir(tmp_path):
    step = tmp_path / "step_4"
    for name in ("a", "b", "c", "d", "e"):
        (step / "actor" / "model").mkdir(parents=True, exist_ok=True)
        (step / "actor" / "model" / f"{name}.safetensors").write_bytes(os.urandom(4096))
    (step / "trainer_state.json").write_text("{}\n")
    write_manifest(step, 4, {})
    return step


def test_each_rank_reads_its_share_and_all_name_the_corrupted_file(step_dir):
    ok = run_ranks(step_dir)
    assert ok[0][1] is None and ok[1][1] is None
    files = [f"actor/model/{n}.safetensors" for n in "abcde"]
    assert ok[0][0] == files[0::2] and ok[1][0] == files[1::2]      # each file read once, by one rank

    data = bytearray((step_dir / files[3]).read_bytes())             # rank 1's file, same size
    data[100] ^= 1
    (step_dir / files[3]).write_bytes(bytes(data))
    bad = run_ranks(step_dir)
    assert files[3] not in bad[0][0]                                  # rank 0 never read it ...
    for rank in (0, 1):                                               # ... and names it all the same
        assert bad[rank][1] == (f"CorruptCheckpointError: checkpoint step_4 is broken: {files[3]} does not "
                                "match its crc32 in the manifest (corrupted)")
