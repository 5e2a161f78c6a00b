"""`rlctl view`'s terminal UI driven headless by Textual's pilot at 80 x 24, on a run a real `rlctl train` made
(tests/view/conftest.py: multi-turn GRPO with the calculator). Assertions read what the screen shows."""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
from pathlib import Path

import pytest

from rlctl.view.app import ViewApp
from rlctl.view.data import load_source, token_decoder
from rlctl.view.screens import PromptScreen, SampleScreen, token_pieces

SIZE = (80, 24)


def screen_text(app) -> str:
    """The characters on the screen, from Textual's own SVG screenshot (lines joined by newlines)."""
    svg = app.export_screenshot()
    lines = re.findall(r'<text class="[^"]*" x="[^"]*" y="([^"]*)"[^>]*>(.*?)</text>', svg)
    rows: dict[str, str] = {}
    for y, chunk in lines:
        rows[y] = rows.get(y, "") + html.unescape(chunk)
    return "\n".join(rows[y] for y in sorted(rows, key=float)).replace("\xa0", " ")


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((run / "rollouts").glob("step_*.jsonl")) for line in f.read_text().splitlines()]


def run_app(app, steps) -> None:
    async def drive():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await steps(app, pilot)
    asyncio.run(drive())


@pytest.mark.slow
def test_navigate_filter_and_open_a_multi_turn_sample(calc_run):
    records = logged(calc_run)
    multi = sum(r["num_turns"] > 1 for r in records)
    assert 0 < multi and len(records) == 16
    seen = {}

    async def steps(app, pilot):
        async def after(*keys) -> str:   # press keys, let the app settle, read the screen
            await pilot.press(*keys)
            await pilot.pause()
            return screen_text(app)

        seen["curves"] = screen_text(app)
        seen["table"] = await after("v")
        seen["filtered"] = await after("slash", *"turns>1", "enter")
        seen["sample"] = await after("enter")
        assert isinstance(app.screen, SampleScreen)
        seen["picked"] = app.screen.sample
        seen["sample_end"] = await after("end")
        seen["prompt"] = await after("p")
        assert isinstance(app.screen, PromptScreen)
        seen["help"] = await after("escape", "escape", "question_mark")
        await after("escape", "q")
        seen["running"] = app.is_running

    run_app(ViewApp([load_source(calc_run)], follow_s=0), steps)
    assert "reward/mean" in seen["curves"] and re.search(r"step 1 +2", seen["curves"])
    assert sum("\u2800" < ch <= "\u28ff" for ch in seen["curves"]) > 20, "the reward curve is drawn in braille dots"
    assert "q quit" in seen["curves"] and "? help" in seen["curves"]   # keys in the footer
    assert "16 of 16 samples" in seen["table"] and "calc" in seen["table"]
    assert f"{multi} of 16 samples" in seen["filtered"]
    sample = seen["picked"]
    text = seen["sample"] + seen["sample_end"]
    assert f"step {sample['step']}" in text and "score" in text and "turns" in text
    assert "── user ──" in text and "assistant (generated)" in text and "── tool ──" in text
    assert "tool call: calculator(" in text
    assert "generated" in text and "tool/template" in text and "response_mask" in text
    assert "<tool_response>" in seen["sample_end"]   # the response decoded by mask runs, the tool's part shown
    assert "advantages per token" in seen["sample_end"]   # the shading of the logged per-token advantages
    assert "samples of: What is" in seen["prompt"] and re.search(r"\b1\b.*\n(.*\n)*.*\b2\b", seen["prompt"])
    assert "filter words" in seen["help"] and seen["running"] is False


@pytest.mark.slow
def test_the_mask_is_shown_per_token_run_with_the_runs_tokenizer(calc_run):
    view = load_source(calc_run, decode=True)
    sample = next(s for s in view.samples if s["turns"] > 1)
    record = logged(calc_run)[(sample["step"] - 1) * 8 + sample["i"]]
    mask = record["response_mask"]
    assert sample["mask_runs"][0] == [1, mask.index(0)]   # the first run: the model's tool call
    glue = [text for m, text in sample["segments"] if m == 0]
    assert glue and all("<tool_response>" in t for t in glue)   # mask 0: the tool's answer in its template
    assert all("<tool_response>" not in t for m, t in sample["segments"] if m == 1)
    decode = token_decoder(calc_run)   # per-token shading: each token's text in context, spaces kept
    pieces = token_pieces(decode, record["response_ids"])
    assert len(pieces) == len(mask) and "".join(pieces) == decode([record["response_ids"]])[0] == \
        "".join(text for _, text in sample["segments"])


