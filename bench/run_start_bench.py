"""Where a short training run's time goes: the fixed cost of starting one against its steps.

Most of the slow test tier is short `rlctl train` runs on a tiny model, each started with
`start_training` inside one embedded Ray (as the tests' `ray_cluster` fixture does). This starts
such a run --runs times (GRPO, 2 worker ranks, a 2-layer hidden-64 model, arith prompts) with
--steps 1 and again with more steps, and prints, per run: the prompts and tokenizer, each worker
group step (the rank processes up to `import torch`, the process group, each role's __init__ with
its transformers import and model load), the training loop, and the rest (teardown).

    OMP_NUM_THREADS=1 .venv/bin/python bench/run_start_bench.py --runs 3 --steps 1,4

With RLCTL_WARM_RANKS=1 every run after the first starts on the ranks the one before it parked
(rlctl.runtime.warm_ranks), as the test suite's runs do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

OVERRIDES = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "actor.mini_batch_size=2",
             "actor.micro_batch_size=2", "actor.ppo_epochs=1", "rollout.n=2", "data.max_response_length=8",
             "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
             "reward.function=arith", "reward.workers=1", "model.dtype=float32",
             "model.gradient_checkpointing=false", "run.save_every=0", "actor.lr=1e-3"]


def timed(phases: dict[str, float], owner, attr: str, name) -> None:
    """Wrap owner.attr so each call adds its wall time to phases[name(*args)] (seconds per phase of a run)."""
    original = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            key = name(*args, **kwargs)
            phases[key] = phases.get(key, 0.0) + time.perf_counter() - start

    setattr(owner, attr, wrapper)


def instrument(phases: dict[str, float]) -> None:
    from rlctl.controller import build, trainer
    from rlctl.runtime.worker_group import WorkerGroup

    timed(phases, build, "build_data", lambda *a, **k: "prompts + tokenizer")
    host_phase = {"node_info": "rank processes (Ray start, import torch)", "init_process_group": "process group",
                  "add_role": "roles' __init__ (transformers import, model load, FSDP)"}
    timed(phases, WorkerGroup, "_all", lambda self, host_method, *a, **k: host_phase.get(host_method, host_method))
    timed(phases, trainer.Trainer, "fit", lambda *a, **k: "training loop")


def project(root: Path, model: Path, data: Path, name: str) -> Path:
    from rlctl.project import write_project

    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    write_project(folder, "grpo-gsm8k", str(model))
    (folder / "data").mkdir()
    (folder / "data" / "arith").symlink_to(data)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per step count (the first pays the imports)")
    parser.add_argument("--steps", default="1,4", help="comma-separated run.total_steps values")
    args = parser.parse_args()

    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training
    from rlctl.models.tiny import build_tiny_model
    from rlctl.runtime.ray_env import ray_session
    from rlctl.tasks.prep import PrepOptions, prepare

    phases: dict[str, float] = {}
    instrument(phases)
    root = Path(tempfile.mkdtemp(prefix="rlctl-run-start-"))
    build_tiny_model(root / "model", layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
    prepare("arith", PrepOptions(out=root / "arith"))
    start = time.perf_counter()
    with ray_session(num_cpus=2, log_to_driver=False):
        print(f"embedded Ray up in {time.perf_counter() - start:.1f} s; {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.2f}")
        for steps in (int(s) for s in args.steps.split(",")):
            for i in range(args.runs):
                folder = project(root, root / "model", root / "arith", f"s{steps}-{i}")
                os.chdir(folder)
                phases.clear()
                start = time.perf_counter()
                with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                    start_training(load_config(folder / "rlctl.toml", OVERRIDES + [f"run.total_steps={steps}"]),
                                   address=None, force=False)
                total = time.perf_counter() - start
                parts = "  ".join(f"{k} {v:.1f}" for k, v in phases.items())
                rest = total - sum(phases.values())
                print(f"steps {steps} run {i}: {total:5.1f} s = {parts}  rest {rest:.1f}", flush=True)
    os.chdir(Path.home())
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":   # the reward pool spawns processes that import this file
    sys.exit(main())
