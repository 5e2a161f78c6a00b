"""Line charts in the terminal: braille dots (2 x 4 per character cell), several series overlaid.

rich only (no Textual), so the chart is a plain renderable the app puts in a widget and a test can
render to text. Each series keeps its own colour; where two cross, the later one wins the cell's colour.
"""

from __future__ import annotations

import math

from rich.text import Text

COLORS = ("cyan", "magenta", "yellow", "green", "red", "blue", "bright_white")
_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))   # braille bit of (row 0-3, column 0-1)


def braille_chart(series: list[tuple[str, list[float], list[float]]], width: int, height: int) -> Text:
    """`series`: (label, xs, ys). A `width` x `height` cell chart with a y axis, an x range and a legend."""
    series = [(label, xs, ys) for label, xs, ys in series if xs]
    if not series:
        return Text("no data for the chosen metrics yet", style="dim")
    xs_all = [x for _, xs, _ in series for x in xs]
    ys_all = [y for _, _, ys in series for y in ys if math.isfinite(y)]
    if not ys_all:
        return Text("no finite values", style="dim")
    x0, x1 = min(xs_all), max(xs_all)
    y0, y1 = min(ys_all), max(ys_all)
    if y0 == y1:
        y0, y1 = y0 - 0.5, y1 + 0.5
    axis = max(len(_fmt(y0)), len(_fmt(y1)))
    cols, rows = max(4, width - axis - 1), max(2, height - 2 - len(series))
    bits = [[0] * cols for _ in range(rows)]
    owner = [[-1] * cols for _ in range(rows)]
    for k, (_, xs, ys) in enumerate(series):
        points = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
        for (xa, ya), (xb, yb) in zip(points, points[1:] or points):
            for x, y in _segment(xa, ya, xb, yb, x0, x1, y0, y1, cols * 2, rows * 4):
                bits[y // 4][x // 2] |= _DOTS[y % 4][x % 2]
                owner[y // 4][x // 2] = k
    text = Text(no_wrap=True)
    for r in range(rows):
        label = _fmt(y1) if r == 0 else _fmt(y0) if r == rows - 1 else ""
        text.append(label.rjust(axis) + "┤", style="dim")
        for c in range(cols):
            k = owner[r][c]
            text.append(chr(0x2800 + bits[r][c]), style=COLORS[k % len(COLORS)] if k >= 0 else "")
        text.append("\n")
    if x0 == x1:   # one step: its number, not a made-up range around it
        text.append(" " * (axis + 1) + f"step {x0:g}".center(cols).rstrip() + "\n", style="dim")
    else:
        left, right = f"step {x0:g}", f"{x1:g}"
        text.append(" " * (axis + 1) + left + right.rjust(max(1, cols - len(left))) + "\n", style="dim")
    for k, (label, xs, ys) in enumerate(series):
        text.append("━━ ", style=COLORS[k % len(COLORS)])
        text.append(f"{label} {_fmt(ys[-1])} ({_fmt(min(ys))}..{_fmt(max(ys))})\n")
    text.rstrip()
    return text


def _segment(xa, ya, xb, yb, x0, x1, y0, y1, w, h):
    """The dot cells of the line from (xa, ya) to (xb, yb), in a w x h dot grid (row 0 at the top)."""
    def dot(x, y):
        px = (w - 1) // 2 if x1 == x0 else round((x - x0) / (x1 - x0) * (w - 1))
        py = round((y1 - y) / (y1 - y0) * (h - 1))
        return px, py

    (pa, qa), (pb, qb) = dot(xa, ya), dot(xb, yb)
    n = max(abs(pb - pa), abs(qb - qa), 1)
    return [(pa + (pb - pa) * i // n, qa + (qb - qa) * i // n) for i in range(n + 1)]


def _fmt(value: float) -> str:
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.2e}"
    return f"{value:.4g}"