@pytest.mark.slow
def test_live_follow_reads_new_steps_and_waits_for_a_partial_line(calc_run, tmp_path):
    run = Path(shutil.copytree(calc_run, tmp_path / "live"))
    seen = {}

    async def steps(app, pilot):
        metrics = run / "metrics.jsonl"
        with open(metrics, "a") as f:
            f.write('{"step": 3, "reward/mean": 7.5')   # the trainer is mid-write
        await pilot.pause(0.3)
        seen["partial"] = screen_text(app)
        with open(metrics, "a") as f:
            f.write(', "actor/kl": 0.5}\n{"step": 4, "reward/mean": 9.25}\n')
        shutil.copy(run / "rollouts" / "step_2.jsonl", run / "rollouts" / "step_3.jsonl")   # step 3's samples
        await pilot.pause(0.3)
        seen["after"] = screen_text(app)
        seen["rows"] = [r["step"] for r in app.runs[0].metrics]
        await pilot.press("v")
        await pilot.pause()
        seen["table"] = screen_text(app)

    run_app(ViewApp([load_source(run, with_samples=False)], follow_s=0.05), steps)   # as `rlctl view` opens it
    assert "7.5" not in seen["partial"] and "step 1" in seen["partial"]
    assert seen["rows"] == [1, 2, 3, 4]
    assert re.search(r"step 1 +4", seen["after"]) and "reward/mean 9.25" in seen["after"]
    assert "24 of 24 samples" in seen["table"]   # read in the background, then step 3's new file


@pytest.mark.slow
def test_several_runs_are_overlaid(calc_run, tmp_path):
    other = Path(shutil.copytree(calc_run, tmp_path / "other"))
    (other / "run.json").write_text(json.dumps({"name": "other"}))
    seen = {}

    async def steps(app, pilot):
        seen["text"] = screen_text(app)

    run_app(ViewApp([load_source(calc_run), load_source(other)], follow_s=0), steps)
    assert "grpo-gsm8k: reward/mean" in seen["text"] and "other: reward/mean" in seen["text"]


def test_an_sft_run_and_an_eval_file_open_side_by_side(tmp_path):
    """SFT: curves and no samples; eval output: its answers, scores and `correct`, openable (no rollout log)."""
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 3.0 / s}) + "\n" for s in (1, 2, 3)))
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"index": 0, "sample": j, "data_source": "gsm8k", "response": r, "score": float(r == "4"),
                                         "prompt": [{"role": "user", "content": "What is 2+2?"}], "correct": r == "4",
                                         "ground_truth": "4"}) + "\n" for j, r in enumerate(["4", "22"])))
    seen = {}

    async def steps(app, pilot):
        seen["curves"] = screen_text(app)
        await pilot.press("v", "s", "enter")   # samples, sorted by score (best first), open the first
        await pilot.pause()
        seen["sample"] = screen_text(app)

    run_app(ViewApp([load_source(sft), load_source(evals)], follow_s=0), steps)
    assert "sft: train/loss" in seen["curves"] and "(sft)" in seen["curves"] and "(eval)" in seen["curves"]
    assert "score 1" in seen["sample"] and "acc 1" in seen["sample"] and "ground_truth: 4" in seen["sample"]
    assert "── assistant (generated) ──" in seen["sample"]


def _plain_run(tmp_path: Path) -> Path:
    """A run folder as a plain GRPO run writes it (no rollout log): one metrics row at step 300 and
    samples.jsonl lines whose prompt is the decoded chat template."""
    run = tmp_path / "plain"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 300, "reward/mean": 0.5}) + "\n")
    prompt = ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
              "<|im_start|>assistant\n")
    (run / "samples.jsonl").write_text("".join(
        json.dumps({"step": 300, "prompt": prompt, "response": r, "score": float(r == "5"), "acc": float(r == "5"),
                    "response_length": n, "ground_truth": "5", "data_source": "arith"}) + "\n"
        for r, n in (("5", 2), ("6 or so", 4))))
    return run


def test_tab_keys_go_back_and_forth_and_q_quits_from_the_samples_tab(tmp_path):
    """v, then c, then q: each key does what the footer says (the filter box must not take them)."""
    seen = {}

    async def steps(app, pilot):
        await pilot.press("v")
        await pilot.pause()
        seen["after_v"] = app.query_one("TabbedContent").active
        await pilot.press("c")
        await pilot.pause()
        seen["after_c"] = app.query_one("TabbedContent").active
        await pilot.press("v", "slash", "a", "backspace", "escape")   # into the filter and out again
        await pilot.pause()
        seen["filter"] = app.query_one("#filter").value
        await pilot.press("q")
        await pilot.pause()
        seen["running"] = app.is_running

    run_app(ViewApp([load_source(_plain_run(tmp_path))], follow_s=0), steps)
    assert seen["after_v"] == "samples" and seen["after_c"] == "curves"
    assert seen["filter"] == "" and not seen["running"]


def test_a_plain_runs_samples_show_acc_len_and_the_conversation_not_the_template(tmp_path):
    seen = {}

    async def steps(app, pilot):
        seen["curves"] = screen_text(app)
        await pilot.press("v")
        await pilot.pause()
        seen["table"] = screen_text(app)
        await pilot.press("slash", *"acc=0", "enter")
        await pilot.pause()
        seen["filtered"] = screen_text(app)
        await pilot.press("enter")
        await pilot.pause()
        seen["sample"] = screen_text(app)

    run_app(ViewApp([load_source(_plain_run(tmp_path))], follow_s=0), steps)
    assert "step 300" in seen["curves"] and "299" not in seen["curves"] and "301" not in seen["curves"]
    rows = [line for line in seen["table"].splitlines() if "arith" in line]
    assert len(rows) == 2 and any(re.search(r"\b1\s+2\b", r) for r in rows), rows   # acc 1, len 2
    assert "1 of 2 samples" in seen["filtered"]
    assert "── system ──" in seen["sample"] and "── user ──" in seen["sample"]
    assert "What is 2+3?" in seen["sample"] and "<|im_start|>" not in seen["sample"]
