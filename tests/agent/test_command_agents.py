"""Agents as commands (a process per episode): the contract's failures are contained and counted; what a
command started dies with its episode, whether it exits, times out or the run is stopped (Ctrl-C twice);
its stdout is read in bounded memory; and a helper an episode left running cannot call as it in a later
rollout. The endpoint and policy are test_endpoint.py's (the tiny tool model behind LocalTurns, real HTTP
on loopback); each agent is a small Python program."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path

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
    "hangs.py": "import os, subprocess, sys, time\n"   # it and a child of its own, both sleeping
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                "for pid in (os.getpid(), child.pid):\n"
                "    open(os.path.join(os.environ['PIDDIR'], str(pid)), 'w').close()\n"
                "time.sleep(60)\n",
    "leaves.py": "import os, subprocess, sys\n"   # a child that would outlive it, its stdout elsewhere
                 "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
                 "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                 "open(os.path.join(os.environ['PIDDIR'], str(child.pid)), 'w').close()\n"
                 "print(1.0)\n",
    "loud.py": "import sys\nfor _ in range(8192):\n    sys.stdout.buffer.write(b'x' * 1023 + b'\\n')\n"
               "sys.stdout.buffer.write(b'{\"reward\": 0.75}\\n')\n",   # 8 MiB of lines, then the reward
    "loud_last.py": "import sys\nsys.stdout.buffer.write(b'1.0\\n' + b'y' * (8 << 20))\n",
}


def run_command(endpoint, program: str, episodes: int = 2, **limits) -> list[Episode]:   # noqa: F811
    engine, server, base = endpoint
    for name, text in PROGRAMS.items():
        (base / name).write_text(text)
    eps = [Episode(index=i, row=json.loads(json.dumps(ROW))) for i in range(episodes)]
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


@pytest.fixture()
def pids(tmp_path, monkeypatch) -> Path:
    """The folder the programs write the pids of what they start into (PIDDIR)."""
    folder = tmp_path / "pids"
    folder.mkdir()
    monkeypatch.setenv("PIDDIR", str(folder))
    return folder


def all_gone(folder: Path, expected: int) -> None:
    """Every pid in the folder ends within a few seconds (a zombie awaiting its reaper counts as ended)."""
    pids = [int(p.name) for p in folder.iterdir()]
    assert len(pids) == expected
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_ended(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if not _ended(p)] == []


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_command_past_its_timeout_is_killed_with_what_it_started(endpoint, pids):   # noqa: F811
    start = time.monotonic()
    eps = run_command(endpoint, "hangs.py", timeout_s=3.0, concurrency=1)
    assert [e.failure for e in eps] == ["timeout"] * 2 and time.monotonic() - start < 30
    all_gone(pids, 4)


def test_what_a_command_started_dies_when_it_exits(endpoint, pids):   # noqa: F811
    eps = run_command(endpoint, "leaves.py")
    assert [(e.failure, e.reward) for e in eps] == [("", 1.0)] * 2
    all_gone(pids, 2)


def test_a_second_ctrl_c_kills_every_running_command_and_what_it_started(endpoint, pids):   # noqa: F811
    from rlctl.controller.signals import StopFlag, StopNow

    def press_ctrl_c_twice():
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 4 and time.monotonic() < deadline:   # both episodes started
            time.sleep(0.05)
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)

    threading.Thread(target=press_ctrl_c_twice, daemon=True).start()
    with StopFlag(), pytest.raises(StopNow):
        run_command(endpoint, "hangs.py", episodes=3, timeout_s=60.0, concurrency=2)
    time.sleep(1.0)
    all_gone(pids, 4)   # and the third episode never started
    assert endpoint[0].load()["episodes"] == 0


def test_after_one_ctrl_c_the_step_finishes_and_what_commands_started_dies(endpoint, pids):   # noqa: F811
    """The first Ctrl-C only asks the run to stop at its safe point after the step: the step's episodes
    finish (a command runs in its own session: the terminal's SIGINT does not reach it) and each
    command's group is killed as it exits."""
    from rlctl.controller.signals import StopFlag

    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    with StopFlag() as stop:
        eps = run_command(endpoint, "leaves.py", episodes=3, concurrency=1)
        time.sleep(0.5)
    assert stop.signum == signal.SIGINT
    assert [(e.failure, e.reward) for e in eps] == [("", 1.0)] * 3
    all_gone(pids, 3)


def test_a_command_printing_megabytes_is_read_in_bounded_memory(endpoint):   # noqa: F811
    tracemalloc.start()
    try:
        eps = run_command(endpoint, "loud.py")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(e.failure, e.reward) for e in eps] == [("", 0.75)] * 2
    assert peak < 4 << 20, peak   # two episodes printing 8 MiB each
    eps = run_command(endpoint, "loud_last.py")
    assert all(e.failure.startswith("last stdout line is longer than 65536 bytes: 'yyy") for e in eps)


STALE = '''
import asyncio, os, subprocess, sys

HELPER = """
import os, sys, time, openai
go, out = sys.argv[1], sys.argv[2]
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
try:   # OPENAI_BASE_URL and OPENAI_API_KEY: the episode's that started it
    openai.OpenAI(max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}],
                                                         max_tokens=2)
    status = 200
except openai.APIStatusError as e:
    status = e.status_code
open(out + ".part", "w").write(str(status))
os.replace(out + ".part", out)
"""

async def leaves_a_helper(client, row):
    """Starts a helper outside any process group rlctl kills, with its episode's URL and key."""
    folder = os.environ["STALE_DIR"]
    env = {**os.environ, "OPENAI_BASE_URL": str(client.base_url), "OPENAI_API_KEY": client.api_key}
    subprocess.Popen([sys.executable, "-c", HELPER, os.path.join(folder, "go"), os.path.join(folder, "status")],
                     env=env, start_new_session=True)
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=2)
    return 1.0

async def waits_for_the_helper(client, row):
    """Lets the helper call, and makes its own call once the helper has its answer."""
    folder = os.environ["STALE_DIR"]
    open(os.path.join(folder, "go"), "w").close()
    for _ in range(1200):
        if os.path.exists(os.path.join(folder, "status")):
            break
        await asyncio.sleep(0.05)
    await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=2)
    return 1.0
'''


def test_a_helper_left_by_an_episode_of_step_1_is_refused_in_step_2(endpoint, tmp_path, monkeypatch):   # noqa: F811
    engine, server, base = endpoint
    (base / "stale.py").write_text(STALE)
    monkeypatch.setenv("STALE_DIR", str(tmp_path))
    steps = []
    for name in ("leaves_a_helper", "waits_for_the_helper"):   # step 1, then step 2 with the same episode index
        eps = [Episode(index=0, row=json.loads(json.dumps(ROW)))]
        engine.begin(seed=0, mode="val")
        AgentRunner(AgentConfig(function=f"stale.py:{name}"), base, server, engine).run(eps)
        steps.append(eps[0])
    assert (tmp_path / "status").read_text() == "410"
    assert [(e.failure, e.reward, len(e.calls)) for e in steps] == [("", 1.0, 1)] * 2
    assert steps[1].sequences[0].prompt_ids == steps[1].calls[0].prompt_ids   # its own call, not the helper's
    assert engine.generated_calls == 2
