"""`rlctl view RUN --html OUT`: one self-contained HTML page (no network) with the curves and every sample.

The page is report.html (beside this file: its CSS and JS, curves drawn as inline SVG by its own
few lines of JS) with the run embedded as JSON in a <script type="application/json"> block. Prompts
are stored once and referenced by index: GRPO's n samples of a prompt share it, and "the same
prompt across steps" is a filter on that index. Written atomically: a reader never sees half a page.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl.errors import UsageError
from rlctl.view.data import RunView

TEMPLATE = Path(__file__).with_name("report.html")
_SLOT = "/*RLCTL_VIEW_DATA*/"
# sample fields in the page, in this order (the JS reads them by position: 64k samples as objects
# would repeat every key 64k times)
FIELDS = ("step", "i", "source", "score", "acc", "length", "turns", "calls", "errors", "prompt", "messages",
          "segments", "mask_runs", "extra", "failure")


def report_data(run: RunView) -> dict:
    """The page's data: the run's identity, metric columns, the prompts once, the samples as rows."""
    steps = sorted({row["step"] for row in run.metrics if isinstance(row.get("step"), int)})
    metrics = {}
    for key in run.metric_keys:
        xs, ys = run.series(key)
        metrics[key] = [xs, [round(y, 6) for y in ys]]
    prompts: dict[str, int] = {}
    prompt_messages: list[list[dict]] = []
    rows = []
    for s in run.samples:
        first_gen = next((k for k, m in enumerate(s["messages"]) if m["gen"]), len(s["messages"]))
        if s["prompt"] not in prompts:
            prompts[s["prompt"]] = len(prompt_messages)
            prompt_messages.append([_message(m) for m in s["messages"][:first_gen]])
        row = {**s, "prompt": prompts[s["prompt"]], "messages": [_message(m) for m in s["messages"][first_gen:]]}
        rows.append([row.get(f) for f in FIELDS])
    info = {k: run.info.get(k) for k in ("status", "step", "total_steps", "created_at", "updated_at", "exit_code",
                                         "error", "rlctl_version") if k in run.info}
    # the folder's name, not its path: a page shared in a PR or a paper should not carry the local layout
    return {"name": run.name, "kind": run.kind, "path": run.path.name, "info": info, "notes": run.notes,
            "steps": len(steps), "metrics": metrics, "fields": list(FIELDS), "prompts": prompt_messages,
            "samples": rows}


def _message(m: dict) -> list:
    return [m["role"], m["content"], int(m["gen"]), m.get("tool_calls") or []]


def render_html(run: RunView) -> str:
    payload = json.dumps(report_data(run), ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                         default=str)
    # "<" only occurs inside JSON strings: escaped, no "</script>" in a conversation can end the block
    payload = payload.replace("<", "\\u003c")
    page = TEMPLATE.read_text(encoding="utf-8")
    title = f"rlctl view: {run.name}".replace("&", "&amp;").replace("<", "&lt;")
    return page.replace("<title>rlctl view</title>", f"<title>{title}</title>").replace(_SLOT, payload)


def write_html(run: RunView, out: str | os.PathLike, *, force: bool = True) -> Path:
    """Write the page to `out` atomically; UsageError when `out` is a folder."""
    from rlctl.utils.atomic_files import atomic_write_text

    out = Path(out)
    if out.is_dir():
        raise UsageError(f"--html {out} is a folder", hint="name the page's file, e.g. --html report.html.")
    if not out.parent.is_dir():
        raise UsageError(f"--html {out}: the folder {out.parent} does not exist", hint="create it, or pick another path.")
    atomic_write_text(out, render_html(run))
    return out
