"""`rlctl train`, `rlctl resume` and `rlctl status`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlctl.cli.common import emit, flag, format_option
from rlctl.errors import UsageError
from rlctl.cli.config_cmd import CONFIG_OPTION, FILE_ARG, OVERRIDES_ARG, with_config_option

ADDRESS = typer.Option(None, "--address", help="Ray cluster: 'auto' or 'ray://host:port' (default: embedded Ray, "
                                               "or resources.address / RAY_ADDRESS).")


def train(file: Optional[str] = FILE_ARG, overrides: Optional[List[str]] = OVERRIDES_ARG,
          address: Optional[str] = ADDRESS,
          force: bool = flag("--force", help="Start over in a run folder that has no checkpoints "
                                                    "(the old folder is moved aside, not deleted)."),
          seeds: Optional[str] = typer.Option(None, "--seeds", help="LoRA runs of these run.seed values on one "
                                              "base in memory, e.g. 0,1,2 (runs <run.name>-seed0, ...).",
                                              show_default=False),
          sweep: Optional[List[str]] = typer.Option(None, "--sweep", help="KEY=V1,V2: one LoRA run per value, all "
                                                    "on one base in memory (repeat for the product of several "
                                                    "keys).", show_default=False),
          config: Optional[str] = CONFIG_OPTION) -> None:
    """Train: validate the config, start Ray and the workers, run the RL loop.

    Example: rlctl train rlctl.toml actor.lr=2e-6 rollout.n=8
    Several LoRA runs on one base: rlctl train rlctl.toml --seeds 0,1,2 --sweep actor.lr=1e-4,2e-4
    """
    from rlctl.cli.config_cmd import load_checked, split_file_and_overrides
    from rlctl.controller.run import start_training

    file, words = with_config_option(config, file, overrides)
    if seeds is not None or sweep:
        from rlctl.controller.group import load_members, start_group, sweep_members

        members = load_members(*split_file_and_overrides(file, words), sweep_members(seeds, list(sweep or [])))
        return start_group(members, address=address, force=force)
    start_training(load_checked(file, words), address=address, force=force)


def resume(run_dir: Optional[str] = typer.Argument(None, help="Run folder (default: the newest under ./runs); "
                                                             "several: LoRA runs resumed together on one base."),
           overrides: Optional[List[str]] = typer.Argument(None, help="Harmless changes, e.g. run.total_steps=200 "
                                                                      "resources.workers=4.", show_default=False),
           step: Optional[int] = typer.Option(None, "--step", min=0, help="Resume from this checkpoint step."),
           address: Optional[str] = ADDRESS) -> None:
    """Continue a run from its newest valid checkpoint (or --step N), with the run's own config.

    Changes that would break the run (model, algorithm, data, tokenizer, reward) are refused (exit 3).

    Example: rlctl resume runs/grpo-gsm8k --step 40 run.total_steps=200
    Several runs of `rlctl train --seeds`, together: rlctl resume runs/arith-seed0 runs/arith-seed1
    """
    from rlctl.controller.run import resume_training
    from rlctl.checkpoint.run_folder import find_run_dir

    words = list(overrides or [])
    if run_dir is not None and "=" in run_dir and not Path(run_dir).exists():
        words.insert(0, run_dir)
        run_dir = None
    if more := [w for w in words if "=" not in w]:   # several run folders: one group on one base
        from rlctl.controller.group import resume_group

        if step is not None:
            raise UsageError("--step picks one run's checkpoint", hint="resume runs together from their newest ones")
        dirs = [find_run_dir(d, "resume") for d in [run_dir, *more]]
        return resume_group(dirs, address=address, overrides=[w for w in words if "=" in w])
    resume_training(find_run_dir(run_dir, "resume"), step=step, address=address, overrides=words)


def status(run_dir: Optional[Path] = typer.Argument(None, help="Run folder (default: the newest under .)."),
           plot: Optional[Path] = typer.Option(None, "--plot", help="Write reward/KL/length/entropy curves as a PNG."),
           fmt: str = format_option("text", "json", help="text or json.")) -> None:
    """Progress, latest metrics and checkpoints of a run; --plot draws its curves.

    Example: rlctl status runs/grpo-gsm8k --plot curves.png
    """
    from rlctl.checkpoint.run_folder import find_run_dir
    from rlctl.controller.status import plot_curves, render_status, status_summary

    folder = find_run_dir(run_dir)
    summary = status_summary(folder)
    if plot is not None:
        summary["plot"] = str(plot_curves(folder, plot))
    if fmt == "json":
        return emit(summary, fmt)
    from rich.console import Console

    console = Console()
    render_status(summary, console)
    if plot is not None:
        console.print(f"curves: {summary['plot']}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("resume")(resume)
    app.command("status")(status)
