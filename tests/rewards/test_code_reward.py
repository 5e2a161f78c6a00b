"""The `code` reward: verl's stdin/stdout ground truth, run in the real sandbox (no mocks)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from rlctl.rewards import default_compute_score
from rlctl.rewards.runner import RewardRunner
from rlctl.tasks.code import extract_code, outputs_match, parse_cases

pytestmark = pytest.mark.timeout(300)

SUM = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0"]})
RIGHT = "Read two ints.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"


def answer(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


@pytest.mark.slow
@pytest.mark.parametrize("source", ["codecontests", "apps", "taco", "codeforces", "rlctl/code"])
def test_routes_verl_code_sources(source):
    assert default_compute_score(source, RIGHT, SUM)["score"] == 1.0


@pytest.mark.slow
def test_right_wrong_syntax_and_no_code():
    right = default_compute_score("rlctl/code", RIGHT, SUM)
    assert right["pass_rate"] == 1.0 and right["acc"] == 1.0 and right["fail_wrong_answer"] == 0.0
    wrong = default_compute_score("rlctl/code", WRONG, SUM)
    assert wrong["score"] == 0.0 and wrong["pass_rate"] == pytest.approx(1 / 3)  # 0 0 -> 0 passes
    assert wrong["fail_wrong_answer"] == 1.0
    syntax = default_compute_score("rlctl/code", answer("def f(:"), SUM)
    assert syntax["score"] == 0.0 and syntax["fail_error"] == 1.0
    assert default_compute_score("rlctl/code", "", SUM)["fail_no_code"] == 1.0


@pytest.mark.slow
def test_the_last_block_runs_and_whitespace_is_lenient():
    two = "```python\nprint('draft')\n```\nfinal:\n```py\nprint(int(input()) * 2, ' ')\n\n```"
    assert extract_code(two).startswith("print(int")
    assert default_compute_score("rlctl/code", two, json.dumps({"inputs": ["4"], "outputs": ["8\n\n"]}))["score"] == 1.0
    assert outputs_match("1  2 \n3\n", "1 2\n3") and not outputs_match("1 2 3", "1 2\n3")


@pytest.mark.slow
def test_verl_sources_score_as_verl_prime_code():
    """verl's program (after the last ```python, else the response up to a first ```) and its
    continuous score: all cases pass -> 1.0, else the share of the first 10 that pass."""
    assert default_compute_score("codecontests", RIGHT, SUM)["score"] == 1.0
    bare = default_compute_score("codecontests", "print(3)", SUM)   # unfenced: run whole; 1 of 3 cases
    assert bare["score"] == pytest.approx(1 / 3) and bare["acc"] == 0.0
    assert default_compute_score("apps", WRONG, SUM)["score"] == pytest.approx(1 / 3)   # 0 0 -> 0 passes
    draft = "```python\nprint('draft')\n```\nfinal:\n```py\nprint(int(input()) * 2)\n```"
    assert default_compute_score("taco", draft, json.dumps({"inputs": ["4"], "outputs": ["8"]}))["score"] == 0.0
    twelve = json.dumps({"inputs": [f"{i} 0\n" for i in range(12)], "outputs": ["0"] * 2 + ["x"] * 10})
    head = default_compute_score("codeforces", answer("print(0)"), twelve)   # 2 of the first 10
    assert head["score"] == pytest.approx(0.2) and head["acc"] == 0.0
    assert default_compute_score("apps", answer("def f(:"), SUM, format_score=0.5)["score"] == 0.0


def test_ground_truth_errors_are_clear():
    with pytest.raises(ValueError, match="inputs"):
        parse_cases('{"input": []}')
    with pytest.raises(ValueError, match="fn_name"):
        parse_cases({"inputs": [[1]], "outputs": [[2]], "fn_name": "f"})
    with pytest.raises(ValueError, match="equally long"):
        parse_cases({"inputs": ["1"], "outputs": []})


HOSTILE = {
    "infinite loop": "while True:\n    pass",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "10 GB": "x = bytearray(10 * 1024 ** 3)\nprint(3)",
    "1 GB output": "import sys\nfor _ in range(1024):\n    sys.stdout.write('3' * (1 << 20))",
    # scores 1 only if the kill reached its parent (inside the PID namespace: bwrap's init, immune)
    "kill parent": "import os, signal, time\np = os.getppid()\nos.kill(p, signal.SIGKILL)\ntime.sleep(0.5)\n"
                   "print(3 if os.getppid() != p else 0)",
    "orphan sleep": "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint(4)",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_programs_score_zero(name):
    truth = json.dumps({"inputs": [""], "outputs": ["3"]})
    me = os.getpid()
    result = default_compute_score("rlctl/code", answer(HOSTILE[name]), truth)
    assert result["score"] == 0.0 and os.getpid() == me


@pytest.mark.slow
def test_network_and_environment_and_outside_write_score_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_CODE_SECRET", "s3cr3t")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    truth = json.dumps({"inputs": [""], "outputs": ["s3cr3t"]})
    env = "import os\nprint(os.environ.get('RLCTL_CODE_SECRET', 'none'))"
    assert default_compute_score("rlctl/code", answer(env), truth)["score"] == 0.0
    net = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('s3cr3t')"
    from rlctl.sandbox import detect
    expected = 0.0 if detect().namespaces else 1.0  # limits-only mode cannot stop this: the test says so
    assert default_compute_score("rlctl/code", answer(net), truth)["score"] == expected
    server.close()
    target = tmp_path / "out.txt"
    write = f"open({str(target)!r}, 'w').write('x')\nprint('s3cr3t')"
    assert default_compute_score("rlctl/code", answer(write), truth)["score"] == 0.0 and not target.exists()


@pytest.mark.slow
def test_through_the_reward_runner_pool(tmp_path):
    items = [{"data_source": "rlctl/code", "solution_str": s, "ground_truth": SUM, "extra_info": None}
             for s in (RIGHT, WRONG, answer("while True: pass"), RIGHT)]
    with RewardRunner("", tmp_path, timeout_s=30, on_error="zero", workers=2) as rr:
        result = rr.score(items)
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert result.metrics["reward/fail_timeout"] == pytest.approx(0.25)
    assert result.metrics["reward/pass_rate"] == pytest.approx((1 + 1 / 3 + 0 + 1) / 4)


@pytest.mark.slow
def test_limits_only_mode_is_announced_once_per_run(tmp_path):
    """Without namespaces the run's log says so once (the controller), not once per reward worker."""
    import subprocess
    import sys

    script = ("import json, sys\nfrom rlctl.rewards.runner import RewardRunner\n"
              f"items = [dict(data_source='rlctl/code', solution_str={RIGHT!r}, ground_truth={SUM!r})] * 4\n"
              "with RewardRunner('', sys.argv[1], timeout_s=60, workers=2) as rr:\n"
              "    print(rr.score(items).scores.tolist())\n    print(rr.score(items).scores.tolist())\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "RLCTL_SANDBOX": "limits"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[1.0, 1.0, 1.0, 1.0]"] * 2
    assert proc.stderr.count("SANDBOX WITHOUT NAMESPACES") == 1, proc.stderr
