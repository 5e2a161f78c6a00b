"""verifiers environments through the built-in agent (rollout.agent.function = "verifiers"), for real: the
verifiers package (rlctl[envs]), a vf-init-style environment written by the tests (tests/support/vf_env.py:
arithmetic with a calculator tool served by verifiers as an MCP server), verifiers' null harness in the
subprocess runtime (its chat program runs in a uv environment, built once and cached), its train client
posting token ids to the agent endpoint on loopback.

- In process, with the tiny model: an episode is multi-turn (the environment's feedback turn), and the tokens
  rlctl trains on (the episode's one sequence, sampled tokens masked 1) are exactly verifiers' own record
  of the episode (its trace branch: token ids and sampled mask) and the engine's samples.
- `rlctl train` (in process, embedded Ray) runs 3 steps on the tiny model with the rubric's rewards in
  the step metrics and every logged row's sampled tokens the ones the engine returned.
- A rubric that raises fails its episode (counted, the step goes on); an environment that cannot load
  is one line with exit 3 at prep.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import pytest
from support.vf_env import write_package

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
if not os.environ.get("CI"):
    pytest.importorskip("verifiers.v1", reason="rlctl[envs] is not installed (pip install -e '.[envs]')")
if shutil.which("uv") is None and not (Path(sys.executable).parent / "uv").is_file() and not os.environ.get("CI"):
    pytest.skip("verifiers' null harness runs its chat program through uv, which is not installed",
                allow_module_level=True)
platform.processor()


@pytest.fixture(scope="module")
def vf_calc(tmp_path_factory):
    """The test environment importable here and in the processes verifiers starts (its tool server)."""
    root = write_package(tmp_path_factory.mktemp("vf_pkg"))
    sys.path.insert(0, str(root))
    old_path, old_env = os.environ.get("PATH", ""), os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), old_env]))
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old_path])   # uv beside python
    yield root
    sys.path.remove(str(root))
    os.environ["PATH"] = old_path
    if old_env is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old_env


TURN = {"env": {"agent": {"sampling": {"max_tokens": 24}}}}   # tokens per model turn: room for every turn


def vf_rows(args: dict) -> list[dict]:
    from rlctl.tasks.verifiers_env import generate

    return generate("vf-calc", args, None, 0, 0.0)["train"]


def test_a_multi_turn_episode_trains_on_exactly_the_tokens_verifiers_recorded(vf_calc, tiny_model_dir):
    from rlctl.agent.engine import AgentEngine, EngineLimits
    from rlctl.agent.endpoint import AgentServer
    from rlctl.agent.episodes import Episode
    from rlctl.agent.verifiers_agent import episode_result, play
    from rlctl.serve.eval_turns import LocalTurns
    from rlctl.serve.source import load_model
    from rlctl.workers.compute.models import eos_token_ids

    model, tok = load_model(tiny_model_dir, "float32")
    eos = eos_token_ids(str(tiny_model_dir), tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    engine = AgentEngine(LocalTurns(model, pad_token_id=pad, eos_token_ids=eos, temperature=0.0), tok,
                         limits=EngineLimits(1024, 256, 8, 1.0), eos_ids=eos, pad_id=pad)
    server = AgentServer(engine)
    try:
        row = vf_rows({"num_tasks": 1, **TURN})[0]
        assert row["prompt"] == [{"role": "user", "content": "What is 2 + 2?"}]
        ep = Episode(index=0, row=row)
        engine.begin(seed=0, mode="val")
        tag = server.new_tag()
        with engine.lock:
            engine.open(tag, ep)

        async def episode():
            async with openai.AsyncOpenAI(base_url=server.base_url(tag), api_key=server.key(tag),
                                          max_retries=0) as client:
                return await play(client, row, tokenizer=str(tiny_model_dir))

        vf_episode = asyncio.run(episode())
    finally:
        server.close()
    result = episode_result(vf_episode)
    trace = vf_episode.traces[0]
    assert len(trace.assistant_messages) >= 2 and len(ep.calls) >= 2   # the feedback turn: multi-turn
    assert result["reward"] == result["vf_correct"] + 0.5 * result["vf_used_tool"]
    # verifiers' own record of the episode (a branch per token sequence: one when the renderer bridged
    # every turn, more when a turn's text did not re-tokenise to its sampled tokens) is rlctl's rows
    assert [b.token_ids for b in trace.branches] == [s.tokens for s in ep.sequences]
    for branch, seq in zip(trace.branches, ep.sequences):
        assert [1 if m else 0 for m in branch.sampled_mask[len(seq.prompt_ids):]] == seq.response_mask
        assert not any(branch.sampled_mask[:len(seq.prompt_ids)])
    sampled = [t for s in ep.sequences for t, m in zip(s.response_ids, s.response_mask) if m]
    assert sampled == [t for c in ep.calls for t in c.completion_ids]   # the engine's samples, all of them
    assert [lp for s in ep.sequences for lp, m in zip(s.log_probs, s.response_mask) if m] == \
        [lp for c in ep.calls for lp in c.log_probs]


STEPS = 3
SMALL = ["data.max_prompt_length=640", "data.max_response_length=256", "data.batch_size=2", "rollout.n=2",
         "actor.mini_batch_size=2", "actor.micro_batch_size=4", "reward.workers=1", "run.keep_last=0",
         "run.save_every=0", "run.val_every=0", "run.log_rollouts=true", "rollout.agent.concurrency=4",
         "rollout.agent.timeout_s=240", 'rollout.agent.function="verifiers"']


@pytest.fixture(scope="module")
def project(vf_calc, openenv_server, tmp_path_factory, tiny_model_dir) -> Path:
    from rlctl.project import write_project
    from rlctl.tasks.prep import PrepOptions, prepare

    proj = tmp_path_factory.mktemp("vf") / "proj"
    write_project(proj, "grpo-agent-smollm2-cpu", str(tiny_model_dir))
    prepare("verifiers:vf-calc", PrepOptions(out=proj / "data" / "vf", val_fraction=0.0, args={"num_tasks": 2, **TURN}))
    prepare("verifiers:openenv", PrepOptions(out=proj / "data" / "openenv", val_fraction=0.0, args={
        "base_url": openenv_server, "resets": [{"seed": 0}, {"seed": 1}], "env": {"player": TURN["env"]["agent"]}}))
    prepare("arith", PrepOptions(out=proj / "data" / "arith", val_fraction=0.25, limit=2))
    return proj


def _config(project: Path, extra: list[str]):
    from rlctl.config.loader import load_config

    train = [str(project / "data" / name / "train.parquet") for name in ("vf", "openenv", "arith")]
    files = [f"data.train_files={json.dumps(train)}", "data.val_files=[]"]
    return load_config(project / "rlctl.toml", SMALL + files + extra)


def test_a_verifiers_environment_trains_three_steps_with_its_rubric(project, ray_cluster):
    from rlctl.controller.run import start_training

    start_training(_config(project, [f"run.total_steps={STEPS}"]), address=None, force=False)
    run = project / "runs" / "grpo-agent-smollm2-cpu"
    got = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for r in got:
        assert r["agent/failed"] == 0.0 and r["agent/calls"] >= 1.0 and "actor/pg_loss" in r
    # 3 steps x 2 prompts = one epoch of 6 rows (2 vf-calc, 2 OpenEnv, 2 arith): each rubric is logged
    logged = set().union(*(r.keys() for r in got))
    assert {"agent/vf_correct", "agent/vf_used_tool", "agent/vf_turns"} <= logged
    assert {"agent/vf_openenv_reward", "agent/vf_openenv_steps"} <= logged
    for step in range(1, STEPS + 1):   # every row's sampled tokens sit where its mask is 1, within the budget
        for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
            sample = json.loads(line)
            assert len(sample["response_ids"]) == len(sample["response_mask"])


@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory):
    """tests/support/openenv_env.py served by openenv-core on 127.0.0.1 (a process of its own)."""
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tests = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "support.openenv_env", str(port)], cwd=tests,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):   # openenv-core imports gradio and fastmcp: slow on a loaded machine
            if proc.poll() is not None:
                pytest.fail(f"the OpenEnv server exited: {proc.stderr.read().decode()[-600:]}")
            try:
                urllib.request.urlopen(url + "/schema", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_an_openenv_server_on_loopback_plays_episodes_with_feedback_turns(vf_calc, openenv_server, tmp_path,
                                                                          tiny_model_dir):
    from rlctl.agent.rollout import agent_metrics
    from rlctl.tasks.verifiers_env import generate

    rows = generate("openenv", {"base_url": openenv_server, "resets": [{"seed": 0}, {"seed": 1}],
                                "env": {"player": TURN["env"]["agent"]}}, None, 0, 0.0)["train"]
    assert [r["data_source"] for r in rows] == ["verifiers/openenv"] * 2
    eps = _play_rows(rows, tmp_path, tiny_model_dir)
    for ep in eps:
        assert ep.failure == "", ep.failure
        assert ep.metrics["vf_openenv_steps"] >= 1 and ep.reward == ep.metrics["vf_openenv_reward"]
        assert len(ep.calls) >= ep.metrics["vf_openenv_steps"]   # a model turn before each step
    assert agent_metrics(eps)["agent/failed"] == 0.0


def _play_rows(rows: list[dict], base: Path, model_dir: Path, temperature: float = 1.0) -> list:
    from rlctl.agent.engine import AgentEngine, EngineLimits
    from rlctl.agent.endpoint import AgentServer
    from rlctl.agent.episodes import Episode
    from rlctl.agent.runner import AgentRunner
    from rlctl.config.rollout_tables import AgentConfig
    from rlctl.serve.eval_turns import LocalTurns
    from rlctl.serve.source import load_model
    from rlctl.workers.compute.models import eos_token_ids

    model, tok = load_model(model_dir, "float32")
    eos = eos_token_ids(str(model_dir), tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    engine = AgentEngine(LocalTurns(model, pad_token_id=pad, eos_token_ids=eos, temperature=temperature), tok,
                         limits=EngineLimits(1024, 256, 8, 1.0), eos_ids=eos, pad_id=pad)
    server = AgentServer(engine)
    try:
        eps = [Episode(index=i, row=r) for i, r in enumerate(rows)]
        engine.begin(seed=0, mode="train")
        AgentRunner(AgentConfig(function="verifiers", timeout_s=240), base, server, engine).run(eps)
        assert engine.error is None
    finally:
        server.close()
    return eps


def test_a_rubric_that_raises_fails_its_episode_and_the_step_goes_on(vf_calc, tmp_path, tiny_model_dir):
    from rlctl.agent.rollout import agent_metrics

    rows = vf_rows({"num_tasks": 1, "fail": "reward", **TURN}) + vf_rows({"num_tasks": 1, **TURN})
    eps = _play_rows(rows, tmp_path, tiny_model_dir)
    assert "vf-calc's rubric broke" in eps[0].failure
    assert eps[1].failure == "" and "vf_correct" in eps[1].metrics
    assert agent_metrics(eps)["agent/failed"] == 0.5


def test_an_environment_that_cannot_load_is_one_line_exit_3(vf_calc, tmp_path):
    from rlctl.errors import DataError
    from rlctl.tasks.prep import PrepOptions, prepare

    with pytest.raises(DataError, match="vf-calc cannot load its questions") as e:
        prepare("verifiers:vf-calc", PrepOptions(out=tmp_path / "d", args={"fail": "load"}))
    assert e.value.exit_code == 3 and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def sum_feedback():
    """examples/environments/sum_feedback importable, as `pip install -e` of it would make it."""
    root = str(Path(__file__).resolve().parents[2] / "examples" / "environments" / "sum_feedback")
    sys.path.insert(0, root)
    yield root
    sys.path.remove(root)


def test_the_sum_feedback_example_gives_a_wrong_answer_a_feedback_turn_in_process(sum_feedback, tmp_path,
                                                                                  tiny_model_dir, monkeypatch):
    from rlctl.tasks.verifiers_env import generate
    from transformers import AutoTokenizer

    from sum_feedback.taskset import RIGHT_BUT_WORDY, WRONG, score

    assert (score("17", "17"), score("7 + 10 = 17", "17"), score("17 or 18", "17"), score("", "17")) == \
        (1.0, 0.5, 0.0, 0.0)
    rows = generate("sum-feedback", {"num_tasks": 2, **TURN}, None, 0, 0.0)["train"]
    assert [r["prompt"][0]["content"].startswith("What is ") for r in rows] == [True, True]

    def no_process(*args, **kwargs):
        raise AssertionError(f"the in-process harness started a process: {args[:2]}")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_process)
    eps = _play_rows(rows, tmp_path, tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for ep in eps:   # the random model never answers with the sum alone: it is told so and answers again
        assert ep.failure == "", ep.failure
        assert len(ep.calls) == 2 and ep.metrics["vf_turns"] == 2.0 and ep.reward == ep.metrics["vf_correct"]
        # the feedback is the environment's turn: in a row's masked tokens, or a later row's prompt
        context = tok.decode([t for s in ep.sequences
                              for t in [*s.prompt_ids, *(t for t, m in zip(s.response_ids, s.response_mask) if not m)]])
        assert WRONG in context or RIGHT_BUT_WORDY in context
