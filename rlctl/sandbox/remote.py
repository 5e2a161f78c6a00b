"""Run a program on a SandboxFusion service instead of locally (`reward.sandbox_url`).

For clusters that already run SandboxFusion (bytedance/SandboxFusion): its documented
`POST <url>/run_code` with `{"code", "language", "stdin", "run_timeout", "memory_limit_MB"}`,
answered by `{"status": "Success" | "Failed" | "SandboxError", "message", "run_result":
{"status": "Finished" | "TimeLimitExceeded" | "Error", "return_code", "stdout", "stderr",
"execution_time"}}`. The answer becomes the same RunResult as a local run. The request goes
through the shared JSON client (rlctl.utils.http: standard library only). Isolation is
then the service's, not rlctl's.
"""

from __future__ import annotations

import time

from rlctl.utils.http import HttpFailure, post_json
from rlctl.sandbox.run import MEMORY_MARKERS, Limits, RunResult

HTTP_MARGIN_S = 10.0  # the service also queues and compiles: wait longer than the run's limit


def run_remote(url: str, code: str, stdin: str = "", *, language: str = "python",
               limits: Limits = Limits()) -> RunResult:
    """One run on the service at `url`; a service that cannot be reached is a `sandbox_error`."""
    payload = {"code": code, "language": language, "stdin": stdin, "run_timeout": limits.wall_s,
               "compile_timeout": limits.wall_s, "memory_limit_MB": limits.memory_mb}
    started = time.monotonic()
    try:   # no retries: a rerun of the program costs as much as the run, and the sample's error says why
        answer = post_json(url.rstrip("/") + "/run_code", payload, timeout_s=limits.wall_s + HTTP_MARGIN_S,
                           retries=0, timeout_key="")
    except HttpFailure as e:   # refused, timed out, HTTP error, not JSON
        return RunResult("sandbox_error", "", f"SandboxFusion: {e}", None,
                         round(time.monotonic() - started, 4), isolation=f"SandboxFusion {url}")
    return _result(answer if isinstance(answer, dict) else {}, url, time.monotonic() - started, limits)


def _result(answer: dict, url: str, wall: float, limits: Limits) -> RunResult:
    where = f"SandboxFusion {url}"
    run = answer.get("run_result") or {}
    if answer.get("status") == "SandboxError" or not isinstance(run, dict) or not run:
        why = answer.get("message") or "no run_result in the answer"
        return RunResult("sandbox_error", "", f"SandboxFusion: {why}", None, round(wall, 4), isolation=where)
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
    code = run.get("return_code")
    if len(stdout) + len(stderr) > limits.output_bytes:
        status = "output_limit"
    elif run.get("status") == "TimeLimitExceeded":
        status = "timeout"
    elif run.get("status") == "Finished" and code == 0:
        status = "ok"
    elif any(marker in stderr[-2000:] for marker in MEMORY_MARKERS):
        status = "memory"
    else:
        status = "error"
    return RunResult(status, stdout[:limits.output_bytes], stderr[:limits.output_bytes],
                     code if isinstance(code, int) else None, round(float(run.get("execution_time") or wall), 4),
                     isolation=where)
