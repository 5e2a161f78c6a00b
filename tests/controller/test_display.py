"""The live display on a fake-free console: a StringIO console and a real pseudo-terminal."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from rlctl.controller.display import LiveDisplay, format_step

METRICS = {"step": 1, "reward/mean": 0.25, "reward/acc": 0.5, "response_length/mean": 12.345, "actor/kl": 0.00123,
           "actor/entropy": 2.5, "actor/grad_norm": None, "timing/step_s": 1.234, "perf/tokens_per_s": 456.7,
           "actor/pg_loss": -0.1}


def test_step_line_lists_the_key_metrics_in_order():
    line = format_step(3, 100, METRICS, eta_s=65).plain
    assert line == ("step   3/100  reward 0.250  acc 0.500  len 12.3  kl 0.0012  entropy 2.500  grad_norm nan"
                    "  step_s 1.23  tok/s 457  eta 0:01:05")
    assert format_step(7, 0, {"reward/mean": 1}).plain == "step 7  reward 1.000"  # no total, no acc


def test_plain_output_without_a_terminal_is_one_line_per_step():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=60)
    with LiveDisplay(total_steps=4, start_step=1, console=console) as display:
        assert not display.live
        display.phase("rollout")  # no bar: nothing to show
        for step in (2, 3):
            display.update(step, {**METRICS, "reward/mean": step / 10})
        display.print("val step 3: reward 0.400")
    lines = out.getvalue().splitlines()
    assert [ln.split("  ")[0:2] for ln in lines[:2]] == [["step 2/4", "reward 0.200"], ["step 3/4", "reward 0.300"]]
    assert lines[2] == "val step 3: reward 0.400"
    assert "\x1b" not in out.getvalue() and len(lines) == 3  # no escape codes, no wrapping at width 60
    assert " eta 0:00:0" in lines[1]  # a quick run: seconds left


def test_eta_counts_only_this_sessions_steps():
    display = LiveDisplay(total_steps=10, start_step=6, console=Console(file=io.StringIO()))
    assert display.eta_s() is None
    with display:
        display.update(8, METRICS)
        eta = display.eta_s()
    assert eta is not None and 0 <= eta <= 5  # 2 steps left at the pace of the 2 done


def test_terminal_is_restored_when_the_loop_raises():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system="standard")
    with pytest.raises(ZeroDivisionError):
        with LiveDisplay(total_steps=5, console=console) as display:
            assert display.live
            display.update(1, METRICS)
            1 / 0
    text = out.getvalue()
    assert "\x1b[?25l" in text  # the bar hid the cursor ...
    assert text.rstrip("\n").endswith("\x1b[?25h")  # ... and showed it again on the way out
    assert "step 1/5" in text and display._progress is None


@pytest.mark.slow
def test_in_a_real_pty_the_bar_runs_and_ctrl_c_restores_the_cursor(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(textwrap.dedent("""
        from rlctl.controller.display import LiveDisplay
        with LiveDisplay(total_steps=3) as display:
            display.phase("rollout")
            display.update(1, {"reward/mean": 0.5, "timing/step_s": 0.1})
            raise KeyboardInterrupt
    """))
    master, slave = os.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=60) == -signal.SIGINT  # Python re-raises an uncaught Ctrl-C as the signal
    text = b"".join(chunks).decode()
    assert "step 1/3" in text and "reward" in text and "━" in text
    assert text.index("\x1b[?25h") > text.index("step 1/3")  # cursor shown after the last line
    assert "KeyboardInterrupt" in text
