"""`rlctl view RUN --html` opened in a real headless Chromium (the distribution's package; .ci/run installs it):
the test reads the rendered page and uses it as a person would (types a filter, clicks a row).
Without a browser the test skips, except under CI=true, where a missing browser is a failure."""

from __future__ import annotations

import json
import os
import re

import pytest

from rlctl.cli.main import main
from support.chromium import Chromium, find_chromium

pytestmark = pytest.mark.slow   # it starts a headless Chromium


@pytest.fixture(scope="module")
def browser():
    path = find_chromium()
    if path is None:
        reason = "no chromium on PATH (apt-get install chromium, or set RLCTL_CHROMIUM)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + ": CI must run the browser tests")
        pytest.skip(reason)
    with Chromium(path) as b:
        yield b


def count(b) -> str:
    return b.eval("document.getElementById('count').textContent")


@pytest.mark.slow
def test_the_page_shows_curves_and_samples_and_filters_and_expands(calc_run, tmp_path, browser, capsys):
    out = tmp_path / "report.html"
    assert main(["view", str(calc_run), "--html", str(out)]) == 0
    page = out.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the page loads nothing from the network"
    records = [json.loads(line) for f in sorted((calc_run / "rollouts").glob("*.jsonl")) for line in f.read_text().splitlines()]
    steps = [json.loads(line)["step"] for line in (calc_run / "metrics.jsonl").read_text().splitlines()]

    browser.open(out.as_uri())
    charts = browser.eval("[...document.querySelectorAll('#charts .chart')].map(c => [c.dataset.metric, "
                          "c.querySelectorAll('circle').length, c.querySelector('polyline').getAttribute('points')])")
    assert "reward/mean" in [name for name, _, _ in charts]
    for name, points, line in charts:   # one marker per step and a line through them, inside the plot
        assert points == len(steps) and len(line.split()) == len(steps), name
    assert count(browser) == f"{len(records)} of {len(records)} samples"
    assert browser.eval("document.querySelectorAll('#samples tbody tr.sample').length") == len(records)

    browser.type("#search", "what is 3 + 4")
    three_four = sum("3 + 4" in r["messages"][0]["content"] for r in records)
    browser.wait_for(f"document.getElementById('count').textContent.startsWith('{three_four} of')")
    browser.type("#search", "turns>1 errors=0")
    wanted = sum(r["num_turns"] > 1 and not any(c["error"] for c in r["tool_calls"]) for r in records)
    browser.wait_for(f"document.getElementById('count').textContent.startsWith('{wanted} of')")

    browser.click("#samples tbody tr.sample")
    detail = browser.eval("(() => { const d = document.querySelector('tr.detail'); return d && {"
                          "roles: [...d.querySelectorAll('.message .role')].map(e => e.textContent),"
                          "calls: [...d.querySelectorAll('.toolcall')].map(e => e.textContent),"
                          "gen: [...d.querySelectorAll('.seg1')].map(e => e.textContent).join(''),"
                          "glue: [...d.querySelectorAll('.seg0')].map(e => e.textContent).join(''),"
                          "mask: d.querySelector('.mask').textContent, facts: d.querySelector('.kv').textContent}; })()")
    assert detail is not None, "clicking a row expands its conversation"
    assert detail["roles"][:3] == ["user", "assistant (generated)", "tool"]
    assert detail["calls"] and detail["calls"][0].startswith("tool call: calculator(")
    assert "<tool_call>" in detail["gen"] and "<tool_response>" in detail["glue"] and "<tool_response>" not in detail["gen"]
    assert "generated" in detail["mask"] and "tool/template" in detail["mask"] and "score" in detail["facts"]

    browser.click("tr.detail button.same-prompt")   # the same prompt across steps
    same = browser.eval("[...document.querySelectorAll('#samples tbody tr.sample td:first-child')].map(e => +e.textContent)")
    assert browser.eval("document.getElementById('search').value").startswith("prompt=")
    assert sorted(set(same)) == sorted(set(steps)) and count(browser).startswith(f"{len(same)} of")


def test_an_eval_file_as_a_page(tmp_path, browser):
    records = [{"index": i // 2, "sample": i % 2, "data_source": "gsm8k", "prompt": [{"role": "user", "content": f"q{i // 2}"}],
                "response": f"answer </script><b>{i}</b>", "score": float(i % 2), "correct": bool(i % 2)} for i in range(6)]
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["view", str(path), "--html", str(tmp_path / "eval.html")]) == 0
    browser.open((tmp_path / "eval.html").as_uri())
    assert count(browser) == "6 of 6 samples"
    assert browser.eval("document.getElementById('charts').textContent") == "an evaluation output has no curves"
    browser.type("#search", "acc=1")
    browser.wait_for("document.getElementById('count').textContent.startsWith('3 of')")
    browser.click("#samples tbody tr.sample")   # markup in an answer is text, not HTML
    assert browser.eval("document.querySelector('tr.detail pre:last-of-type').textContent") is not None
    assert browser.eval("[...document.querySelectorAll('tr.detail .message pre')].map(e => e.textContent)")[-1] == \
        "answer </script><b>1</b>"
    assert browser.eval("document.querySelectorAll('tr.detail b').length") == \
        browser.eval("document.querySelectorAll('tr.detail .kv b').length")


def test_a_failed_agent_episodes_reason_shows_on_its_sample(tmp_path, browser):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.0}) + "\n")
    record = {"uid": "u0", "data_source": "d", "prompt_ids": [1, 2], "response_ids": [3], "response_mask": [1],
              "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}],
              "score": 0.0, "acc": 0.0, "agent_episode": 0, "agent_failure": "timeout"}
    (run / "rollouts" / "step_1.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["view", str(run), "--html", str(tmp_path / "run.html")]) == 0
    browser.open((tmp_path / "run.html").as_uri())
    assert count(browser) == "1 of 1 samples"
    browser.type("#search", "timeout")   # the filter box finds a reason as a word
    browser.wait_for("document.getElementById('count').textContent.startsWith('1 of')")
    browser.click("#samples tbody tr.sample")
    assert browser.eval("document.querySelector('tr.detail .failure').textContent") == "episode failed: timeout"
