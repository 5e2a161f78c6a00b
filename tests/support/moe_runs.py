"""Real runs of the grpo-arith-moe-ep2-cpu recipe for the expert-parallelism tests: one project (the
recipe's tiny Qwen3-MoE, 4 experts top-2, and the arith data), and the same run at ep = 2 and 1."""

from __future__ import annotations

from pathlib import Path


def moe_project(root: Path, arith_data: Path, **model) -> Path:
    """`model`: build_tiny_model's sizes (hidden=128 for vLLM's CPU attention: head size 32)."""
    from rlctl.models.tiny import build_tiny_model
    from rlctl.project import write_project

    build_tiny_model(root / "moe", arch="qwen3_moe", **model)
    write_project(root, "grpo-arith-moe-ep2-cpu", str(root / "moe"))
    (root / "data").mkdir()
    (root / "data" / "arith").symlink_to(arith_data)
    return root


def train_at_each_ep(proj: Path, overrides: list[str], name: str = "ep") -> dict[int, Path]:
    """`rlctl train` in-process at actor.expert_parallel_size 2, then 1: {ep: run folder}."""
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training

    for ep in (2, 1):
        ep_overrides = [f"actor.expert_parallel_size={ep}", f"run.name={name}{ep}"]
        start_training(load_config(proj / "rlctl.toml", overrides + ep_overrides), address=None, force=False)
    return {ep: proj / "runs" / f"{name}{ep}" for ep in (1, 2)}
