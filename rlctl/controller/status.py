"""A run folder as a person asks about it: `rlctl status` (progress, last metrics, checkpoints) and a
PNG of the curves. The folder, run.json and finding the newest run are rlctl.checkpoint.run_folder's.
`status` reports "died" for a run whose run.json says running but whose pid is gone on this host.
Its checkpoints are read through rlctl.checkpoint.manager, which owns checkpoints/.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from pathlib import Path

from rlctl.checkpoint.manager import CheckpointManager, pid_alive
from rlctl.checkpoint.run_folder import METRICS_FILE, STATES, is_run_folder, read_run_info
from rlctl.controller.metrics_log import read_jsonl
from rlctl.errors import UsageError


def status_summary(run_dir: str | os.PathLike) -> dict:
    """Everything `rlctl status` shows, as plain JSON-ready data."""
    run_dir = Path(run_dir)
    if not is_run_folder(run_dir):
        raise UsageError(f"{run_dir} is not a run folder (no run.json or metrics.jsonl)",
                         hint="pass <output_dir>/<run name>, e.g. runs/my-run.")
    info = read_run_info(run_dir)
    rows = read_jsonl(run_dir / METRICS_FILE)
    step = max([int(info.get("step") or 0)] + [int(r["step"]) for r in rows if isinstance(r.get("step"), int)])
    total = info.get("total_steps")
    state = _state(info)
    manager = CheckpointManager.for_run(run_dir)
    checkpoints = manager.listing()
    latest = manager.latest_named()
    return {
        "run_dir": str(run_dir), "name": info.get("name") or run_dir.name, "state": state,
        "step": step, "total_steps": total, "progress": step / total if total else None,
        "elapsed_s": _elapsed(info), "eta_s": _eta(rows, step, total) if state == "running" else None,
        **{k: info.get(k) for k in ("created_at", "started_at", "updated_at", "finished_at", "exit_code", "error",
                                    "command", "resumed_from", "pid", "host", "rlctl_version")},
        "metrics_rows": len(rows),
        "last_metrics": _last_metrics(rows),
        "last_validation": _last_validation(rows),
        "checkpoints": checkpoints,
        "latest_checkpoint": latest if any(c["step"] == latest and c["valid"] for c in checkpoints) else None,
        "best_checkpoint": manager.read_best(),
    }


def _state(info: dict) -> str:
    status = info.get("status")
    if status not in STATES:
        return "unknown"
    if status == "running" and info.get("host") == socket.gethostname() and not pid_alive(info.get("pid")):
        return "died"
    return status


def _last_metrics(rows: list[dict]) -> dict:
    """The training metrics of the newest step (rows of one step are merged, `val/` keys left out)."""
    if not rows:
        return {}
    last = rows[-1].get("step")
    merged: dict = {}
    for row in rows:
        if row.get("step") == last:
            merged.update({k: v for k, v in row.items() if not k.startswith("val/")})
    return merged


def _last_validation(rows: list[dict]) -> dict:
    for row in reversed(rows):
        val = {k: v for k, v in row.items() if k.startswith("val/")}
        if val:
            return {"step": row.get("step"), **val}
    return {}


def _eta(rows: list[dict], step: int, total) -> float | None:
    times = [r["timing/step_s"] for r in rows[-10:] if isinstance(r.get("timing/step_s"), (int, float))]
    if not times or not total:
        return None
    return max(0, total - step) * sum(times) / len(times)


def _elapsed(info: dict) -> float | None:
    start, end = _parse_time(info.get("started_at")), _parse_time(info.get("finished_at"))
    if start is None:
        return None
    end = end or (dt.datetime.now(dt.timezone.utc) if info.get("status") == "running" else
                  _parse_time(info.get("updated_at")))
    return max(0.0, (end - start).total_seconds()) if end else None


def _parse_time(text) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None


# -- showing a run --------------------------------------------------------------------------------

_STATE_STYLE = {"running": "bold green", "finished": "bold blue", "failed": "bold red", "interrupted": "bold yellow",
                "died": "bold red", "unknown": "dim"}


def render_status(summary: dict, console) -> None:
    """Print a status summary for people: state, progress, last step's key metrics, checkpoints."""
    from rich.text import Text

    from rlctl.controller.display import format_clock, format_step

    s = summary
    head = Text.assemble(("run ", "dim"), (s["name"], "bold"), "  ", (s["state"], _STATE_STYLE[s["state"]]))
    if s.get("host") and s["state"] in ("running", "died"):
        head.append(f"  (pid {s.get('pid')} on {s['host']})", style="dim")
    console.print(head)
    total = s["total_steps"]
    progress = f"step {s['step']}/{total} ({s['progress']:.0%})" if total else f"step {s['step']}"
    times = [f"elapsed {format_clock(s['elapsed_s'])}"] if s["elapsed_s"] is not None else []
    if s["eta_s"] is not None:
        times.append(f"eta {format_clock(s['eta_s'])}")
    console.print(f"  {progress}   " + "   ".join(times), highlight=False)
    if s["state"] in ("failed", "interrupted", "died") and (s.get("error") or s.get("exit_code") is not None):
        console.print(Text(f"  exit {s.get('exit_code')}: {s.get('error') or ''}", style="red"))
    if s["last_metrics"]:
        line = format_step(s["last_metrics"].get("step", s["step"]), total or 0, s["last_metrics"])
        console.print(Text("  last ", style="dim") + line, soft_wrap=True)
    if s["last_validation"]:
        v = s["last_validation"]
        parts = [f"{k[4:]} {v[k]:.3f}" for k in ("val/reward/mean", "val/acc", "val/loss", "val/perplexity")
                 if isinstance(v.get(k), (int, float))]
        console.print(f"  validation at step {v['step']}: " + ("  ".join(parts) or "(no reward)"), highlight=False)
    console.print(_checkpoint_line(s))


