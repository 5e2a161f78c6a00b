"""Regenerate the pictures of `rlctl view` in docs/monitoring.md from a real run.

Without --run it makes one: a tiny model taught to call the calculator, then `rlctl train` of multi-turn
GRPO for a few steps (tests/support/calc_run.py, about a minute or two on 2 cores). Then it saves
    docs/img/view-tui-curves.svg    the terminal UI's Curves tab (Textual's own SVG screenshot, 100 x 30)
    docs/img/view-tui-sample.svg    one multi-turn sample: messages, tool call, response_mask runs
    docs/img/view-html.png          the HTML page in headless Chromium, a conversation expanded

    python scripts/view_screenshots.py [--run RUN_DIR] [--steps 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
OUT = REPO / "docs" / "img"


async def tui_shots(run: Path) -> None:
    from rlctl.view.app import ViewApp
    from rlctl.view.data import load_source

    app = ViewApp([load_source(run)], follow_s=0)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        app.save_screenshot("view-tui-curves.svg", str(OUT))
        await pilot.press("v", "slash", *"turns>1", "enter", "enter")
        await pilot.pause()
        app.save_screenshot("view-tui-sample.svg", str(OUT))


def html_shot(run: Path, work: Path) -> None:
    from support.chromium import Chromium, find_chromium

    from rlctl.view.data import load_source
    from rlctl.view.html import write_html

    page = write_html(load_source(run, decode=True), work / "report.html")
    with Chromium(find_chromium() or "chromium", width=1200, height=1500) as browser:
        browser.open(page.as_uri())
        browser.type("#search", "turns>1")
        browser.wait_for("(([shown, total]) => shown !== total.split(' ')[0])("
                         "document.getElementById('count').textContent.split(' of '))")   # the filter ran
        browser.click("#samples tbody tr.sample")
        browser.wait_for("document.querySelector('tr.detail')")
        browser.eval("window.scrollTo(0, 0)")
        browser.screenshot(str(OUT / "view-html.png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="an existing run folder (default: make one)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="view-shots-"))
    run = args.run
    if run is None:
        from support.calc_run import make_calc_run

        from rlctl.models.tiny import build_tiny_model

        build_tiny_model(work / "tiny", layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
        run = make_calc_run(work, work / "tiny", steps=args.steps)
    asyncio.run(tui_shots(run))
    html_shot(run, work)
    for name in ("view-tui-curves.svg", "view-tui-sample.svg", "view-html.png"):
        print(OUT / name)


if __name__ == "__main__":
    main()
