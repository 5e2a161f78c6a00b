"""`rlctl train`, `rlctl resume` and `rlctl status`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlctl.cli.common import emit, flag, format_option
from rlctl.cli.config_cmd import CONFIG_OPTION, FILE_ARG, OVERRIDES_ARG, with_config_option

ADDRESS = typer.Option(None, "--address", help="Ray cluster: 'auto' or 'ray://host:port' (default: embedded Ray, "
                                               "or resources.address / RAY_ADDRESS).")


def train(file: Optional[str] = FILE_ARG, overrides: Optional[List[str]] = OVERRIDES_ARG,
          address: Optional[str] = ADDRESS,
          force: bool = flag("--force", help="Start over in a run folder that has no checkpoints "
                                                    "(the old folder is moved aside, not deleted)."),
          config: Optional[str] = CONFIG_OPTION) -> None:
    """Train: validate the config, start Ray and the workers, run the RL loop.

    Example: rlctl train rlctl.toml actor.lr=2e-6 rollout.n=8
    """
    from rlctl.cli.config_cmd import load_checked
    from rlctl.controller.run import start_training

    start_training(load_checked(*with_config_option(config, file, overrides)), address=address, force=force)


def resume(run_dir: Optional[str] = typer.Argument(None, help="Run folder (default: the newest under ./runs)."),
           overrides: Optional[List[str]] = typer.Argument(None, help="Harmless changes, e.g. run.total_steps=200 "
                                                                      "resources.workers=4.", show_default=False),
           step: Optional[int] = typer.Option(None, "--step", min=0, help="Resume from this checkpoint step."),
           address: Optional[str] = ADDRESS) -> None:
    """Continue a run from its newest valid checkpoint (or --step N), with the run's own config.

    Changes that would break the run (model, algorithm, data, tokenizer, reward) are refused (exit 3).

    Example: rlctl resume runs/grpo-gsm8k --step 40 run.total_steps=200
    """
    from rlctl.controller.run import resume_training
    from rlctl.checkpoint.run_folder import find_run_dir

    words = list(overrides or [])
    if run_dir is not None and "=" in run_dir and not Path(run_dir).exists():
        words.insert(0, run_dir)
        run_dir = None
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
