"""What a person watching `rlctl train` sees: one line of key metrics per step and a progress bar.

On a terminal, a rich progress bar (step / total, elapsed, ETA, the phase the step is in) stays at
the bottom while each finished step prints one line above it, so the history stays in the
scrollback. Without a terminal (CI, `> train.log`, Ray job logs) the same lines are printed plain
and flushed, one per step, with the ETA in the line; no bar, no escape codes.

    with LiveDisplay(total_steps=100, start_step=0) as display:
        display.phase("rollout")
        display.update(step, metrics)        # metrics keyed as in metrics.jsonl
"""

from __future__ import annotations

import math
import time

from rich.console import Console
from rich.text import Text

# (metrics.jsonl key, label, format): the order of the per-step line.
KEY_METRICS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/acc", "acc", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/kl", "kl", "{:.4f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/grad_norm", "grad_norm", "{:.3f}"),
    ("timing/step_s", "step_s", "{:.2f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
)
# The line of an SFT step (run.kind = "sft": its rows carry train/loss, never a reward).
SFT_KEY_METRICS = (
    ("train/loss", "loss", "{:.4f}"),
    ("val/loss", "val_loss", "{:.4f}"),
    ("actor/grad_norm", "grad_norm", "{:.3f}"),
    ("actor/lr", "lr", "{:.2e}"),
    ("timing/step_s", "step_s", "{:.2f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
)


class LiveDisplay:
    """Progress of a run over `total_steps`; `start_step` > 0 when resuming. A context manager:
    leaving it (also by an exception or Ctrl-C) stops the bar and gives the cursor back.
    `label`: one of several runs sharing the terminal (rlctl.controller.group): plain lines, each
    starting with the label, and no bar (a terminal holds one live bar)."""

    def __init__(self, total_steps: int, *, start_step: int = 0, console: Console | None = None,
                 title: str = "train", label: str | None = None):
        self.console = console or Console()
        self.total_steps = int(total_steps)
        self.start_step = self.step = int(start_step)
        self.title, self.label = title, label
        self.live = self.console.is_terminal and label is None
        self._progress = self._task = None
        self._started_at = time.monotonic()

    def __enter__(self) -> LiveDisplay:
        self._started_at = time.monotonic()
        if self.live:
            self._progress = _make_progress(self.console)
            self._task = self._progress.add_task(self.title, total=self.total_steps or None,
                                                 completed=self.start_step, phase="starting", eta=format_clock(None))
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()  # shows the cursor again and ends the live region
            self._progress = None

    def phase(self, name: str) -> None:
        """Show what the current step is doing (rollout, reward, update...) next to the bar."""
        if self._progress is not None:
            self._progress.update(self._task, phase=name)

    def update(self, step: int, metrics: dict) -> Text:
        """Step `step` finished with `metrics`: print its line and move the bar; returns the line."""
        self.step = int(step)
        eta = self.eta_s()
        line = format_step(self.step, self.total_steps, metrics, eta)
        if self._progress is not None:
            self._progress.console.print(line, soft_wrap=True)
            self._progress.update(self._task, completed=self.step, phase="", eta=format_clock(eta))
        else:
            self.print(line)
        return line

    def print(self, message: str | Text) -> None:
        """A message (validation results, a warning) above the bar, or as a plain line."""
        if self._progress is not None:
            self._progress.console.print(message, soft_wrap=True)
            return
        if self.label is not None:
            message = Text(f"[{self.label}] ", style="bold").append(message if isinstance(message, Text) else Text(message))
        self.console.print(message, soft_wrap=True, highlight=False, markup=False)
        self.console.file.flush()  # a pipe is block-buffered: CI logs should show each step now

    def eta_s(self) -> float | None:
        """Seconds left, from the mean time per step this session (None before the first step)."""
        done = self.step - self.start_step
        if done <= 0 or self.total_steps <= 0:
            return None
        per_step = (time.monotonic() - self._started_at) / done
        return max(0, self.total_steps - self.step) * per_step


def format_step(step: int, total_steps: int, metrics: dict, eta_s: float | None = None) -> Text:
    """`step 3/100  reward 0.512  acc 0.500  len 123.4  kl 0.0012 ... eta 0:03:12` as rich Text."""
    width = len(str(total_steps)) if total_steps > 0 else 1
    line = Text(f"step {step:>{width}}/{total_steps}" if total_steps > 0 else f"step {step}", style="bold")
    for key, label, fmt in SFT_KEY_METRICS if "train/loss" in metrics else KEY_METRICS:
        if key in metrics:
            line.append(f"  {label} ", style="dim")
            line.append(_format_value(metrics[key], fmt), style="cyan" if key in ("reward/mean", "train/loss") else "")
    if eta_s is not None:
        line.append("  eta ", style="dim")
        line.append(format_clock(eta_s))
    return line


def _format_value(value, fmt: str) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "nan"  # None: a non-finite value, written as null in metrics.jsonl
    return fmt.format(number) if math.isfinite(number) else str(number)


def format_clock(seconds: float | None) -> str:
    """`h:mm:ss`, or `-:--:--` when unknown."""
    if seconds is None:
        return "-:--:--"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _make_progress(console: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("•"), TimeElapsedColumn(), TextColumn("• eta {task.fields[eta]}"),
        TextColumn("[dim]{task.fields[phase]}"),
        console=console, refresh_per_second=4, transient=False,
    )