def _checkpoint_line(s: dict):
    from rich.text import Text

    line = Text("  checkpoints ", style="dim")
    if not s["checkpoints"]:
        return line.append("none yet")
    for i, ckpt in enumerate(reversed(s["checkpoints"])):
        line.append(", " if i else "")
        line.append(f"step_{ckpt['step']}", style="bold" if ckpt["step"] == s["latest_checkpoint"] else "")
        if ckpt["step"] == s["latest_checkpoint"]:
            line.append(" (latest)", style="green")
        best = s.get("best_checkpoint")
        if best and ckpt["step"] == best["step"]:
            line.append(f" (best: {best['metric']} {best['value']:.4g})", style="magenta")
        line.append(f" {ckpt['bytes'] / 2**20:.1f} MiB" if ckpt["valid"] else f" broken: {ckpt['problem']}",
                    style="dim" if ckpt["valid"] else "red")
    return line


# (panel title, training metric keys, validation metric key): the four curves of `--plot`.
PANELS = (
    ("reward", ("reward/mean", "reward/acc"), "val/reward/mean"),
    ("KL (actor || ref)", ("actor/kl",), None),
    ("response length (tokens)", ("response_length/mean",), "val/response_length/mean"),
    ("entropy", ("actor/entropy",), None),
)
# The panels of an SFT run (its rows carry train/loss).
SFT_PANELS = (
    ("loss (target-token NLL)", ("train/loss",), "val/loss"),
    ("learning rate", ("actor/lr",), None),
    ("gradient norm", ("actor/grad_norm",), None),
    ("tokens per second", ("perf/tokens_per_s",), None),
)


# Training series of one panel, drawn in this order: the first wide and solid, the next thinner and
# dashed on top, so two equal curves (reward/mean == reward/acc for a 0/1 reward) both stay visible.
TRAIN_STYLES = ({"color": "tab:blue", "linestyle": "-", "linewidth": 2.4, "marker": "o"},
                {"color": "tab:orange", "linestyle": "--", "linewidth": 1.4, "marker": "x"})
VAL_STYLE = {"color": "tab:green", "linestyle": ":", "linewidth": 1.4, "marker": "s"}
SMOOTH_FROM = 20  # points per series from which a moving average is drawn (and markers would clutter)


def plot_curves(run_dir: str | os.PathLike, out_png: str | os.PathLike) -> Path:
    """Write a PNG with reward, KL, response length and entropy over steps (2 x 2 panels; an SFT run:
    loss, learning rate, gradient norm and tokens/s)."""
    fig = curves_figure(run_dir)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def curves_figure(run_dir: str | os.PathLike):
    """The matplotlib Figure `plot_curves` saves."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("plotting needs matplotlib, which is not installed",
                         hint='pip install "rlctl[plot]".') from None
    summary = status_summary(run_dir)
    rows = read_jsonl(Path(run_dir) / METRICS_FILE)
    fig = Figure(figsize=(11, 7), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # Agg without pyplot: no global backend switch, no display needed
    fig.suptitle(f"{summary['name']}: step {summary['step']}" + (f"/{summary['total_steps']}"
                                                                 if summary["total_steps"] else ""))
    panels = SFT_PANELS if any("train/loss" in r for r in rows) else PANELS
    for ax, (title, keys, val_key) in zip(fig.subplots(2, 2).flat, panels):
        _plot_panel(ax, rows, title, keys, val_key)
    return fig


def _plot_panel(ax, rows: list[dict], title: str, keys, val_key) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 1.25 on a 3-step run
    ax.grid(True, alpha=0.3)
    drawn = False
    for key, style in zip(keys, TRAIN_STYLES):
        steps, values = _series(rows, key)
        if not steps:
            continue
        drawn = True
        if len(values) < SMOOTH_FROM:  # few points: each one marked (a 1-step run is a point, not nothing)
            ax.plot(steps, values, **style, label=key)
            continue
        # noisy RL curves: a faint raw line under a moving average
        style = {**style, "marker": None}
        ax.plot(steps, values, **style, alpha=0.3)
        ax.plot(steps, _moving_average(values, max(3, len(values) // 20)), **style, label=key)
    steps, values = _series(rows, val_key) if val_key else ([], [])
    if steps:
        drawn = True
        ax.plot(steps, values, **VAL_STYLE, label=val_key)
    if drawn:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and "step" in r]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def _moving_average(values: list[float], window: int) -> list[float]:
    """Centred mean over `window` points (fewer at the ends), so the smooth curve does not lag."""
    import numpy as np

    half = window // 2
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(len(values))
    lo, hi = np.maximum(idx - half, 0), np.minimum(idx + half + 1, len(values))
    return ((csum[hi] - csum[lo]) / (hi - lo)).tolist()
