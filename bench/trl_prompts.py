#!/usr/bin/env python3
"""../shared/bench/trl_grpo_bench.py with another number of prompts per step.

  /tmp/venv-trl/bin/python bench/trl_prompts.py --prompts 16 [--micro 32] [trl_grpo_bench.py's options]

The shared workload fixes 4 prompts x 8 completions a step (workload.PROMPTS_PER_STEP, its BATCH of 32
completions as TRL's per-device batch). This sets PROMPTS_PER_STEP and BATCH in the workload module
before the script reads them, and has TRL take the completions --micro at a time (default 32) with
gradient accumulation (per_device_train_batch_size MICRO, gradient_accumulation_steps BATCH / MICRO:
still one generation and one optimizer step a step), as a TRL user would past what one forward holds:
one forward over 128 completions, or over 32 of 512 tokens, needs more than a 24 GiB machine has.
Nothing else changes. `bench/rlctl_bench.py --prompts N` runs it on
TRL's side, so that both tools step through the same prompts (rlctl in its micro-batches).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHARED_BENCH = Path(os.environ.get("RLCTL_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "bench"
sys.path.insert(0, str(SHARED_BENCH))
MICRO = 32   # completions a forward by default: the shared workload's whole batch


def main(argv: list[str]) -> int:
    usage = "usage: trl_prompts.py --prompts N [--micro M] [trl_grpo_bench.py's options] (N, M >= 1)"
    if len(argv) < 2 or argv[0] != "--prompts" or not argv[1].isdigit() or int(argv[1]) < 1:
        raise SystemExit(usage)
    prompts, argv, micro = int(argv[1]), argv[2:], MICRO
    if argv[:1] == ["--micro"]:
        if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) < 1:
            raise SystemExit(usage)
        micro, argv = int(argv[1]), argv[2:]
    import trl
    import trl_grpo_bench
    import workload as W

    W.PROMPTS_PER_STEP = prompts
    W.BATCH = W.PROMPTS_PER_STEP * W.NUM_GENERATIONS

    class Accumulating(trl.GRPOConfig):   # the same dataclass fields; only the batch split differs
        def __init__(self, **kwargs):
            batch = kwargs.get("per_device_train_batch_size", micro)
            if batch > micro and batch % micro == 0:
                kwargs.update(per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro)
            super().__init__(**kwargs)

    trl.GRPOConfig = Accumulating   # trl_grpo_bench imports it from trl inside main()
    return trl_grpo_bench.main(argv) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
