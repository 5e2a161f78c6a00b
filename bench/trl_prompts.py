#!/usr/bin/env python3
"""../shared/bench/trl_grpo_bench.py with another number of prompts per step.

  /tmp/venv-trl/bin/python bench/trl_prompts.py --prompts 16 [trl_grpo_bench.py's options]

The shared workload fixes 4 prompts x 8 completions a step (workload.PROMPTS_PER_STEP, its BATCH of 32
completions as TRL's per-device batch). This sets PROMPTS_PER_STEP and BATCH in the workload module
before the script reads them, and has TRL take the completions 32 at a time with gradient accumulation
(per_device_train_batch_size 32, gradient_accumulation_steps BATCH / 32: still one generation and one
optimizer step a step), as a TRL user would past 32 completions; one forward over 128 completions would
need more than this machine's 24 GiB. Nothing else changes. `bench/rlctl_bench.py --prompts N` runs it on
TRL's side, so that both tools step through the same prompts (rlctl in its micro-batches).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHARED_BENCH = Path(os.environ.get("RLCTL_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "bench"
sys.path.insert(0, str(SHARED_BENCH))
MICRO = 32   # completions a forward, the shared workload's whole batch


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--prompts" or not argv[1].isdigit() or int(argv[1]) < 1:
        raise SystemExit("usage: trl_prompts.py --prompts N [trl_grpo_bench.py's options] (N >= 1 prompts a step)")
    import trl
    import trl_grpo_bench
    import workload as W

    W.PROMPTS_PER_STEP = int(argv[1])
    W.BATCH = W.PROMPTS_PER_STEP * W.NUM_GENERATIONS

    class Accumulating(trl.GRPOConfig):   # the same dataclass fields; only the batch split differs
        def __init__(self, **kwargs):
            batch = kwargs.get("per_device_train_batch_size", MICRO)
            if batch > MICRO and batch % MICRO == 0:
                kwargs.update(per_device_train_batch_size=MICRO, gradient_accumulation_steps=batch // MICRO)
            super().__init__(**kwargs)

    trl.GRPOConfig = Accumulating   # trl_grpo_bench imports it from trl inside main()
    return trl_grpo_bench.main(argv[2:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
