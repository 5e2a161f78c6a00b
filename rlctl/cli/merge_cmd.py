"""`rlctl merge`: a run's checkpoint -> a verified Hugging Face folder (optionally pushed to the Hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlctl.cli.common import emit, flag, format_option


def merge(
    run_dir: Path = typer.Argument(..., help="The run folder (<output_dir>/<run name>), or a LoRA adapter folder "
                                   "(an rlctl tinker state).", show_default=False),
    to_hf: Path = typer.Option(..., "--to-hf", help="Folder to write the Hugging Face model into.",
                               show_default=False),
    step: Optional[int] = typer.Option(None, "--step", min=0, help="Checkpoint step (default: the newest valid)."),
    best: bool = flag("--best", help="The best checkpoint by run.best_metric (checkpoints/BEST.json) "
                                            "instead of the newest; not with --step."),
    dtype: str = typer.Option("auto", help="auto (the base model's dtype), float32, bfloat16 or float16."),
    lora: str = typer.Option("merge", help="LoRA runs: merge (adapter folded into the weights) or adapter "
                                           "(a PEFT adapter folder)."),
    force: bool = flag("--force", help="Replace a non-empty --to-hf folder (after the new one is "
                                              "complete)."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", metavar="REPO",
                                              help="Then upload the folder to this Hub repo (user/name)."),
    private: bool = flag("--private", help="Create the Hub repo as private (with --push-to-hub)."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Export a checkpoint as a Hugging Face folder and verify its logits against the trained weights.

    Example: rlctl merge runs/grpo-gsm8k --to-hf models/grpo-gsm8k --dtype bfloat16
    """
    from rlctl.errors import UsageError

    if private and not push_to_hub:
        raise UsageError("--private only applies with --push-to-hub REPO")
    from rlctl.checkpoint.adapter_merge import merge_folder
    from rlctl.checkpoint.merge import push_to_hub as push

    result = merge_folder(run_dir, to_hf, step=step, best=best, dtype=dtype, lora=lora, force=force)
    if result.warning:
        typer.echo(result.warning, err=True)
    v = result.verification
    what = {"none": "full weights", "merge": "LoRA merged", "adapter": "LoRA adapter"}[result.lora]
    picked = f", the best by {result.best['metric']} = {result.best['value']:.4g}" if result.best else ""
    lines = [f"wrote {result.out} from step_{result.step}{picked} ({what}, {result.dtype}, {len(result.files)} files)",
             f"verified: max |logit diff| vs the trained weights {v['trained_max_abs_diff']:.2g}; "
             f"written vs expected {v['written_max_abs_diff']:.2g} (tolerance {v['tolerance']:.2g})"]
    data = {"out": str(result.out), "step": result.step, "dtype": result.dtype, "lora": result.lora,
            "files": result.files, "verification": v, "warning": result.warning, "best": result.best, "pushed": None}
    if push_to_hub:
        data["pushed"] = push(result.out, push_to_hub, private=private)
        lines.append(f"pushed to {push_to_hub}: {data['pushed']}")
    emit(data, fmt, text="\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)
