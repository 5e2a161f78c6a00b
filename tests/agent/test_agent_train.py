"""Training through agent programs, end to end: the grpo-agent-smollm2-cpu recipe on the tiny model with its
own two-call agent (examples/agents/revise.py, the official `openai` client), as `rlctl init` writes it.

Real everything: embedded Ray (the module's shared session), the actor rank, the hf engine behind the
agent endpoint on loopback, parquet from `rlctl data prep arith`. The tiny model's byte-level answers do
not re-tokenise to what it sampled, so its episodes also exercise split rows and the padding of a batch
to whole mini-batches. The run trains, resumes from a middle checkpoint to the same metrics and weights
bit for bit (the endpoint batches the same calls the same way every time), and merges; the same agent
as a `command` (examples/agents/revise_cmd.py, a process per episode) trains a step too, and so do a run
with dynamic sampling (whole groups of episodes, padded after the join) and a PRIME run (its implicit PRM). An agent whose
every call is too long for a row fails every episode: each step says so in one line naming the keys to raise,
samples.jsonl and the rollouts dump carry the reason, and the third such step stops the run (exit 5).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.cli import rlctl_here

from rlctl.agent.failures import CONTEXT_REASON
from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training
from rlctl.errors import RewardError
from rlctl.project import write_project

pytestmark = pytest.mark.slow
STEPS = 4
SMALL = ["data.max_prompt_length=160", "data.max_response_length=64", "data.batch_size=2", "rollout.n=2",
         "actor.mini_batch_size=2", "actor.micro_batch_size=4", "reward.workers=1", "run.keep_last=0",
         "rollout.agent.concurrency=4"]
NONDETERMINISTIC = ("timing/", "perf/", "time")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir) -> Path:
    from rlctl.tasks.prep import PrepOptions, prepare

    proj = tmp_path_factory.mktemp("agent") / "proj"
    write_project(proj, "grpo-agent-smollm2-cpu", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=proj / "data" / "arith", val_fraction=0.25))
    return proj


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(run: Path, out: Path) -> dict:
    from rlctl.checkpoint.merge import export_hf

    return load_file(str(Path(export_hf(run, out)) / "model.safetensors"))


@pytest.fixture(scope="module")
def run(project, ray_cluster) -> Path:
    start_training(load_config(project / "rlctl.toml", SMALL + [f"run.total_steps={STEPS}", "run.save_every=2"]),
                   address=None, force=False)
    return project / "runs" / "grpo-agent-smollm2-cpu"


def test_the_agent_recipe_trains_with_two_calls_per_episode(run):
    got = rows(run)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for r in got:
        assert r["agent/calls"] == 2.0 and r["agent/failed"] == 0.0
        assert 0.0 <= r["agent/merged"] <= 1.0 and r["agent/sequences"] >= 1.0
        assert "agent/draft" in r and "actor/pg_loss" in r
    assert json.loads((run / "run.json").read_text())["status"] == "finished"


def test_a_resumed_agent_run_repeats_the_uninterrupted_one(run, tmp_path):
    full_rows, full_weights = rows(run), weights(run, tmp_path / "full")
    resume_training(run, step=2, address=None)
    assert rows(run) == full_rows
    resumed = weights(run, tmp_path / "resumed")
    assert resumed.keys() == full_weights.keys()
    for name, tensor in full_weights.items():
        assert torch.equal(tensor, resumed[name]), name


def test_the_agent_run_merges_to_a_hugging_face_folder(run, tmp_path):
    done = rlctl_here("merge", run, "--to-hf", tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hf" / "config.json").is_file()


BAD_FIRST = """
import http.client, json, os, runpy, urllib.parse
url = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
for body in ({"token_ids": [1, 10**7]}, {"token_ids": [1, 2], "sampling_params": {"stop": [5]}}):
    conn.request("POST", url.path.removesuffix("/v1") + "/inference/v1/generate", json.dumps(body),
                 {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    answer = conn.getresponse()
    assert (answer.status, answer.read() and True) == (400, True)
runpy.run_path("revise_cmd.py", run_name="__main__")
"""


def test_a_command_agent_trains_and_its_bad_requests_fail_alone(project, ray_cluster, tmp_path):
    """revise_cmd.py, each episode first sending the token endpoint an out-of-vocabulary id and a
    non-string stop (each once ended the run with exit 4): both are 400s and both steps train."""
    proj = tmp_path / "cmd"
    shutil.copytree(project, proj, ignore=shutil.ignore_patterns("runs"))
    shutil.copy(EXAMPLES / "revise_cmd.py", proj)
    (proj / "bad_first.py").write_text(BAD_FIRST)
    start_training(load_config(proj / "rlctl.toml", SMALL + [
        "run.total_steps=2", "run.save_every=0", "rollout.agent.function=",
        f'rollout.agent.command=["{sys.executable}", "bad_first.py"]']), address=None, force=False)
    got = rows(proj / "runs" / "grpo-agent-smollm2-cpu")
    assert [(r["agent/calls"], r["agent/failed"]) for r in got] == [(2.0, 0.0)] * 2


def test_dynamic_sampling_trains_whole_groups_of_episodes(project, ray_cluster, tmp_path):
    proj = tmp_path / "dapo"
    shutil.copytree(project, proj, ignore=shutil.ignore_patterns("runs"))
    start_training(load_config(proj / "rlctl.toml", SMALL + [   # a band of [0, 1] keeps every group
        "run.total_steps=1", "run.save_every=0", "algorithm.dynamic_sampling.enable=true",
        "algorithm.dynamic_sampling.filter_accuracy=true", "algorithm.dynamic_sampling.metric=acc",
        "algorithm.dynamic_sampling.accuracy_lower_bound=0",
        "algorithm.dynamic_sampling.accuracy_upper_bound=1"]), address=None, force=False)
    got = rows(proj / "runs" / "grpo-agent-smollm2-cpu")
    assert got[0]["dynamic_sampling/groups"] == 2.0 and got[0]["dynamic_sampling/short"] == 0.0
    assert got[0]["agent/calls"] == 2.0 and "actor/pg_loss" in got[0]


TOO_LONG = """
async def run(client, row):
    # a user turn longer than a row holds (data.max_prompt_length + data.max_response_length): refused with a 400
    messages = list(row["prompt"]) + [{"role": "user", "content": "pad " * 400}]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    return 1.0
"""


def test_a_run_whose_every_episode_fails_says_why_and_stops_with_exit_5(project, ray_cluster, tmp_path, capfd):
    proj = tmp_path / "failing"
    shutil.copytree(project, proj, ignore=shutil.ignore_patterns("runs"))
    (proj / "too_long.py").write_text(TOO_LONG)
    with pytest.raises(RewardError) as stop:
        start_training(load_config(proj / "rlctl.toml", SMALL + [
            "run.total_steps=5", "run.save_every=0", "run.log_rollouts=true",
            "rollout.agent.function=too_long.py:run"]), address=None, force=False)
    assert stop.value.exit_code == 5
    assert stop.value.message.startswith("every agent episode failed in 3 steps in a row (steps 1-3)")
    assert f"12 of 12 agent episodes failed: {CONTEXT_REASON} (x12)" in stop.value.message
    said = [line for line in capfd.readouterr().out.splitlines() if "agent episodes failed" in line]
    assert [line.split(":")[0] for line in said] == ["step 1", "step 2", "step 3"]
    assert f"4 of 4 agent episodes failed: {CONTEXT_REASON} (x4)" in said[0]
    run = proj / "runs" / "grpo-agent-smollm2-cpu"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4       # step 3 stopped before it trained or logged
    assert all(s["agent_failure"].startswith(CONTEXT_REASON) and "BadRequestError" in s["agent_failure"]
               for s in samples)
    dumped = [json.loads(line) for line in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(dumped) == 4 and all(r["agent_failure"].startswith(CONTEXT_REASON) for r in dumped)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["exit_code"] == 5


FORCED_AGENT = '''
import json

TOOLS = [{"type": "function", "function": {"name": "answer", "parameters": {
    "type": "object", "properties": {"value": {"type": "string", "maxLength": 4}}, "required": ["value"]}}}]

async def forced(client, row):
    """pydantic-ai's and smolagents' request: the answer must be a call (tool_choice "required")."""
    out = await client.chat.completions.create(model="policy", messages=row["prompt"], tools=TOOLS,
                                               tool_choice="required", max_tokens=100)
    call = out.choices[0].message.tool_calls[0]
    value = json.loads(call.function.arguments)["value"]
    return float(value.strip() == str(row["reward_model"]["ground_truth"]).strip())
'''


def test_a_forced_tool_call_agent_trains_a_step(project, ray_cluster, tmp_path):
    """The grammar travels with the call to the actor rank: every episode's forced call parses."""
    proj = tmp_path / "forced"
    shutil.copytree(project, proj, ignore=shutil.ignore_patterns("runs"))
    (proj / "forced.py").write_text(FORCED_AGENT)
    start_training(load_config(proj / "rlctl.toml", SMALL + [   # byte tokens: the tools ~600, a call ~70
        "data.max_prompt_length=1024", "data.max_response_length=100", "run.total_steps=1", "run.save_every=0",
        "rollout.agent.function=forced.py:forced"]), address=None, force=False)
    got = rows(proj / "runs" / "grpo-agent-smollm2-cpu")[0]
    assert got["agent/calls"] == 1.0 and got["agent/failed"] == 0.0 and "actor/pg_loss" in got


def test_prime_trains_through_agent_programs(project, ray_cluster, tmp_path):
    """PRIME's implicit PRM on agent rows (rlctl.rollouts.table declares the pair built): it reads the
    response tokens the mask marks the policy's own (the agent's feedback turn is masked out), padding
    rows count in no loss, and the tiny model's split episodes each count once in PRIME's RLOO. The PRM
    starts equal to its reference (step 1's BCE is ln 2) and learns."""
    import math

    proj = tmp_path / "prime"
    shutil.copytree(project, proj, ignore=shutil.ignore_patterns("runs"))
    start_training(load_config(proj / "rlctl.toml", SMALL + [
        "run.total_steps=2", "run.save_every=0", "algorithm.name=prime", "algorithm.params.prm_lr=0.01"]),
        address=None, force=False)
    got = rows(proj / "runs" / "grpo-agent-smollm2-cpu")
    assert [r["step"] for r in got] == [1, 2] and got[0]["agent/sequences"] > 1.0   # split episodes trained
    assert got[0]["prm/loss"] == pytest.approx(math.log(2.0), abs=1e-5) and got[1]["prm/loss"] != got[0]["prm/loss"]
    assert all(r["agent/calls"] == 2.0 and math.isfinite(r["actor/pg_loss"]) and r["prm/process_reward_mean"] != 0
               for r in got)
