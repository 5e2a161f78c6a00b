"""`rlctl view`: browse runs in the terminal, or write one self-contained HTML page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer


def view(runs: Optional[List[Path]] = typer.Argument(None, help="Run folders (several are overlaid) or `rlctl eval "
                                                               "--out` files; default: the newest run under ."),
         html: Optional[Path] = typer.Option(None, "--html", help="Write one self-contained HTML page (curves and "
                                                                  "every sample) instead of opening the terminal UI."),
         follow_s: float = typer.Option(1.0, "--follow-s", min=0.0,
                                        help="Re-read a training run's metrics every this many seconds (0: never).")) -> None:
    """Curves, samples and conversations of runs: a terminal UI, or --html for a page to share.

    Example: rlctl view runs/grpo-calc-tools-cpu            (q quits, ? helps)
    Example: rlctl view runs/grpo-calc-tools-cpu --html report.html
    """
    from rlctl.checkpoint.run_folder import find_run_dir
    from rlctl.errors import UsageError
    from rlctl.view.data import load_source

    paths = list(runs or []) or [find_run_dir(None)]
    if html is not None:
        if len(paths) != 1:
            raise UsageError(f"--html writes the page of one run, got {len(paths)}",
                             hint="run it once per run: rlctl view RUN --html RUN.html.")
        from rlctl.view.html import write_html

        run = load_source(paths[0], decode=True)   # every response's mask segments, for the page
        out = write_html(run, html)
        for note in run.notes:
            typer.echo(f"note: {note}", err=True)
        typer.echo(f"wrote {out} ({len(run.samples)} samples, {len(run.metrics)} metric rows, "
                   f"{out.stat().st_size / 2**20:.1f} MiB): open it in a browser, no network needed")
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("rlctl view needs a terminal (stdin and stdout are not one)",
                         hint="run it in a terminal, or write a page: rlctl view RUN --html report.html.")
    sources = [load_source(p, with_samples=False) for p in paths]   # the UI reads samples in the background
    from rlctl.view.app import ViewApp

    ViewApp(sources, follow_s=follow_s).run()


def register(app: typer.Typer) -> None:
    app.command("view")(view)
