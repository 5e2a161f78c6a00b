"""Agents as commands (a process per episode): the contract's failures are contained and counted, and a
timed-out command is killed with its process group. The endpoint and policy are test_endpoint.py's (the
tiny tool model behind LocalTurns, real HTTP on loopback); each agent is a small Python program."""

from __future__ import annotations

import json
import sys
import time

import pytest
from test_endpoint import ROW, endpoint, policy  # noqa: F401  (fixtures)

from rlctl.agent.episodes import Episode
from rlctl.agent.rollout import agent_metrics
from rlctl.agent.runner import AgentRunner
from rlctl.config.rollout_tables import AgentConfig

pytestmark = pytest.mark.slow

PROGRAMS = {
    "ok.py": "import json, sys, openai\nrow = json.loads(sys.stdin.readline())\n"
             "c = openai.OpenAI(max_retries=0)\n"
             "c.chat.completions.create(model='m', messages=row['prompt'], max_tokens=2)\n"
             "print('thinking...')\nprint(json.dumps({'reward': 0.5, 'tries': 1}))\n",
    "number.py": "print('noise'); print(2.5)\n",
    "exits.py": "import sys; sys.stderr.write('boom\\n'); sys.exit(3)\n",
    "silent.py": "pass\n",
    "garbage.py": "print('not a reward')\n",
    "hangs.py": "import os, time\nopen(os.environ['PIDFILE'], 'w').write(str(os.getpid()))\ntime.sleep(60)\n",
}


def run_command(endpoint, program: str, **limits) -> list[Episode]:   # noqa: F811
    engine, server, base = endpoint
    for name, text in PROGRAMS.items():
        (base / name).write_text(text)
    eps = [Episode(index=i, row=json.loads(json.dumps(ROW))) for i in range(2)]
    engine.begin(seed=0, mode="val")
    AgentRunner(AgentConfig(command=(sys.executable, program), **limits), base, server, engine).run(eps)
    return eps


def test_a_command_agent_calls_the_endpoint_and_its_last_line_is_the_reward(endpoint):   # noqa: F811
    eps = run_command(endpoint, "ok.py")
    assert [(e.failure, e.reward, e.metrics, len(e.calls)) for e in eps] == [("", 0.5, {"tries": 1.0}, 1)] * 2
    assert [e.reward for e in run_command(endpoint, "number.py")] == [2.5, 2.5]


@pytest.mark.parametrize("program, failure", [
    ("exits.py", "exited 3: boom"), ("silent.py", "printed no reward"),
    ("garbage.py", "last stdout line is not a number or JSON object: 'not a reward'"),
])
def test_failing_commands_are_contained_and_counted(endpoint, program, failure):   # noqa: F811
    eps = run_command(endpoint, program)
    assert [e.failure for e in eps] == [failure] * 2 and agent_metrics(eps)["agent/failed"] == 1.0


def test_a_command_past_its_timeout_is_killed(endpoint, monkeypatch, tmp_path):   # noqa: F811
    import os

    monkeypatch.setenv("PIDFILE", str(tmp_path / "pid"))
    start = time.monotonic()
    eps = run_command(endpoint, "hangs.py", timeout_s=3.0, concurrency=1)
    assert [e.failure for e in eps] == ["timeout"] * 2 and time.monotonic() - start < 30
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
