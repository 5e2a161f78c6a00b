"""How fast `rlctl view` opens a large run: a synthetic 1,000-step x 64-sample multi-turn run folder (metrics.jsonl
plus run.log_rollouts files shaped like rlctl.controller.rollout_log's: ids, mask, per-token log-probs and
advantages, a calculator conversation), with a tiny model's tokenizer so responses are decoded by mask runs.

Prints: the run's size on disk; reading it (rlctl.view.data.load_source); writing the HTML page and its size;
headless Chromium opening the page until its script has drawn the curves and the first table page, then a
search over every sample and a row expanded; the terminal UI (Textual, headless) from start to its first
screen with the sample table filled, and a filter over every sample.

    python bench/view_bench.py [--steps 1000] [--samples 64] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # tests/support/chromium.py


def synthesise(run: Path, model: Path, steps: int, samples: int, seed: int = 0) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    rng = random.Random(seed)
    (run / "rollouts").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": run.name, "status": "finished", "step": steps,
                                              "total_steps": steps}))
    (run / "config.resolved.toml").write_text(f'[model]\npath = "{model}"\n')
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row = {"step": step, "reward/mean": min(1, step / steps + rng.gauss(0, 0.1)), "actor/kl": 1e-3 * step,
                   "actor/entropy": 2 - step / steps, "response_length/mean": 120 + rng.gauss(0, 10),
                   "timing/step_s": 30 + rng.random(), "actor/pg_loss": rng.gauss(0, 0.05)}
            row.update({f"extra/metric_{k}": rng.random() for k in range(40)})   # a real row has ~60 keys
            f.write(json.dumps(row) + "\n")
    prompts = [f"Tom has {a} apples and buys {b} more bags of {c} each. How many apples does he have now? "
               "Use the calculator." for a, b, c in ((rng.randint(1, 99), rng.randint(1, 9), rng.randint(2, 12))
                                                     for _ in range(512))]
    for step in range(1, steps + 1):
        lines = []
        for i in range(samples):
            question = prompts[(step * samples // 8 + i // 8) % len(prompts)]   # GRPO: 8 samples a prompt
            call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{i}*{step}+7"}}}}\n</tool_call><|im_end|>'
            glue = f"\n<|im_start|>user\n<tool_response>\n{i * step + 7}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            answer = f"Let me think. He had some apples and bought more, so the total is {i * step + 7}.<|im_end|>"
            parts = [tok.encode(t, add_special_tokens=False).ids for t in (call, glue, answer)]
            ids = [t for p in parts for t in p]
            mask = [1] * len(parts[0]) + [0] * len(parts[1]) + [1] * len(parts[2])
            lines.append(json.dumps({
                "uid": f"{step}-{i // 8}", "data_source": "calc", "prompt_ids": tok.encode(question).ids,
                "response_ids": ids, "response_mask": mask,
                "messages": [{"role": "user", "content": question},
                             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                                 "name": "calculator", "arguments": json.dumps({"expression": f"{i}*{step}+7"})}}]},
                             {"role": "tool", "content": str(i * step + 7)},
                             {"role": "assistant", "content": answer.removesuffix("<|im_end|>")}],
                "score": float(rng.random() < step / steps), "acc": 1.0, "num_turns": 2, "turn_scores": [],
                "tool_rewards": [], "finish": "stop",
                "tool_calls": [{"name": "calculator", "arguments": {"expression": "1"}, "error": rng.random() < 0.05}],
                "log_probs": [round(-rng.random(), 4) for _ in ids], "advantages": [round(rng.gauss(0, 1), 4)] * len(ids)}))
        (run / "rollouts" / f"step_{step}.jsonl").write_text("\n".join(lines) + "\n")


def timed(label: str, fn):
    start = time.perf_counter()
    value = fn()
    print(f"{label:<58} {time.perf_counter() - start:8.2f} s", flush=True)
    return value


def browser_figures(page: Path, samples: int) -> None:
    from support.chromium import Chromium, find_chromium

    path = find_chromium()
    if path is None:
        print("browser: no chromium on PATH (apt-get install chromium): skipped")
        return
    with Chromium(path) as b:
        seconds = b.open(page.as_uri(), timeout=300)
        script = b.eval("performance.now()")
        print(f"{'browser: open the page until curves + first 100 rows are drawn':<58} {seconds:8.2f} s")
        nav = b.eval("(() => { const t = performance.getEntriesByType('navigation')[0]; "
                     "return [t.responseEnd, t.domContentLoadedEventEnd]; })()")
        print(f"  (in the page: file read {nav[0] / 1000:.2f} s, parsed + script run by "
              f"{nav[1] / 1000:.2f} s, ready at {script / 1000:.2f} s after navigation start)")
        start = time.perf_counter()
        b.type("#search", "errors>0 calculator")
        b.wait_for("!document.getElementById('count').textContent.startsWith('" + f"{samples} of" + "')", timeout=120)
        shown = b.eval("document.getElementById('count').textContent")
        print(f"{'browser: filter every sample (errors>0 calculator)':<58} {time.perf_counter() - start:8.2f} s"
              f"   -> {shown}")
        start = time.perf_counter()
        b.click("#samples tbody tr.sample")
        b.wait_for("document.querySelector('tr.detail .segments')")
        print(f"{'browser: expand a conversation':<58} {time.perf_counter() - start:8.2f} s")


def tui_figures(run: Path) -> None:
    from rlctl.view.app import ViewApp
    from rlctl.view.data import load_source

    async def drive():
        start = time.perf_counter()
        app = ViewApp([load_source(run, with_samples=False)], follow_s=0)   # as `rlctl view RUN` opens it
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            print(f"{'terminal UI: first screen (curves) drawn':<58} {time.perf_counter() - start:8.2f} s")
            while not app.runs[0].samples:
                await pilot.pause(0.05)
            print(f"{'terminal UI: first samples in the table (reading goes on)':<58} {time.perf_counter() - start:8.2f} s")
            while not app.runs[0].samples_loaded:
                await pilot.pause(0.05)
            await pilot.pause()
            print(f"{'terminal UI: samples read in the background, table filled':<58} {time.perf_counter() - start:8.2f} s")
            await pilot.press("v", "slash", *"errors>0")
            start = time.perf_counter()
            await pilot.press("enter")
            await pilot.pause()
            status = str(app.query_one("#status").render())
            print(f"{'terminal UI: filter every sample (errors>0)':<58} {time.perf_counter() - start:8.2f} s"
                  f"   -> {status.split('  ')[0]}")
            start = time.perf_counter()
            await pilot.press("enter")
            await pilot.pause()
            print(f"{'terminal UI: open a sample (read back its tokens, shade)':<58} {time.perf_counter() - start:8.2f} s")

    asyncio.run(drive())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--keep", type=Path, help="build the run here and keep it")
    args = parser.parse_args()
    from rlctl.models.tiny import build_tiny_model
    from rlctl.view.data import load_source
    from rlctl.view.html import write_html

    root = args.keep or Path(tempfile.mkdtemp(prefix="view-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    run, model = root / "big-run", root / "tiny"
    if not (run / "metrics.jsonl").is_file():
        build_tiny_model(model, layers=1, hidden=32, heads=2, kv_heads=1, seed=0)
        timed(f"synthesise {args.steps} steps x {args.samples} samples", lambda: synthesise(run, model, args.steps, args.samples))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    disk = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    print(f"run folder: {disk / 2**20:.0f} MiB ({args.steps * args.samples} samples in rollouts/)")
    timed("read for the terminal UI (load_source)", lambda: load_source(run))
    view = timed("read + decode every response by mask runs (for --html)", lambda: load_source(run, decode=True))
    page = root / "report.html"
    timed("write the HTML page", lambda: write_html(view, page))
    print(f"HTML page: {page.stat().st_size / 2**20:.1f} MiB")
    browser_figures(page, len(view.samples))
    tui_figures(run)
    print(f"machine: load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
