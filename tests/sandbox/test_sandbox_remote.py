"""reward.sandbox_url: the code reward sent to a SandboxFusion service.

Tested against a LOCAL STAND-IN only (no SandboxFusion here): a real HTTP server in this process
that speaks SandboxFusion's documented /run_code request and answer, and runs the code with
rlctl's own sandbox. The test checks what rlctl sends and how it reads each kind of answer.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.servers import send_json

from rlctl.errors import ConfigError, RewardError
from rlctl.rewards import default_compute_score
from rlctl.rewards.runner import RewardRunner
from rlctl.sandbox import Limits, run
from rlctl.sandbox.remote import run_remote
from rlctl.tasks.code import SandboxFailure

TRUTH = json.dumps({"inputs": ["2 3\n", "4 4\n"], "outputs": ["5\n", "8\n"]})
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


class StandIn(BaseHTTPRequestHandler):
    requests: list = []
    mode = "run"

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.requests.append((self.path, body))
        if StandIn.mode == "sandbox_error":
            answer = {"status": "SandboxError", "message": "no runner available", "run_result": None}
        else:
            r = run(body["code"], body["stdin"], limits=Limits(wall_s=body["run_timeout"],
                                                               memory_mb=body["memory_limit_MB"]))
            status = {"ok": "Finished", "timeout": "TimeLimitExceeded"}.get(r.status, "Error")
            answer = {"status": "Success" if r.ok else "Failed", "message": "", "compile_result": None,
                      "run_result": {"status": status, "execution_time": r.wall_s, "return_code": r.exit_code,
                                     "stdout": r.stdout, "stderr": r.stderr}, "files": {}}
        send_json(self, answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    StandIn.requests, StandIn.mode = [], "run"
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_requests_follow_the_documented_api(service):
    result = default_compute_score("codecontests", RIGHT, TRUTH, sandbox_url=service)
    assert result["score"] == 1.0
    path, body = StandIn.requests[0]
    assert path == "/run_code" and body["language"] == "python" and body["stdin"] == "2 3\n"
    assert "print(a + b)" in body["code"] and body["run_timeout"] > 0 and body["memory_limit_MB"] > 0
    assert len(StandIn.requests) == 2  # one request per case


@pytest.mark.slow
def test_answers_map_to_statuses(service):
    assert run_remote(service, "print(1)").status == "ok"
    assert run_remote(service, "raise SystemExit(3)").exit_code == 3
    assert run_remote(service, "while True: pass", limits=Limits(wall_s=1)).status == "timeout"
    StandIn.mode = "sandbox_error"
    bad = run_remote(service, "print(1)")
    assert bad.status == "sandbox_error" and "no runner available" in bad.stderr
    with pytest.raises(SandboxFailure, match="no runner available"):   # no score: the program never ran
        default_compute_score("apps", RIGHT, TRUTH, sandbox_url=service)


def test_unreachable_service_is_a_sandbox_error_not_a_crash():
    r = run_remote("http://127.0.0.1:9", "print(1)", limits=Limits(wall_s=1))
    assert r.status == "sandbox_error" and "127.0.0.1:9" in r.stderr


@pytest.mark.slow
def test_through_the_reward_runner(service, tmp_path):
    items = [{"data_source": "rlctl/code", "solution_str": s, "ground_truth": TRUTH}
             for s in (RIGHT, "```python\nprint(0)\n```")]
    with RewardRunner("", tmp_path, timeout_s=30, workers=1, sandbox_url=service) as rr:
        assert rr.score(items).scores.tolist() == [1.0, 0.0]
    assert len(StandIn.requests) >= 3  # every case went to the service
    with pytest.raises(ConfigError, match="sandbox_url"):
        RewardRunner("", tmp_path, sandbox_url="sandbox-host:8080")


@pytest.mark.slow
def test_a_failed_sandbox_follows_on_error(service, tmp_path):
    """A sandbox_error is the sandbox's fault, not the program's: "fail" stops (exit 5), "zero"
    scores 0 and counts it in reward/errors, like any failed sample."""
    StandIn.mode = "sandbox_error"
    items = [{"data_source": "rlctl/code", "solution_str": s, "ground_truth": TRUTH}
             for s in ("", "", RIGHT)]   # the two empty responses never reach the sandbox (no_code)
    with RewardRunner("", tmp_path, timeout_s=30, workers=1, on_error="fail", sandbox_url=service) as rr:
        with pytest.raises(RewardError, match="sandbox failed, not the program") as err:
            rr.score(items)
    assert err.value.exit_code == 5
    with RewardRunner("", tmp_path, timeout_s=30, workers=1, on_error="zero", sandbox_url=service) as rr:
        result = rr.score(items)
    assert result.scores.tolist() == [0.0, 0.0, 0.0] and result.metrics["reward/errors"] == 1.0
    assert result.failed.tolist() == [False, False, True] and "no runner available" in result.errors[2]


def test_an_unreachable_service_is_a_config_error_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"reward.sandbox_url: nothing answers at 127.0.0.1:9") as err:
        RewardRunner("", tmp_path, sandbox_url="http://127.0.0.1:9")
    assert err.value.exit_code == 2
